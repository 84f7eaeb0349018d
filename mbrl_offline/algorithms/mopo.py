"""MOPO: Model-based Offline Policy Optimization (Yu et al., NeurIPS 2020; code:
github.com/tianheyu927/mopo, and OfflineRL-Kit's PyTorch port, whose SAC settings are used here).

SAC on real data plus short model rollouts whose rewards are penalised by the model's uncertainty:

    r~(s, a) = r^(s, a) - lambda u(s, a),    u(s, a) = max_i |sigma_i(s, a)|_2

with sigma_i the std that member i predicts for [s' - s, r], over all members (the official code's
``penalty_learned_var=True``, used in every D4RL config). The penalty is applied when the rollout is
generated (`BranchedRollouts` with ``penalty="aleatoric"``), so the stored synthetic rewards are
already penalised; everything else is SAC:

    y = r~ + gamma (1 - d) (min_{i=1,2} Qbar_i(s', a') - alpha log pi(a'|s')),   a' ~ pi(.|s').

Defaults: OfflineRL-Kit's ``run_mopo.py`` (2 critics of 256x2, actor lr 1e-4 with cosine annealing
over the run's epochs, critic lr 3e-4, alpha auto-tuned from 1 at lr 1e-4 towards -|A|, gamma 0.99,
tau 5e-3; 50,000 rollouts per epoch of horizon h = 5 with lambda = 0.5, 5 epochs retained, 5% real
data) and OfflineRL-Kit's dynamics recipe (``dynamics_recipe("offlinerlkit")`` in
`mbrl_offline.models.dynamics`: log-variance bounds shared by the members and kept at their last
values, one bootstrap resample per member, holdout min(20%, 1000) rows, no input clipping, plain early
stopping). lambda was tuned on that model: the penalty is the largest predicted std, which the
learned bounds cap, so a model whose bounds settle elsewhere changes what a given lambda means. The
per-dataset (h, lambda) are configs: ``mbrl_offline/configs/preset/mopo-*.yaml`` (``generator.rollout.horizon``,
``generator.rollout.penalty_coef``). The paper's official values
are for D4RL v0 (the MOPO repository's per-dataset configs); OfflineRL-Kit's for v2 differ (the
docstring of its ``run_example/run_mopo.py``, e.g. halfcheetah-medium h = 5, lambda = 0.5 against v0's
h = 1, lambda = 1.0);
the presets use OfflineRL-Kit's, since our data follow v2's conventions (true next states at time limits).

Differences from OfflineRL-Kit, none of which changes the losses: the update order is alpha, actor,
critics (CORL/EDAC's; OfflineRL-Kit updates the critics first) and alpha is not clamped at 1; the
critics are one batched ensemble. ``benchmarks/vs_offlinerlkit.py`` runs OfflineRL-Kit's own code and
this class side by side on the same data; docs/parity.md holds its measurements.
"""
from __future__ import annotations

from dataclasses import dataclass

from mbrl_offline.algorithms.model_based import OfflineRLKitSACConfig, mbpo_rollouts
from mbrl_offline.algorithms.sac import SAC
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.registry import register_agent


@dataclass
class MOPOConfig(OfflineRLKitSACConfig):
    """The learner: OfflineRL-Kit's SAC (2 critics of 256x2, actor lr 1e-4 cosine-annealed, critic lr
    3e-4, alpha from 1 at lr 1e-4, gamma 0.99, tau 5e-3; see `OfflineRLKitSACConfig`). MOPO's penalty
    is in its generator (`MOPO.published_generator`)."""


@register_agent
class MOPO(SAC):
    """A MOPO agent: SAC on real data and uncertainty-penalised model rollouts."""

    name = "mopo"
    summary = "SAC on rollouts whose rewards are r − λ·max_i ‖σ_i‖"  # what it is, for the docs' tables
    defaults_from = "OfflineRL-Kit's `run_mopo.py`"  # the code its defaults come from
    config_class = MOPOConfig

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """OfflineRL-Kit's: per generation (every 1000 updates) 50k rollouts of h = 5 steps, rewards
        penalised by lambda = 0.5 times MOPO's max aleatoric std over all members (h and lambda tuned
        per dataset: mbrl_offline/configs/preset/mopo-*.yaml), 5 generations kept, 5% real rows per batch;
        OfflineRL-Kit's dynamics recipe."""
        return mbpo_rollouts(RolloutConfig(horizon=5, penalty="aleatoric", penalty_coef=0.5),
                             dynamics_recipe("offlinerlkit"), real_ratio=0.05)


__all__ = ["MOPO", "MOPOConfig"]
