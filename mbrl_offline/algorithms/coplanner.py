"""COPlanner for offline RL: UP-MPC rollouts with an uncertainty-penalised SAC learner.

COPlanner (Wang et al., ICLR 2024; github.com/si0wang/COPlanner) is an online Dyna plug-in: UP-MPC
plans model-rollout actions conservatively (predicted return minus alpha_c times the ensemble's
multi-step uncertainty) and real-environment actions optimistically. It changes which actions are
taken, never the rewards or the targets. There is no public offline port; this is the library's own
adaptation, made as follows (the official repository has online MBPO, DMC and DreamerV2/V3 code
only):

* **Kept:** the conservative half. Every model-rollout action comes from UP-MPC
  (`mbrl_offline.generators.upmpc`) with the official defaults: K = 5 candidates from the policy,
  H_p = 5 planning steps, alpha_c = 2, gamma_r = gamma_u = 0.97, uncertainty = the std over all
  members of sampled [s', r], averaged over outputs; the chosen action is stepped again with a fresh
  sample and that transition is stored.
* **Dropped:** the optimistic half (alpha_o): offline there is no environment to explore.
* **Added:** a MOPO reward penalty on the stored transitions, r - lambda u with MOPO's max aleatoric
  std (``generator.rollout.penalty``/``generator.rollout.penalty_coef``; ``disagreement`` uses COPlanner's own u instead,
  ``penalty_coef=0`` gives the unpenalised ablation). Why: offline nothing corrects model
  exploitation. The critic still bootstraps from a' ~ pi(s'), not from the planned action, and the
  model's rewards are unpenalised, so choosing low-uncertainty actions alone leaves the learner free
  to exploit the model wherever its own actions lead; online COPlanner relies on fresh real data for
  that correction. lambda defaults to MOPO's 0.5 (OfflineRL-Kit).
* **Rollouts** follow MOPO's schedule (50,000 starts per epoch, h = 5, 5 epochs retained, 5% real
  data) instead of the online MuJoCo code's length-1 rollouts from 100,000 states per model retrain.

The learner is MOPO's SAC (OfflineRL-Kit's settings, `mbrl_offline.algorithms.mopo`), and so is the
dynamics recipe (OfflineRL-Kit's, on which the MOPO lambda it reuses was tuned), not the online
COPlanner code's MBPO ensemble: the reward penalty is the part of this agent with a tuned scale. Cost: each
stored transition takes K * H_p + 1 ensemble evaluations (26 at the defaults), batched as one call per
planning step over all K x B candidate rows; `benchmarks/throughput.py` measures it.
"""
from __future__ import annotations

from dataclasses import dataclass

from mbrl_offline.algorithms.model_based import mbpo_rollouts
from mbrl_offline.algorithms.mopo import MOPOConfig
from mbrl_offline.algorithms.sac import SAC
from mbrl_offline.generators.rollouts import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.generators.upmpc import UPMPCConfig
from mbrl_offline.models.dynamics import dynamics_recipe
from mbrl_offline.registry import register_agent


@dataclass
class COPlannerConfig(MOPOConfig):
    """MOPO's learner (OfflineRL-Kit's SAC); the planning and the penalty are in the generator
    (`COPlanner.published_generator`)."""


@register_agent
class COPlanner(SAC):
    """Offline COPlanner: MOPO's learner on UP-MPC-planned model rollouts (module docstring)."""

    name = "coplanner"
    # what it is, for the docs' tables
    summary = "MOPO's learner on rollouts whose actions UP-MPC plans; an offline adaptation of an online method"
    defaults_from = "COPlanner's code"  # the code its defaults come from
    config_class = COPlannerConfig

    @classmethod
    def published_generator(cls) -> RolloutGeneratorConfig:
        """MOPO's rollouts (h = 5, lambda = 0.5 on MOPO's penalty, OfflineRL-Kit's dynamics recipe) with
        every action planned by UP-MPC at the official COPlanner defaults."""
        return mbpo_rollouts(
            RolloutConfig(horizon=5, planner="upmpc", penalty="aleatoric", penalty_coef=0.5,
                          upmpc=UPMPCConfig(candidates=5, horizon=5, uncertainty_weight=2.0, reward_discount=0.97,
                                            uncertainty_discount=0.97)),
            dynamics_recipe("offlinerlkit"), real_ratio=0.05)


__all__ = ["COPlanner", "COPlannerConfig"]
