"""UP-MPC: COPlanner's uncertainty-aware policy-guided planning of rollout actions (Wang et al.,
"COPlanner: Plan to Roll Out Conservatively but to Explore Optimistically", ICLR 2024; code:
github.com/si0wang/COPlanner, ``sac.py::MPC_select_action`` and ``predict_env.py::step``).

For each state s the planner draws K candidate first actions from the policy, rolls each H_p steps
through the ensemble with policy actions, and keeps the first action of the candidate with the best

    J_k = sum_h gamma_r^h r_h  -  alpha_c sum_h gamma_u^h u_h,
    u_h = mean over outputs of the std over all members of one sample each (`sampled_disagreement`).

As in the official code: every member is sampled at every planning step and the trajectory follows
one random elite's sample; rewards and uncertainty keep accumulating after a predicted termination
(no masking); there is no terminal value; candidates come from one round of policy sampling (no
CEM). The chosen action is then stepped again in the model by the rollout generator, with a fresh
sample, and that transition is what gets stored. Only the conservative half of COPlanner applies
offline (there is no real exploration): alpha_o does not exist here.

All K x B candidate rows go through the ensemble in one batched call per planning step, and through
the policy in one call per step: K * H_p model evaluations per stored transition, on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from mbrl_offline.config import check_field_types, require_fraction, require_nonnegative, require_positive
from mbrl_offline.models.uncertainty import sample_members, sampled_disagreement


@dataclass
class UPMPCConfig:
    candidates: int = 5  # K: first actions sampled from the policy per state (official ``ntraj``)
    horizon: int = 5  # H_p: planning steps per candidate
    uncertainty_weight: float = 2.0  # alpha_c: weight of the discounted uncertainty in the score
    reward_discount: float = 0.97  # gamma_r
    uncertainty_discount: float = 0.97  # gamma_u

    def __post_init__(self):
        check_field_types(self, "upmpc")  # types first; nested mappings become configs
        require_positive(self, "candidates", "horizon", section="upmpc")
        require_nonnegative(self, "uncertainty_weight", section="upmpc")
        require_fraction(self, "reward_discount", "uncertainty_discount", section="upmpc")


@torch.no_grad()
def upmpc_actions(dynamics, policy: Callable[[torch.Tensor], torch.Tensor], obs: torch.Tensor, config: UPMPCConfig,
                  generator: Optional[torch.Generator] = None, deterministic_model: bool = False) -> torch.Tensor:
    """The planned first action for each row of ``obs`` ``(B, obs_dim)`` -> ``(B, act_dim)``.

    ``dynamics`` is a `GaussianEnsembleDynamics` or `TrueDynamics` (``predict`` and ``elites``);
    ``policy`` maps observations to sampled actions.
    """
    k, rows = config.candidates, len(obs)
    state = obs.repeat(k, 1)  # candidate-major: row c * B + b is candidate c of state b
    first = policy(state)
    action = first
    score = torch.zeros(k * rows, device=obs.device)
    elites = dynamics.elites
    index = torch.arange(k * rows, device=obs.device)
    for h in range(config.horizon):
        mean, logvar = dynamics.predict(state, action)  # every member: (N, K*B, obs_dim + 1)
        samples = mean if deterministic_model else sample_members(mean, logvar, generator)
        uncertainty = sampled_disagreement(samples)
        followed = samples[elites[torch.randint(0, len(elites), (k * rows,), device=obs.device, generator=generator)],
                           index]
        score += config.reward_discount ** h * followed[:, -1]
        score -= config.uncertainty_weight * config.uncertainty_discount ** h * uncertainty
        state = state + followed[:, :-1]
        if h + 1 < config.horizon:
            action = policy(state)
    score = torch.nan_to_num(score, nan=float("-inf")).view(k, rows)  # a diverged candidate never wins
    best = score.argmax(dim=0)
    return first.view(k, rows, -1)[best, torch.arange(rows, device=obs.device)]


__all__ = ["UPMPCConfig", "upmpc_actions"]
