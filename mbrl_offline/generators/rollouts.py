"""Branched short model rollouts (MBPO; used by MOPO, MOBILE and RAVL).

Each call starts ``rollouts_per_epoch`` rollouts from dataset states and runs them ``horizon`` steps
in the dynamics ensemble with the current stochastic policy (`mbrl_offline.roles.Policy.sample`).
Every (row, step) uses an elite drawn uniformly at random (or, with ``member="rollout"``, each
rollout one elite for its whole length); next states and rewards are sampled from it; a rollout stops where the env's
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

`RolloutGenerator` is the generator role (`mbrl_offline.roles.Generator`) around them: the dynamics
model (the learned ensemble, fitted or loaded from the cache, or the simulator itself), the schedule
and the mixing rule, as one `RolloutGeneratorConfig` (``generator=rollouts``; each model-based
algorithm publishes its own, e.g. `mbrl_offline.algorithms.RAVL.published_generator`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import check_field_types, require_nonnegative, require_positive
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.data.termination import TerminationFn
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.upmpc import UPMPCConfig, upmpc_actions
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, load_or_fit_dynamics
from mbrl_offline.models.fitting import check_dynamics_rows
from mbrl_offline.models.true_dynamics import TrueDynamics
from mbrl_offline.pairing import check_policy
from mbrl_offline.registry import register_generator
from mbrl_offline.roles import GeneratorConfig, Policy
PENALTIES = ("none", "aleatoric", "disagreement", "epistemic")
PLANNERS = ("policy", "upmpc")
UNCERTAINTIES = ("aleatoric", "disagreement", "epistemic")
MEMBERS = ("step", "rollout")


@dataclass
class RolloutConfig:
    horizon: int = 5  # k: model steps per rollout
    rollouts_per_epoch: int = 50_000  # start states per generation (RAVL, MOPO: one generation per 1000 updates)
    retain_epochs: int = 5  # the synthetic buffer holds this many generations' worth of transitions
    deterministic_model: bool = False  # use the members' means instead of sampling (RAVL samples)
    # Which elite produces each transition: "step" (one drawn at random per row and step: MBPO, RAVL,
    # MOPO, MOBILE) or "rollout" (one drawn at the rollout's start and kept for its whole length).
    member: str = "step"
    uncertainty: bool = False  # log per-transition uncertainty (costs every member on every row)
    # Reward penalty r - penalty_coef * u on model transitions: none, aleatoric (MOPO: max over members
    # of the predicted std's norm), disagreement (COPlanner's sampled ensemble std), epistemic.
    penalty: str = "none"
    penalty_coef: float = 0.0  # lambda
    planner: str = "policy"  # rollout actions: policy (sampled from the current policy) or upmpc (COPlanner)
    upmpc: UPMPCConfig = field(default_factory=UPMPCConfig)  # used when planner is upmpc

    def __post_init__(self):
        check_field_types(self, "rollout")  # types first; nested mappings become configs
        require_positive(self, "horizon", "rollouts_per_epoch", "retain_epochs", section="rollout")
        require_nonnegative(self, "penalty_coef", section="rollout")
        if self.penalty not in PENALTIES:
            raise ConfigError(f"unknown rollout.penalty '{self.penalty}'; choose one of {', '.join(PENALTIES)}.")
        if self.member not in MEMBERS:
            raise ConfigError(f"unknown rollout.member '{self.member}'; choose one of {', '.join(MEMBERS)}.")
        if self.planner not in PLANNERS:
            raise ConfigError(f"unknown rollout.planner '{self.planner}'; choose one of {', '.join(PLANNERS)}.")
        if self.penalty_coef < 0:
            raise ConfigError(f"rollout.penalty_coef must be >= 0, got {self.penalty_coef}.")

    @property
    def buffer_capacity(self) -> int:
        return self.rollouts_per_epoch * self.horizon * self.retain_epochs

    @property
    def extra_fields(self) -> dict:
        """The fields each generated row carries besides the transition's: the member that produced it,
        and the uncertainties (and the unpenalised reward) when they are computed."""
        fields = {"member": ((), torch.long)}
        if self.uncertainty or self.penalty != "none":
            fields.update({key: ((), torch.float32) for key in UNCERTAINTIES})
        if self.penalty != "none":
            fields["model_rewards"] = ((), torch.float32)
        return fields


class BranchedRollouts:
    """k-step rollouts of a policy in a dynamics model (`GaussianEnsembleDynamics` or `TrueDynamics`)
    from given start states."""

    def __init__(self, dynamics, termination_fn: TerminationFn,
                 config: RolloutConfig = RolloutConfig()):
        self.dynamics, self.termination_fn, self.config = dynamics, termination_fn, config

    @property
    def buffer_capacity(self) -> int:
        return self.config.buffer_capacity

    @property
    def extra_fields(self) -> dict:
        return self.config.extra_fields

    def generate(self, policy: Policy, real: dict[str, torch.Tensor], generator: Optional[torch.Generator] = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """`rollout` from ``rollouts_per_epoch`` start states drawn from the real data's observations."""
        return self.rollout(policy, self.sample_starts(real["observations"], generator), generator)

    def sample_starts(self, observations: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``rollouts_per_epoch`` start states from ``observations`` (the real data, on the device)."""
        n, want = len(observations), self.config.rollouts_per_epoch
        if want <= n:
            index = torch.randperm(n, device=observations.device, generator=generator)[:want]
        else:
            index = torch.randint(0, n, (want,), device=observations.device, generator=generator)
        return observations[index]

    @torch.no_grad()
    def rollout(self, policy: Policy, start_observations: torch.Tensor,
                generator: Optional[torch.Generator] = None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Roll out ``policy`` (its ``sample``: feed-forward, stochastic) from each start state.

        Returns the transitions (fields of `mbrl_offline.buffer.TRANSITION_FIELDS` and `extra_fields`,
        on the device) and statistics: transitions, mean rollout length, mean reward, fraction of
        rollouts terminated, and the mean uncertainties when they are computed.
        """
        cfg = self.config
        steps: list[dict[str, torch.Tensor]] = []
        obs = start_observations
        uncertainty = cfg.uncertainty or cfg.penalty != "none"

        def sample(observations: torch.Tensor) -> torch.Tensor:
            return policy.sample(observations)[0]

        members = None
        if cfg.member == "rollout":  # one elite per rollout, kept while it runs
            elites = self.dynamics.elites
            members = elites[torch.randint(0, len(elites), (len(obs),), device=obs.device, generator=generator)]
        for _ in range(cfg.horizon):
            if cfg.planner == "upmpc":
                actions = upmpc_actions(self.dynamics, sample, obs, cfg.upmpc, generator, cfg.deterministic_model)
            else:
                actions = sample(obs)
            model = self.dynamics.step(obs, actions, generator, deterministic=cfg.deterministic_model,
                                       uncertainty=uncertainty, members=members)
            next_obs, rewards = model["next_observations"], model["rewards"]
            finite = torch.isfinite(next_obs).all(-1) & torch.isfinite(rewards)
            terminals = self.termination_fn(next_obs) & finite
            step = {"observations": obs, "actions": actions, "rewards": rewards, "next_observations": next_obs,
                    "terminals": terminals, "member": model["member"],
                    **{k: model[k] for k in UNCERTAINTIES if k in model}}
            if cfg.penalty != "none":
                step["model_rewards"] = rewards
                step["rewards"] = rewards - cfg.penalty_coef * model[cfg.penalty]
            if not bool(finite.all()):
                step = {k: v[finite] for k, v in step.items()}
            steps.append(step)
            alive = finite & ~terminals
            obs = next_obs[alive]
            if members is not None:
                members = members[alive]
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
                stats[f"{key}_mean"] = batch[key].mean().item() if n else float("nan")
        return batch, stats


@dataclass
class RolloutGeneratorConfig(GeneratorConfig):
    """``generator=rollouts``: branched model rollouts, their dynamics model, schedule and mixing."""

    kind: str = "rollouts"
    # Updates between generations (RAVL, MOPO, MOBILE, COPlanner: 1000, one per epoch of their code);
    # 0: generate once, at the start.
    every: int = 1000
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the rollouts' settings
    dynamics: DynamicsConfig = field(default_factory=DynamicsConfig)  # the learned ensemble's settings
    true_dynamics: bool = False  # roll out in the simulator itself (`TrueDynamics`) instead of the ensemble
    mixing: MixingConfig = field(default_factory=MixingConfig)  # real and synthetic rows per batch

    def fitted_model(self) -> Optional[str]:
        """The learned ensemble is fitted into the dynamics cache (the simulator needs none)."""
        return None if self.true_dynamics else "dynamics"

    def check_dataset(self, dataset, model_path=None) -> None:
        """Enough rows for the ensemble's holdout and batches (`mbrl_offline.models.fitting.check_fit_rows`)."""
        if model_path is None and not self.true_dynamics:
            check_dynamics_rows(dataset, self.dynamics)


@register_generator
class RolloutGenerator:
    """The rollout generator of a run: `BranchedRollouts` in a dynamics model, with the settings of a
    `RolloutGeneratorConfig` (schedule and mixing are read by the trainer)."""

    # what it gives, for the docs' tables
    summary = ("branched rollouts in a learned dynamics ensemble (or the simulator), optionally penalised or "
               "UP-MPC planned")
    config_class = RolloutGeneratorConfig
    produces = "transitions"
    recurrent_policy = False  # branched rollouts step a feed-forward policy
    provides_dynamics = True  # its ensemble (or the simulator) is handed to agents that need one (MOBILE)

    def __init__(self, dynamics, termination_fn: TerminationFn,
                 config: RolloutGeneratorConfig = RolloutGeneratorConfig()):
        self.config = config
        self.rollouts = BranchedRollouts(dynamics, termination_fn, config.rollout)

    @property
    def dynamics(self):
        return self.rollouts.dynamics

    @property
    def buffer_capacity(self) -> int:
        return self.config.rollout.buffer_capacity

    @property
    def extra_fields(self) -> dict:
        return self.config.rollout.extra_fields

    @classmethod
    def for_dataset(cls, config: RolloutGeneratorConfig, dataset, device: str | torch.device = "cpu",
                    cache_dir: Optional[str | Path] = None, model_path: Optional[str | Path] = None,
                    progress: bool = True) -> "RolloutGenerator":
        """The generator for ``dataset``'s env: the simulator if ``config.true_dynamics``; else the
        ensemble from ``model_path``, or from the cache (trained on ``dataset`` with ``config.dynamics``
        the first time)."""
        env = dataset_env(dataset, "generator=rollouts")
        if config.true_dynamics:
            if model_path is not None:
                raise ConfigError("generator.true_dynamics=true rolls out in the simulator; leave dynamics_path unset.")
            dynamics = TrueDynamics(env.name)
        elif model_path is not None:
            dynamics = GaussianEnsembleDynamics.load(model_path, map_location=device)
        else:
            dynamics, _ = load_or_fit_dynamics(dataset, config.dynamics, cache_dir, device, progress)
        return cls(dynamics.to(torch.device(device)), env.termination_fn, config)

    def generate(self, policy: Policy, real: dict[str, torch.Tensor], rng: Optional[torch.Generator] = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        check_policy(self, policy)  # branched rollouts step a feed-forward policy
        return self.rollouts.generate(policy, real, rng)

    @property
    def model(self):
        """The dynamics model (the ensemble, or the simulator), which the checkpoint knows by fingerprint."""
        return self.rollouts.dynamics

    def state_dict(self) -> dict:
        """Nothing besides the model: branched rollouts keep no state between generations."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


__all__ = ["BranchedRollouts", "RolloutConfig", "RolloutGenerator", "RolloutGeneratorConfig"]
