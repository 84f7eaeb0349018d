"""What the Dyna-style agents here share: a SAC-N learner trained on real data mixed with the rollouts
of a dynamics model.

RAVL, MOPO, MOBILE and COPlanner are `mbrl_offline.algorithms.sac.SAC` with different settings (and
MOBILE with its own critic target), each with the generator it was published with
(``published_generator``: a `RolloutGeneratorConfig` holding the rollouts, the dynamics recipe its
coefficients were tuned on, the schedule and the real-data fraction). The trainer runs that generator;
configuration may replace it (``generator=none``, ``generator=rollouts``, ``generator.rollout.planner=upmpc``,
``generator.true_dynamics=true``), and any agent can take it (``algo=iql generator=rollouts``).
"""
from __future__ import annotations

from dataclasses import dataclass

from mbrl_offline.algorithms.sac import SACConfig
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import DynamicsConfig


def mbpo_rollouts(rollout: RolloutConfig, dynamics: DynamicsConfig, real_ratio: float = 0.05) -> RolloutGeneratorConfig:
    """The published generator of the agents here: ``rollout`` in an ensemble trained with ``dynamics``,
    one generation per 1000 updates (one epoch of their code), ``real_ratio`` real rows per batch."""
    return RolloutGeneratorConfig(every=1000, rollout=rollout, dynamics=dynamics,
                                  mixing=MixingConfig(rule="fraction", real_ratio=real_ratio))


@dataclass
class OfflineRLKitSACConfig(SACConfig):
    """The SAC learner OfflineRL-Kit's model-based agents (MOPO, MOBILE) share; our MOPO, MOBILE and
    COPlanner start from it. Their generators train OfflineRL-Kit's dynamics recipe, on which MOPO's
    and MOBILE's coefficients were tuned (``DYNAMICS_RECIPES["offlinerlkit"]`` in
    `mbrl_offline.models.dynamics`)."""
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


__all__ = ["OfflineRLKitSACConfig"]
