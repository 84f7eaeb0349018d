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
  instead of sampled from the policy;
* ``halt="usad"``: MOReL's pessimistic MDP (Kidambi et al. 2020; aravindr93/mjrl v2,
  ``projects/morel/run_morel.py`` and ``mjrl/algos/mbrl/model_based_npg.py``). Its unknown-state
  detector (USAD) is a threshold on the ensemble's disagreement, delta(s, a) = max_{i<j}
  |mu_i^{s'}(s, a) - mu_j^{s'}(s, a)|_2 (every member, next state only,
  `mbrl_offline.models.uncertainty.max_pairwise_distance`): threshold = max over the dataset's (s, a) of
  delta, divided by ``pessimism_coef``. A rollout halts at its first step with delta > threshold, but
  not before its step ``halt_min_steps - 1`` (the official code keeps at least 4 steps: ``T = max(4, T)``):
  that transition gets ``halt_reward`` added to its reward (official ``truncate_reward``, 0.0 in both
  shipped configs; the paper's HALT reward -kappa is ``halt_reward=-kappa``) and is terminal, so
  nothing is bootstrapped after it. It needs an ensemble: on the simulator or a one-member model it
  is refused.

MOReL's official planner also rolls out differently, which these options give: ``start="initial"``
(start states drawn with replacement from the dataset's episode starts), ``member="every"`` (each start
state rolled out once in every elite: ``rollouts_per_epoch`` start states give that many paths per
member), ``deterministic_model`` (the members' means), ``clamp`` (actions and next states clamped to
±100), ``min_length`` (paths shorter than 5 steps dropped) and ``label_paths`` (each row's path and
step, so that an on-policy learner can read whole paths: `mbrl_offline.algorithms.morel`). Two
differences from the official truncation: the official code tests the steps of a path except its last
(its disagreement is computed on ``observations[:-1]``), and drops paths shorter than 5 steps before
the truncation, here after it; and a path that the termination function ended is terminal here
whether or not USAD cut it (the official code marks every path it did not cut as not terminated,
so that a path the termination function ended bootstraps: read as an oversight).

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
from mbrl_offline.config import (check_field_types, require_above_zero, require_in_range, require_nonnegative,
                                 require_positive)
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.data.termination import TerminationFn
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.upmpc import UPMPCConfig, upmpc_actions
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, load_or_fit_dynamics
from mbrl_offline.models.fitting import check_dynamics_rows
from mbrl_offline.models.true_dynamics import TrueDynamics
from mbrl_offline.models.uncertainty import max_pairwise_distance
from mbrl_offline.pairing import check_policy
from mbrl_offline.registry import register_generator
from mbrl_offline.roles import GeneratorConfig, Policy
PENALTIES = ("none", "aleatoric", "disagreement", "epistemic")
PLANNERS = ("policy", "upmpc")
UNCERTAINTIES = ("aleatoric", "disagreement", "epistemic")
MEMBERS = ("step", "rollout", "every")
HALTS = ("none", "usad")
STARTS = ("data", "initial")


@dataclass
class RolloutConfig:
    horizon: int = 5  # k: model steps per rollout
    rollouts_per_epoch: int = 50_000  # start states per generation (RAVL, MOPO: one generation per 1000 updates)
    retain_epochs: int = 5  # the synthetic buffer holds this many generations' worth of transitions
    deterministic_model: bool = False  # use the members' means instead of sampling (RAVL samples)
    # Which elite produces each transition: "step" (one drawn at random per row and step: MBPO, RAVL,
    # MOPO, MOBILE), "rollout" (one drawn at the rollout's start and kept for its whole length) or
    # "every" (each start state rolled out once in every elite: MOReL's official planner).
    member: str = "step"
    uncertainty: bool = False  # log per-transition uncertainty (costs every member on every row)
    # Reward penalty r - penalty_coef * u on model transitions: none, aleatoric (MOPO: max over members
    # of the predicted std's norm), disagreement (COPlanner's sampled ensemble std), epistemic.
    penalty: str = "none"
    penalty_coef: float = 0.0  # lambda
    planner: str = "policy"  # rollout actions: policy (sampled from the current policy) or upmpc (COPlanner)
    upmpc: UPMPCConfig = field(default_factory=UPMPCConfig)  # used when planner is upmpc
    # --- MOReL's pessimistic MDP (see the module docstring)
    halt: str = "none"  # "usad": halt where the members' disagreement exceeds the threshold; "none": never
    pessimism_coef: float = 3.0  # kappa_p: threshold = max over the dataset of delta / kappa_p (MOReL hopper-medium: 3)
    halt_reward: float = 0.0  # added to the halting transition's reward (official truncate_reward 0; paper: -kappa)
    halt_min_steps: int = 1  # no halt before a rollout's step halt_min_steps - 1 (official MOReL: 4)
    start: str = "data"  # start states: "data" (any dataset state) or "initial" (the dataset's episode starts)
    min_length: int = 1  # rollouts with fewer steps are dropped (official MOReL: 5)
    clamp: Optional[float] = None  # actions and next states clamped to ±clamp (official MOReL: 100); None: not
    label_paths: bool = False  # store each row's path (its index in the generation) and step, for path learners

    def __post_init__(self):
        check_field_types(self, "rollout")  # types first; nested mappings become configs
        require_positive(self, "horizon", "rollouts_per_epoch", "retain_epochs", "halt_min_steps", "min_length",
                         section="rollout")
        require_above_zero(self, "pessimism_coef", "clamp", section="rollout")
        require_in_range(self, "halt_reward", section="rollout")
        if self.halt not in HALTS:
            raise ConfigError(f"unknown rollout.halt '{self.halt}'; choose one of {', '.join(HALTS)}.")
        if self.start not in STARTS:
            raise ConfigError(f"unknown rollout.start '{self.start}'; choose one of {', '.join(STARTS)}.")
        require_nonnegative(self, "penalty_coef", section="rollout")
        if self.penalty not in PENALTIES:
            raise ConfigError(f"unknown rollout.penalty '{self.penalty}'; choose one of {', '.join(PENALTIES)}.")
        if self.member not in MEMBERS:
            raise ConfigError(f"unknown rollout.member '{self.member}'; choose one of {', '.join(MEMBERS)}.")
        if self.planner not in PLANNERS:
            raise ConfigError(f"unknown rollout.planner '{self.planner}'; choose one of {', '.join(PLANNERS)}.")
        if self.penalty_coef < 0:
            raise ConfigError(f"rollout.penalty_coef must be >= 0, got {self.penalty_coef}.")

    def capacity(self, members: int) -> int:
        """The synthetic buffer's rows: ``retain_epochs`` generations of at most ``rollouts_per_epoch``
        x ``horizon`` rows, times ``members`` (the elites) where each start is rolled out in every one."""
        paths = self.rollouts_per_epoch * (members if self.member == "every" else 1)
        return paths * self.horizon * self.retain_epochs

    @property
    def buffer_capacity(self) -> int:
        return self.capacity(1)

    @property
    def computes_uncertainty(self) -> bool:
        """Whether every member is evaluated on every row (for the log, a penalty or a halt)."""
        return self.uncertainty or self.penalty != "none" or self.halt != "none"

    @property
    def extra_fields(self) -> dict:
        """The fields each generated row carries besides the transition's: the member that produced it,
        the uncertainties (and the unpenalised reward) when they are computed, and the row's path and
        step with ``label_paths``."""
        fields = {"member": ((), torch.long)}
        if self.computes_uncertainty:
            fields.update({key: ((), torch.float32) for key in UNCERTAINTIES})
        if self.penalty != "none":
            fields["model_rewards"] = ((), torch.float32)
        if self.halt != "none":
            fields["usad"] = ((), torch.float32)  # MOReL's disagreement delta(s, a)
        if self.label_paths:
            fields.update(path=((), torch.long), step=((), torch.long))
        return fields


class BranchedRollouts:
    """k-step rollouts of a policy in a dynamics model (`GaussianEnsembleDynamics` or `TrueDynamics`)
    from given start states."""

    def __init__(self, dynamics, termination_fn: TerminationFn,
                 config: RolloutConfig = RolloutConfig()):
        self.dynamics, self.termination_fn, self.config = dynamics, termination_fn, config
        self.threshold: Optional[float] = None  # USAD's, set from the real data at the first generation

    @property
    def buffer_capacity(self) -> int:
        return self.config.capacity(len(self.dynamics.elites))

    @property
    def extra_fields(self) -> dict:
        return self.config.extra_fields

    def generate(self, policy: Policy, real: dict[str, torch.Tensor], generator: Optional[torch.Generator] = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """`rollout` from ``rollouts_per_epoch`` start states drawn from the real data (any observation,
        or the episodes' first ones with ``start="initial"``); with ``halt="usad"`` the threshold is set
        from the real data first (`usad_threshold`, once)."""
        if self.config.halt == "usad" and self.threshold is None:
            self.threshold = usad_threshold(self.dynamics, real["observations"], real["actions"],
                                            self.config.pessimism_coef)
        observations = real["observations"]
        if self.config.start == "initial":
            observations = observations[episode_starts(real["terminals"], real["timeouts"])]
        return self.rollout(policy, self.sample_starts(observations, generator), generator)

    def sample_starts(self, observations: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``rollouts_per_epoch`` start states from ``observations`` (the real data, on the device): without
        replacement where there are enough (RAVL), else uniformly with replacement; MOReL's episode starts
        (``start="initial"``) always with replacement, as its ``np.random.choice(..., replace=True)``."""
        n, want = len(observations), self.config.rollouts_per_epoch
        if want <= n and self.config.start == "data":
            index = torch.randperm(n, device=observations.device, generator=generator)[:want]
        else:
            index = torch.randint(0, n, (want,), device=observations.device, generator=generator)
        return observations[index]

    @torch.no_grad()
    def rollout(self, policy: Policy, start_observations: torch.Tensor,
                generator: Optional[torch.Generator] = None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Roll out ``policy`` (its ``sample``: feed-forward, stochastic) from each start state (in every
        elite with ``member="every"``).

        Returns the transitions (fields of `mbrl_offline.buffer.TRANSITION_FIELDS` and `extra_fields`,
        on the device) and statistics: transitions, mean rollout length, mean reward, fraction of
        rollouts terminated (by the env's termination or a halt) and halted, and the mean uncertainties
        when they are computed.
        """
        cfg = self.config
        steps: list[dict[str, torch.Tensor]] = []
        obs = start_observations
        uncertainty = cfg.computes_uncertainty
        if cfg.halt == "usad" and self.threshold is None:
            raise ValueError("rollout with halt='usad' needs the threshold: call generate, or set .threshold "
                             "(usad_threshold on the real data)")

        def sample(observations: torch.Tensor) -> torch.Tensor:
            return policy.sample(observations)[0]

        members = None
        if cfg.member == "rollout":  # one elite per rollout, kept while it runs
            elites = self.dynamics.elites
            members = elites[torch.randint(0, len(elites), (len(obs),), device=obs.device, generator=generator)]
        elif cfg.member == "every":  # each start state once in every elite, elite-major (MOReL)
            elites = self.dynamics.elites
            members = elites.repeat_interleave(len(obs))
            obs = obs.repeat(len(elites), 1)
        paths = len(obs)
        path = torch.arange(paths, device=obs.device)  # each row's rollout
        flagged = torch.zeros(paths, dtype=torch.bool, device=obs.device)  # USAD fired on an earlier step
        for t in range(cfg.horizon):
            if cfg.planner == "upmpc":
                actions = upmpc_actions(self.dynamics, sample, obs, cfg.upmpc, generator, cfg.deterministic_model)
            else:
                actions = sample(obs)
            if cfg.clamp is not None:
                actions = actions.clamp(-cfg.clamp, cfg.clamp)
            model = self.dynamics.step(obs, actions, generator, deterministic=cfg.deterministic_model,
                                       uncertainty=uncertainty, members=members)
            next_obs, rewards = model["next_observations"], model["rewards"]
            if cfg.clamp is not None:
                next_obs = next_obs.clamp(-cfg.clamp, cfg.clamp)
            finite = torch.isfinite(next_obs).all(-1) & torch.isfinite(rewards)
            terminals = self.termination_fn(next_obs) & finite
            step = {"observations": obs, "actions": actions, "rewards": rewards, "next_observations": next_obs,
                    "terminals": terminals, "member": model["member"], "path": path,
                    "step": torch.full_like(path, t), **{k: model[k] for k in UNCERTAINTIES if k in model}}
            if cfg.penalty != "none":
                step["model_rewards"] = rewards
                step["rewards"] = rewards - cfg.penalty_coef * model[cfg.penalty]
            if cfg.halt == "usad":  # halt at the first violation, but not before step halt_min_steps - 1
                flagged = flagged | (model["usad"] > self.threshold)
                halts = flagged & (t >= cfg.halt_min_steps - 1) & ~terminals & finite
                step["rewards"] = step["rewards"] + cfg.halt_reward * halts
                step["terminals"] = terminals = terminals | halts
                step["halts"], step["usad"] = halts, model["usad"]
            if not bool(finite.all()):
                step = {k: v[finite] for k, v in step.items()}
            steps.append(step)
            alive = finite & ~terminals
            obs, path, flagged = next_obs[alive], path[alive], flagged[alive]
            if members is not None:
                members = members[alive]
            if len(obs) == 0:
                break
        batch = {k: torch.cat([s[k] for s in steps]) for k in steps[0]}
        halted = batch.pop("halts", None)
        halted = None if halted is None else halted.sum().item()  # before any path is dropped
        lengths = torch.bincount(batch["path"], minlength=paths)
        if cfg.min_length > 1:  # drop the rollouts shorter than min_length (MOReL: 5)
            kept = lengths[batch["path"]] >= cfg.min_length
            batch = {k: v[kept] for k, v in batch.items()}
        if not cfg.label_paths:
            del batch["path"], batch["step"]
        batch["timeouts"] = torch.zeros_like(batch["terminals"])
        n = len(batch["rewards"])
        stats = {
            "transitions": float(n),
            "mean_length": n / paths,
            "reward_mean": batch["rewards"].mean().item() if n else float("nan"),  # penalised, as stored
            "terminated_fraction": batch["terminals"].sum().item() / paths,
        }
        if halted is not None:
            stats["halted_fraction"] = halted / paths  # of the rollouts, short ones included
            stats["usad_threshold"] = self.threshold
        if cfg.min_length > 1:
            stats["dropped_fraction"] = (lengths < cfg.min_length).float().mean().item()
        for key in (*UNCERTAINTIES, "usad", "model_rewards"):
            if key in batch:
                stats[f"{key}_mean"] = batch[key].mean().item() if n else float("nan")
        return batch, stats


def episode_starts(terminals: torch.Tensor, timeouts: torch.Tensor) -> torch.Tensor:
    """Indices of the rows that start an episode in data stored episode by episode: the first row and
    every row after a terminal or a timeout."""
    ends = terminals.bool() | timeouts.bool()
    first = torch.ones(1, dtype=torch.bool, device=ends.device)
    return torch.nonzero(torch.cat([first, ends[:-1]])).squeeze(1)


@torch.no_grad()
def usad_threshold(dynamics, observations: torch.Tensor, actions: torch.Tensor, pessimism_coef: float,
                   chunk: int = 65536) -> float:
    """MOReL's USAD threshold: the largest disagreement delta(s, a) =
    max_{i<j} |mu_i^{s'} - mu_j^{s'}|_2 (`max_pairwise_distance`, every member) over the given rows,
    divided by ``pessimism_coef`` (``run_morel.py``: ``truncate_lim = max(delta) / pessimism_coef``)."""
    largest = torch.zeros((), device=observations.device)
    for start in range(0, len(observations), chunk):
        mean, _ = dynamics.predict(observations[start:start + chunk], actions[start:start + chunk])
        largest = torch.maximum(largest, max_pairwise_distance(mean).max())
    return largest.item() / pessimism_coef


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

    def __post_init__(self):
        super().__post_init__()
        if self.rollout.halt == "usad" and (self.true_dynamics or self.dynamics.ensemble_size < 2):
            model = "the simulator" if self.true_dynamics else "a model of one member"
            raise ConfigError(f"generator.rollout.halt=usad thresholds the disagreement between ensemble members, and "
                              f"{model} has none; use a learned ensemble (generator.true_dynamics=false, "
                              f"generator.dynamics.ensemble_size >= 2) or set generator.rollout.halt=none.")

    def check_agent(self, agent, algo_config) -> None:
        """An on-policy agent (`mbrl_offline.roles.AgentClass`'s ``on_policy``: MOReL's NPG) reads whole
        paths: refuse rollouts without their path labels."""
        if getattr(agent, "on_policy", False) and not self.rollout.label_paths:
            raise ConfigError(f"{agent.name} reads whole paths, and these rollouts are not labelled with them; set "
                              f"generator.rollout.label_paths=true (generator={agent.name} does).")

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
    summary = ("branched rollouts in a learned dynamics ensemble (or the simulator), optionally penalised, "
               "UP-MPC planned or halted where the members disagree (MOReL's USAD)")
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
        return self.rollouts.buffer_capacity

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
        if config.rollout.halt == "usad" and dynamics.config.ensemble_size < 2:
            raise ConfigError(f"generator.rollout.halt=usad thresholds the disagreement between ensemble members, and "
                              f"the model in {model_path} has one member; give a model of several members or set "
                              f"generator.rollout.halt=none.")
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


__all__ = ["BranchedRollouts", "RolloutConfig", "RolloutGenerator", "RolloutGeneratorConfig", "episode_starts",
           "usad_threshold"]
