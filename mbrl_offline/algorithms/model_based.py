"""What every Dyna-style agent here shares: a SAC-N learner, a dynamics model and a rollout generator.

RAVL, MOPO, MOBILE and COPlanner are this class with different settings (and MOBILE with its own
critic target). The dynamics model is the learned ensemble (trained on the dataset, or loaded from
the cache or a file) or, with ``true_dynamics=True``, the simulator itself (`TrueDynamics`); the
generator is `BranchedRollouts`, whose config chooses the reward penalty and whether UP-MPC plans the
actions. So any generator setting combines with any agent by configuration, e.g.
``algo=ravl algo.rollout.planner=upmpc`` or ``algo=mopo algo.true_dynamics=true``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from mbrl_offline.algorithms.sac import SAC, SACConfig
from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.rollouts import BranchedRollouts, RolloutConfig
from mbrl_offline.models.dynamics import (DynamicsConfig, GaussianEnsembleDynamics, dynamics_recipe,
                                          load_or_fit_dynamics)
from mbrl_offline.data.termination import TerminationFn
from mbrl_offline.models.true_dynamics import TrueDynamics


@dataclass
class ModelBasedConfig(SACConfig):
    real_ratio: float = 0.05  # fraction of real transitions in each batch; the rest from rollouts
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the generator's settings
    dynamics: DynamicsConfig = field(default_factory=DynamicsConfig)  # the learned ensemble's settings
    true_dynamics: bool = False  # roll out in the simulator itself (`TrueDynamics`) instead of the ensemble

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.real_ratio <= 1.0:
            raise ConfigError(f"real_ratio must be between 0 and 1, got {self.real_ratio}.")


@dataclass
class OfflineRLKitSACConfig(ModelBasedConfig):
    """The SAC learner OfflineRL-Kit's model-based agents (MOPO, MOBILE) share; our MOPO, MOBILE and
    COPlanner start from it."""
    # Clipped double Q: 2 critics, 2 hidden layers of 256 ReLU units, torch's default init.
    num_critics: int = 2
    eta: float = 0.0
    hidden_size: int = 256
    hidden_layers: int = 2
    init: str = "torch"
    actor_lr: float = 1e-4
    actor_lr_cosine: bool = True  # annealed to 0 over the run's epochs
    critic_lr: float = 3e-4
    alpha_lr: float = 1e-4
    gamma: float = 0.99
    tau: float = 5e-3
    init_alpha: float = 1.0  # OfflineRL-Kit starts log alpha at 0
    auto_alpha: bool = True  # towards -|A|
    batch_size: int = 256
    real_ratio: float = 0.05
    # OfflineRL-Kit's dynamics recipe, on which MOPO's and MOBILE's coefficients were tuned: shared
    # log-variance bounds, one bootstrap resample per member, holdout min(20%, 1000) rows, no input
    # clipping, plain early stopping (DYNAMICS_RECIPES["offlinerlkit"] in mbrl_offline.models.dynamics).
    dynamics: DynamicsConfig = field(default_factory=lambda: dynamics_recipe("offlinerlkit"))


class ModelBasedSAC(SAC):
    """A SAC-N agent with a rollout generator; the trainer mixes its rollouts with real data at
    ``real_ratio``. Without ``dynamics`` it is the policy alone (for evaluation)."""

    name = "model-based-sac"
    config_class = ModelBasedConfig

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: ModelBasedConfig = ModelBasedConfig(), device: str | torch.device = "cpu",
                 dynamics=None, termination_fn: Optional[TerminationFn] = None):
        super().__init__(obs_dim, act_dim, action_low, action_high, config, device)
        self.real_ratio = config.real_ratio
        self.generator = None
        if dynamics is not None:
            if termination_fn is None:
                raise ValueError("model rollouts need the env's termination function")
            self.generator = BranchedRollouts(dynamics.to(self.device), termination_fn, config.rollout)

    @property
    def dynamics(self):
        return None if self.generator is None else self.generator.dynamics

    @classmethod
    def for_dataset(cls, dataset, config: Optional[ModelBasedConfig] = None, device: str | torch.device = "cpu",
                    dynamics_path: Optional[str | Path] = None, cache_dir: Optional[str | Path] = None,
                    progress: bool = True):
        """The agent for ``dataset``'s env with its dynamics model: the simulator if
        ``config.true_dynamics``; else the ensemble from ``dynamics_path``, or from the cache (trained
        on ``dataset`` with ``config.dynamics`` the first time)."""
        config = config if config is not None else cls.config_class()
        env = get_env_info(dataset.env_name)
        if config.true_dynamics:
            dynamics = TrueDynamics(env.name)
        elif dynamics_path is not None:
            dynamics = GaussianEnsembleDynamics.load(dynamics_path, map_location=device)
        else:
            dynamics, _ = load_or_fit_dynamics(dataset, config.dynamics, cache_dir, device, progress)
        low, high = env.action_bounds()
        return cls(env.obs_dim, env.act_dim, low, high, config, device, dynamics, env.termination_fn)
