"""Branched short model rollouts (MBPO; used by MOPO, MOBILE and RAVL).

Each call starts ``rollouts_per_epoch`` rollouts from dataset states and runs them ``horizon`` steps
in the dynamics ensemble with the current stochastic policy. Every (row, step) uses an elite drawn
uniformly at random; next states and rewards are sampled from it; a rollout stops where the env's
termination function says the next state is terminal (that last transition is kept, with
``terminals`` set). Rollouts cut by the horizon are not terminal: their targets bootstrap.

As in RAVL's code, start states are drawn without replacement (uniformly with replacement when the
dataset is smaller than the request) and no reward penalty is applied. One deviation: a transition
whose predicted next state or reward is not finite is dropped and its rollout stopped (RAVL's code
stores it as terminal, and its NaN next state then turns the critic's target into NaN).

Two options turn these into the rollouts of other methods, with any agent:

* ``penalty``/``penalty_coef``: the stored reward is ``r - lambda u`` with u one of the dynamics
  model's uncertainty estimates (`mbrl_offline.models.uncertainty`): ``aleatoric`` is MOPO's,
  ``disagreement`` COPlanner's, ``epistemic`` the spread of the members' means;
* ``planner="upmpc"``: each action is chosen by COPlanner's UP-MPC (`mbrl_offline.generators.upmpc`)
  instead of sampled from the policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.upmpc import UPMPCConfig, upmpc_actions
from mbrl_offline.data.termination import TerminationFn

Policy = Callable[[torch.Tensor], torch.Tensor]
PENALTIES = ("none", "aleatoric", "disagreement", "epistemic")
PLANNERS = ("policy", "upmpc")
UNCERTAINTIES = ("aleatoric", "disagreement", "epistemic")


@dataclass
class RolloutConfig:
    horizon: int = 5  # k: model steps per rollout
    rollouts_per_epoch: int = 50_000  # start states per generate call (one call per epoch)
    retain_epochs: int = 5  # the synthetic buffer holds this many calls' worth of transitions
    deterministic_model: bool = False  # use the members' means instead of sampling (RAVL samples)
    uncertainty: bool = False  # log per-transition uncertainty (costs every member on every row)
    # Reward penalty r - penalty_coef * u on model transitions: none, aleatoric (MOPO: max over members
    # of the predicted std's norm), disagreement (COPlanner's sampled ensemble std), epistemic.
    penalty: str = "none"
    penalty_coef: float = 0.0  # lambda
    planner: str = "policy"  # rollout actions: policy (sampled from the current policy) or upmpc (COPlanner)
    upmpc: UPMPCConfig = field(default_factory=UPMPCConfig)  # used when planner is upmpc

    def __post_init__(self):
        for name in ("horizon", "rollouts_per_epoch", "retain_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rollout.{name} must be at least 1, got {getattr(self, name)}.")
        if self.penalty not in PENALTIES:
            raise ConfigError(f"unknown rollout.penalty '{self.penalty}'; choose one of {', '.join(PENALTIES)}.")
        if self.planner not in PLANNERS:
            raise ConfigError(f"unknown rollout.planner '{self.planner}'; choose one of {', '.join(PLANNERS)}.")
        if self.penalty_coef < 0:
            raise ConfigError(f"rollout.penalty_coef must be >= 0, got {self.penalty_coef}.")

    @property
    def buffer_capacity(self) -> int:
        return self.rollouts_per_epoch * self.horizon * self.retain_epochs


class BranchedRollouts:
    """k-step rollouts of a policy in a dynamics model (`GaussianEnsembleDynamics` or `TrueDynamics`)
    from given start states."""

    def __init__(self, dynamics, termination_fn: TerminationFn,
                 config: RolloutConfig = RolloutConfig()):
        self.dynamics, self.termination_fn, self.config = dynamics, termination_fn, config

    @property
    def buffer_capacity(self) -> int:
        return self.config.buffer_capacity

    def state_dict(self) -> dict:
        return {"dynamics": self.dynamics.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.dynamics.load_state_dict(state["dynamics"])

    def sample_starts(self, observations: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``rollouts_per_epoch`` start states from ``observations`` (the real data, on the device)."""
        n, want = len(observations), self.config.rollouts_per_epoch
        if want <= n:
            index = torch.randperm(n, device=observations.device, generator=generator)[:want]
        else:
            index = torch.randint(0, n, (want,), device=observations.device, generator=generator)
        return observations[index]

    @torch.no_grad()
    def generate(self, policy: Policy, start_observations: torch.Tensor,
                 generator: Optional[torch.Generator] = None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Roll out ``policy`` (observations -> actions, sampled) from each start state.

        Returns the transitions (fields of `mbrl_offline.buffer.TRANSITION_FIELDS`, on the device) and
        statistics: transitions, mean rollout length, mean reward, fraction of rollouts terminated,
        and the mean uncertainties when ``config.uncertainty`` is set.
        """
        cfg = self.config
        steps: list[dict[str, torch.Tensor]] = []
        obs = start_observations
        uncertainty = cfg.uncertainty or cfg.penalty != "none"
        for _ in range(cfg.horizon):
            if cfg.planner == "upmpc":
                actions = upmpc_actions(self.dynamics, policy, obs, cfg.upmpc, generator, cfg.deterministic_model)
            else:
                actions = policy(obs)
            model = self.dynamics.step(obs, actions, generator, deterministic=cfg.deterministic_model,
                                       uncertainty=uncertainty)
            next_obs, rewards = model["next_observations"], model["rewards"]
            finite = torch.isfinite(next_obs).all(-1) & torch.isfinite(rewards)
            terminals = self.termination_fn(next_obs) & finite
            step = {"observations": obs, "actions": actions, "rewards": rewards, "next_observations": next_obs,
                    "terminals": terminals, **{k: model[k] for k in UNCERTAINTIES if k in model}}
            if cfg.penalty != "none":
                step["model_rewards"] = rewards
                step["rewards"] = rewards - cfg.penalty_coef * model[cfg.penalty]
            if not bool(finite.all()):
                step = {k: v[finite] for k, v in step.items()}
            steps.append(step)
            obs = next_obs[finite & ~terminals]
            if len(obs) == 0:
                break
        batch = {k: torch.cat([s[k] for s in steps]) for k in steps[0]}
        batch["timeouts"] = torch.zeros_like(batch["terminals"])
        n = len(batch["rewards"])
        stats = {
            "transitions": float(n),
            "mean_length": n / len(start_observations),
            "reward_mean": batch["rewards"].mean().item() if n else float("nan"),  # penalised, as stored
            "terminated_fraction": batch["terminals"].sum().item() / len(start_observations),
        }
        for key in (*UNCERTAINTIES, "model_rewards"):
            if key in batch:
                stats[f"{key}_mean"] = batch.pop(key).mean().item() if n else float("nan")
        return batch, stats
