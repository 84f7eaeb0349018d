"""MOBILE: Model-Bellman Inconsistency penalised offLinE policy optimisation (Sun et al., ICML 2023;
code: github.com/yihaosun1124/mobile and the same ``MOBILEPolicy`` in OfflineRL-Kit).

SAC on real data plus model rollouts, where the critic target of each model transition is lowered by
the spread of its Bellman targets across the dynamics ensemble:

    u(s, a) = std_i ( mean_m  min_j Qbar_j(s'_{i,m}, a'_{i,m}) ),   s'_{i,m} ~ P^_i(.|s, a),  a'_{i,m} ~ pi(.|s'_{i,m}),
    y       = max(0, r - beta u(s, a) + gamma (1 - d) min_j Qbar_j(s', a')),   a' ~ pi(.|s'),

over the elites i, with ``num_samples`` = 10 next states sampled from each (`bellman_target_spread`);
real transitions get u = 0. As in the official code, the reward and gamma are left out of the spread
(only E[Q(s')] varies across members), the backup is deterministic (no -alpha log pi in y), and the
target is clipped at 0, which assumes non-negative returns (the MuJoCo tasks): ``target_floor=None``
turns the clip off for tasks with negative rewards (Pendulum).

Defaults: OfflineRL-Kit's ``run_mobile.py`` and the official ``configs/gym/default.py``: 2 critics of
256x2, actor lr 1e-4 cosine-annealed over the run's epochs, critic lr 3e-4, alpha auto-tuned from 1 at
lr 1e-4, gamma 0.99, tau 5e-3; rollouts of h = 1 from 50,000 states per epoch, 5 epochs retained, 5%
real data; beta = 1.5; OfflineRL-Kit's dynamics recipe (``dynamics_recipe("offlinerlkit")``, see
`mbrl_offline.algorithms.mopo`) with ``run_mobile.py``'s cap of 30 training epochs. The per-dataset
(h, beta) are configs: ``mbrl_offline/configs/preset/mobile-*.yaml`` (``generator.rollout.horizon``, ``algo.penalty_coef``). ``benchmarks/vs_offlinerlkit.py --algo
mobile`` runs OfflineRL-Kit's ``MOBILEPolicy`` beside this class (docs/parity.md).

Differences from the official code, none of which changes the losses' expectations: the update order
is alpha, actor, critics (the official updates the critics first, then actor and alpha, and clamps
alpha at 1); the critic loss sums the critics' mean squared errors (the official averages over the
critics too, a constant factor that Adam's normalisation absorbs); u is computed for the model rows
only (the official computes it for the whole batch and then zeroes the real rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from mbrl_offline.algorithms.model_based import OfflineRLKitSACConfig, mbpo_rollouts
from mbrl_offline.algorithms.sac import SAC
from mbrl_offline.config import config_argument, require_in_range, require_nonnegative, require_positive
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.models.uncertainty import bellman_target_spread
from mbrl_offline.registry import register_agent


@dataclass
class MOBILEConfig(OfflineRLKitSACConfig):
    # The learner: OfflineRL-Kit's SAC (2 critics of 256x2, actor lr 1e-4 cosine-annealed, critic lr
    # 3e-4, alpha from 1 at lr 1e-4, gamma 0.99, tau 5e-3; see OfflineRLKitSACConfig),
    # with a deterministic backup: no entropy term in the critic target.
    deterministic_backup: bool = True
    # The penalty: beta (tuned per dataset) times the Bellman-target spread over num_samples next
    # states per elite; targets are clipped below at target_floor (None: no clip).
    penalty_coef: float = 1.5
    num_samples: int = 10
    target_floor: Optional[float] = 0.0

    def __post_init__(self):
        super().__post_init__()
        require_nonnegative(self, "penalty_coef")
        require_positive(self, "num_samples")
        require_in_range(self, "target_floor")  # any finite number, or None for no clip


@register_agent
class MOBILE(SAC):
    """A MOBILE agent: SAC whose critic targets on model data are penalised by the model-Bellman
    inconsistency (module docstring). The penalty needs the dynamics model, which the agent is given
    explicitly (``dynamics``: the generator's model, as `mbrl_offline.build_run` passes it); without
    it the agent is the policy alone (for evaluation)."""

    name = "mobile"
    # what it is, for the docs' tables
    summary = ("SAC whose targets on model rows are lowered by β × the spread of their Bellman targets across the "
               "ensemble")
    defaults_from = "the official MOBILE configs"  # the code its defaults come from
    config_class = MOBILEConfig
    # fine-tuning with penalty=off (mbrl_offline/finetune.py): no Bellman-spread penalty on model rows
    penalty_off = {"penalty_coef": 0.0}
    graph_capturable = False  # the penalty goes to the batch's model rows only: a data-dependent shape
    needs_dynamics = True

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high,
                 config: Optional[MOBILEConfig] = None, device: str | torch.device = "cpu", dynamics=None):
        config = config_argument(config, type(self).config_class, f"{type(self).__name__}'s config")
        super().__init__(obs_dim, act_dim, action_low, action_high, config, device)
        self.dynamics = dynamics.to(self.device) if dynamics is not None else None

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """OfflineRL-Kit's: per generation (every 1000 updates) 50k rollouts of h = 1 step (tuned per
        dataset: mbrl_offline/configs/preset/mobile-*.yaml), no reward penalty at generation, 5 generations kept,
        5% real rows per batch; OfflineRL-Kit's dynamics recipe with run_mobile.py's cap of 30 epochs."""
        return mbpo_rollouts(RolloutConfig(horizon=1), dynamics_recipe("offlinerlkit", max_epochs=30), real_ratio=0.05)

    @torch.no_grad()
    def bellman_uncertainty(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """u(s, a) for each row ``(B,)``: the spread over the elites of the mean target-critic value
        at sampled next states and policy actions."""
        if len(self.dynamics.elites) < 2:  # one member (e.g. the true dynamics): no spread, skip the sampling
            return torch.zeros(len(obs), device=obs.device)
        next_obs = self.dynamics.sample_next_observations(obs, actions, self.config.num_samples)

        def value(states: torch.Tensor) -> torch.Tensor:
            next_actions, _ = self.actor(states, with_log_prob=False)
            return self.target_critic(states, next_actions).min(dim=0).values

        return bellman_target_spread(next_obs, value)

    @torch.no_grad()
    def critic_target(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> torch.Tensor:
        target = super().critic_target(batch, alpha)
        synthetic = batch.get("synthetic")
        self._penalty = torch.zeros((), device=self.device)
        if self.dynamics is not None and synthetic is not None and self.config.penalty_coef > 0:
            rows = synthetic.nonzero().squeeze(1)
            if len(rows):
                penalty = self.bellman_uncertainty(batch["observations"][rows], batch["actions"][rows])
                target[rows] -= self.config.penalty_coef * penalty
                self._penalty = penalty.mean()
        if self.config.target_floor is not None:
            target = target.clamp(min=self.config.target_floor)
        return target

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """SAC's update with MOBILE's target; also reports the mean u of the batch's model rows."""
        metrics = super().update(batch)
        metrics["bellman_uncertainty"] = self._penalty
        return metrics


__all__ = ["MOBILE", "MOBILEConfig"]
