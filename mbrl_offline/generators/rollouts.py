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
* ``refiner`` (`mbrl_offline.models.refiner.RefinerConfig`, off unless ``enabled``): each stored step's
  prediction is refined by a PDE-Refiner fitted on the data (UP-MPC's planning steps are not), and
  with two or more ``samples`` the spread of its refinements is the row's ``refiner`` uncertainty,
  which ``penalty="refiner"`` and ``halt="refiner"`` read;
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
the truncation, here after it; and a path that the termination function or USAD ended is terminal here
(the official code marks every path as not terminated, cut or not, so that every path bootstraps: read
as an oversight; MOReL's agent reproduces it with ``algo.bootstrap_every_path=true``,
`mbrl_offline.algorithms.morel`).

Two more turn them into RAMBO's (Rigter, Lacerda & Hawes, NeurIPS 2022; OfflineRL-Kit's
``offlinerlkit/policy/model_based/rambo.py``), again with any agent of transitions:

* ``standardise_observations``: the dynamics model is fitted on, and rolls out in, observations
  standardised with the dataset's mean and std + ``observation_std_eps`` (OfflineRL-Kit's RAMBO
  standardises its real buffer in place, ``ReplayBuffer.normalize_obs``, so that its model, its
  rollouts and its agent all work in those coordinates). The model is wrapped (`StandardisedDynamics`)
  so that its callers keep raw units: rollouts start from raw states, the termination function
  reads raw states (OfflineRL-Kit's ``obs_unnormalization`` wrapper), and the stored rows are raw;
  an agent that standardises inside itself (RAMBO's, with the same statistics) then sees what
  OfflineRL-Kit's agent sees, up to float rounding.
* ``adversarial`` (`AdversarialConfig`): RAMBO's adversarial model training. Every ``every`` agent
  updates the trainer calls `RolloutGenerator.adapt`, which takes ``steps`` gradient steps on the
  ensemble against the agent's current value estimates (its value role, `mbrl_offline.roles.ValueFunction`):
  rollouts of the current policy from ``batch_size`` real start states, ``horizon`` steps each
  (no terminal masking: OfflineRL-Kit's masking lines are commented out), and at each step
  (`adversarial_step`)

      (s', r) ~ one no-grad sample per member, of one uniformly drawn elite per row,
      log p   = logsumexp_{k in E} log N((s', r); mu_k, sigma_k) - log |E|      (grad into mu_k, sigma_k)
      A       = r + gamma (1 - d(s')) Q(s', pi_mode(s')) - Q(s, a)              (no grad; Q: the agent's min)
      A_hat   = (A - mean A) / (std A + eps)
      L       = lambda mean(A_hat log p) + L_MLE(real batch) + decay + c (sum max_logvar - sum min_logvar)

  and one step of its own Adam (``learning_rate``). L_MLE is the ensemble's Gaussian NLL summed over
  members (`GaussianEnsembleDynamics.loss`) on a real batch, with the per-layer L2 decay as
  1/2 wd |W|^2 and the log-variance bound term of the model's own config. The model stays modified:
  later rollouts use it, and the changes accumulate over the run. The generator keeps the fitted model
  unchanged (``model``: what the checkpoint fingerprints and the cache gives back) and adapts a copy,
  whose weights and optimiser its ``state_dict`` holds, so a resumed run continues exactly.

  log p is computed as a logsumexp, where OfflineRL-Kit exponentiates in float64 and takes the log
  back (``prob = log_prob.double().exp() / |E|; log_prob = prob.sum(0).log()``): equal wherever that
  form neither under- nor overflows (tests/test_rambo.py), and finite where it gives -inf.

Differences from OfflineRL-Kit's ``RAMBOPolicy.update_dynamics`` (settings where they are choices):
``when_zero`` says what lambda = 0 does (OfflineRL-Kit: the MLE steps still run, a fine-tune on real
data; the official code: nothing); ``mle_batch`` "shared" (OfflineRL-Kit: one real batch for all
members) or "per_member" (the official ``bnn.py``: an independent batch per member);
``advantage_eps`` 1e-6 (OfflineRL-Kit) or 0 (the official). With lambda = 0 and "mle_finetune" the
rollout part is not computed (its loss term is 0 x it): the same steps, less work, other random draws.
The noise is torch's (OfflineRL-Kit draws it with torch in this step too) and the elite choice
``torch.randint`` (OfflineRL-Kit: ``np.random.choice``). The elite draw and samples of every member
follow OfflineRL-Kit's order (all members sampled, then one picked per row). OfflineRL-Kit's
``include_ent_in_adv`` (default False) is not offered.

`RolloutGenerator` is the generator role (`mbrl_offline.roles.Generator`) around them: the dynamics
model (the learned ensemble, fitted or loaded from the cache, or the simulator itself), the schedule
and the mixing rule, as one `RolloutGeneratorConfig` (``generator=rollouts``; each model-based
algorithm publishes its own, e.g. `mbrl_offline.algorithms.RAVL.published_generator`).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import (check_field_types, require_above_zero, require_in_range, require_nonnegative,
                                 require_positive)
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.data.termination import TerminationFn
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators.upmpc import UPMPCConfig, upmpc_actions
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, load_or_fit_dynamics
from mbrl_offline.models.fitting import check_dynamics_rows, check_fit_rows
from mbrl_offline.models.refiner import DynamicsRefiner, RefinerConfig, load_or_fit_refiner
from mbrl_offline.models.true_dynamics import TrueDynamics
from mbrl_offline.models.uncertainty import max_pairwise_distance
from mbrl_offline.pairing import check_policy
from mbrl_offline.registry import register_generator
from mbrl_offline.roles import GeneratorConfig, Policy, ValueFunction
from mbrl_offline.utils import adam_kernel
PENALTIES = ("none", "aleatoric", "disagreement", "epistemic", "refiner")
PLANNERS = ("policy", "upmpc")
UNCERTAINTIES = ("aleatoric", "disagreement", "epistemic")
MEMBERS = ("step", "rollout", "every")
HALTS = ("none", "usad", "refiner")
STARTS = ("data", "initial")
WHEN_ZERO = ("mle_finetune", "skip")  # AdversarialConfig.when_zero
MLE_BATCHES = ("shared", "per_member")  # AdversarialConfig.mle_batch


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
    # of the predicted std's norm), disagreement (COPlanner's sampled ensemble std), epistemic, or
    # refiner (the spread of the refiner's samples; needs refiner.enabled and refiner.samples >= 2).
    penalty: str = "none"
    penalty_coef: float = 0.0  # lambda
    planner: str = "policy"  # rollout actions: policy (sampled from the current policy) or upmpc (COPlanner)
    upmpc: UPMPCConfig = field(default_factory=UPMPCConfig)  # used when planner is upmpc
    # --- MOReL's pessimistic MDP (see the module docstring)
    # "usad": halt where the members' disagreement exceeds the threshold; "refiner": where the refiner's
    # spread does (threshold: its max over the dataset's rows / pessimism_coef); "none": never
    halt: str = "none"
    pessimism_coef: float = 3.0  # kappa_p: threshold = max over the dataset of delta / kappa_p (MOReL hopper-medium: 3)
    halt_reward: float = 0.0  # added to the halting transition's reward (official truncate_reward 0; paper: -kappa)
    halt_min_steps: int = 1  # no halt before a rollout's step halt_min_steps - 1 (official MOReL: 4)
    start: str = "data"  # start states: "data" (any dataset state) or "initial" (the dataset's episode starts)
    min_length: int = 1  # rollouts with fewer steps are dropped (official MOReL: 5)
    clamp: Optional[float] = None  # actions and next states clamped to ±clamp (official MOReL: 100); None: not
    label_paths: bool = False  # store each row's path (its index in the generation) and step, for path learners
    # A PDE-Refiner for each step's prediction (`mbrl_offline.models.refiner`; off unless refiner.enabled)
    refiner: RefinerConfig = field(default_factory=RefinerConfig)

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
        for setting, value in (("penalty", self.penalty), ("halt", self.halt)):
            if value == "refiner" and not self.refiner.gives_spread:
                raise ConfigError(f"rollout.{setting}=refiner reads the spread of the refiner's samples, and this "
                                  f"refiner gives none; set rollout.refiner.enabled=true and "
                                  f"rollout.refiner.samples to 2 or more.")

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
        return self.uncertainty or self.penalty in UNCERTAINTIES or self.halt == "usad"

    @property
    def extra_fields(self) -> dict:
        """The fields each generated row carries besides the transition's: the member that produced it,
        the uncertainties (and the unpenalised reward) when they are computed, and the row's path and
        step with ``label_paths``."""
        fields = {"member": ((), torch.long)}
        if self.computes_uncertainty:
            fields.update({key: ((), torch.float32) for key in UNCERTAINTIES})
        if self.refiner.gives_spread:
            fields["refiner"] = ((), torch.float32)  # the spread of the refiner's samples
        if self.penalty != "none":
            fields["model_rewards"] = ((), torch.float32)
        if self.halt == "usad":
            fields["usad"] = ((), torch.float32)  # MOReL's disagreement delta(s, a)
        if self.label_paths:
            fields.update(path=((), torch.long), step=((), torch.long))
        return fields


class BranchedRollouts:
    """k-step rollouts of a policy in a dynamics model (`GaussianEnsembleDynamics` or `TrueDynamics`)
    from given start states."""

    def __init__(self, dynamics, termination_fn: TerminationFn,
                 config: RolloutConfig = RolloutConfig(), refiner: Optional[DynamicsRefiner] = None):
        self.dynamics, self.termination_fn, self.config = dynamics, termination_fn, config
        if config.refiner.enabled and refiner is None:
            raise ConfigError("rollout.refiner.enabled is set and no refiner was given; pass a fitted "
                              "DynamicsRefiner (load_or_fit_refiner), or set rollout.refiner.enabled=false.")
        self.refiner = refiner if config.refiner.enabled else None
        self.threshold: Optional[float] = None  # the halt's, set from the real data at the first generation

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
        elif self.config.halt == "refiner" and self.threshold is None:
            self.threshold = refiner_threshold(self.dynamics, self.refiner, real["observations"], real["actions"],
                                               self.config.pessimism_coef, generator)
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
        if cfg.halt != "none" and self.threshold is None:
            raise ValueError(f"rollout with halt='{cfg.halt}' needs the threshold: call generate, or set .threshold "
                             f"({cfg.halt}_threshold on the real data)")

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
            if self.refiner is not None:  # step 0 is the model's prediction (or the refiner's own)
                model.update(self.refiner.refine(obs, actions, model["next_observations"], model["rewards"],
                                                 generator))
            next_obs, rewards = model["next_observations"], model["rewards"]
            if cfg.clamp is not None:
                next_obs = next_obs.clamp(-cfg.clamp, cfg.clamp)
            finite = torch.isfinite(next_obs).all(-1) & torch.isfinite(rewards)
            terminals = self.termination_fn(next_obs) & finite
            step = {"observations": obs, "actions": actions, "rewards": rewards, "next_observations": next_obs,
                    "terminals": terminals, "member": model["member"], "path": path,
                    "step": torch.full_like(path, t),
                    **{k: model[k] for k in (*UNCERTAINTIES, "refiner") if k in model}}
            if cfg.penalty != "none":
                step["model_rewards"] = rewards
                step["rewards"] = rewards - cfg.penalty_coef * model[cfg.penalty]
            if cfg.halt != "none":  # halt at the first violation, but not before step halt_min_steps - 1
                flagged = flagged | (model[cfg.halt] > self.threshold)
                halts = flagged & (t >= cfg.halt_min_steps - 1) & ~terminals & finite
                step["rewards"] = step["rewards"] + cfg.halt_reward * halts
                step["terminals"] = terminals = terminals | halts
                step["halts"], step[cfg.halt] = halts, model[cfg.halt]
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
            stats[f"{cfg.halt}_threshold"] = self.threshold
        if cfg.min_length > 1:
            stats["dropped_fraction"] = (lengths < cfg.min_length).float().mean().item()
        for key in (*UNCERTAINTIES, "usad", "refiner", "model_rewards"):
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


@torch.no_grad()
def refiner_threshold(dynamics, refiner: DynamicsRefiner, observations: torch.Tensor, actions: torch.Tensor,
                      pessimism_coef: float, generator: Optional[torch.Generator] = None, chunk: int = 65536) -> float:
    """``halt="refiner"``'s threshold, by USAD's rule: the largest spread of the refiner's samples over the
    given rows (each refining the model's step from the row's state and action), divided by
    ``pessimism_coef``."""
    largest = torch.zeros((), device=observations.device)
    for start in range(0, len(observations), chunk):
        obs, act = observations[start:start + chunk], actions[start:start + chunk]
        model = dynamics.step(obs, act, generator)
        spread = refiner.refine(obs, act, model["next_observations"], model["rewards"], generator)["refiner"]
        largest = torch.maximum(largest, spread.max())
    return largest.item() / pessimism_coef


@dataclass
class AdversarialConfig:
    """RAMBO's adversarial model training (module docstring), off unless ``every`` > 0. Defaults:
    OfflineRL-Kit's ``run_rambo.py`` (1000 steps every 1000 updates, batch 256, lambda 3e-4, Adam 3e-4)."""

    every: int = 0  # agent updates between adversarial phases (OfflineRL-Kit: 1000); 0: off
    steps: int = 1000  # gradient steps on the ensemble per phase
    coef: float = 3e-4  # lambda: the adversarial term's weight against the MLE term
    batch_size: int = 256  # start states of the adversarial rollouts, and real rows of the MLE term
    horizon: Optional[int] = None  # steps of each adversarial rollout; None: the rollouts' horizon (OfflineRL-Kit)
    learning_rate: float = 3e-4  # its own Adam over the model's parameters (OfflineRL-Kit's dynamics_adv_optim)
    # What lambda = 0 does: "mle_finetune" (the steps still run on the MLE term alone: OfflineRL-Kit)
    # or "skip" (no step at all, the model stays the fitted one: the official code).
    when_zero: str = "mle_finetune"
    # The MLE term's real rows: "shared" (one batch for every member: OfflineRL-Kit) or "per_member"
    # (an independent batch per member: the official bnn.py's get_labeled_batch).
    mle_batch: str = "shared"
    advantage_eps: float = 1e-6  # A_hat = (A - mean) / (std + advantage_eps) (OfflineRL-Kit; the official: 0)

    def __post_init__(self):
        check_field_types(self, "generator.adversarial")  # types first: a coefficient that is not a number is refused here
        require_nonnegative(self, "every", section="generator.adversarial")
        require_positive(self, "steps", "batch_size", section="generator.adversarial")
        require_in_range(self, "coef", low=0.0, section="generator.adversarial",
                         hint=" (lambda: 3e-4 in OfflineRL-Kit's presets, 0 for none)")
        require_in_range(self, "learning_rate", low=0.0, low_open=True, section="generator.adversarial")
        require_nonnegative(self, "advantage_eps", section="generator.adversarial")
        if self.horizon is not None:
            require_positive(self, "horizon", section="generator.adversarial")
        if self.when_zero not in WHEN_ZERO:
            raise ConfigError(f"unknown generator.adversarial.when_zero '{self.when_zero}'; choose one of "
                              f"{', '.join(WHEN_ZERO)}.")
        if self.mle_batch not in MLE_BATCHES:
            raise ConfigError(f"unknown generator.adversarial.mle_batch '{self.mle_batch}'; choose one of "
                              f"{', '.join(MLE_BATCHES)}.")

    @property
    def active(self) -> bool:
        """Whether any adversarial step runs: ``every`` > 0, and lambda > 0 unless lambda = 0 fine-tunes."""
        return self.every > 0 and (self.coef > 0 or self.when_zero == "mle_finetune")


class StandardisedDynamics(nn.Module):
    """A dynamics ensemble fitted on standardised observations, seen in raw units from outside:
    ``step`` and ``sample_next_observations`` take and return raw observations (``inner`` works on
    ``(obs - obs_mean) / obs_std``). ``standardise``/``unstandardise`` convert."""

    def __init__(self, inner, obs_mean: torch.Tensor, obs_std: torch.Tensor):
        super().__init__()
        self.inner = inner
        self.register_buffer("obs_mean", torch.as_tensor(obs_mean, dtype=torch.float32).clone())
        self.register_buffer("obs_std", torch.as_tensor(obs_std, dtype=torch.float32).clone())

    @property
    def elites(self) -> torch.Tensor:
        return self.inner.elites

    @property
    def config(self):
        return self.inner.config

    def standardise(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.obs_mean) / self.obs_std

    def unstandardise(self, obs: torch.Tensor) -> torch.Tensor:
        return obs * self.obs_std + self.obs_mean

    @torch.no_grad()
    def step(self, obs: torch.Tensor, act: torch.Tensor, generator: Optional[torch.Generator] = None,
             deterministic: bool = False, uncertainty: bool = False,
             members: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
        """`GaussianEnsembleDynamics.step` in standardised coordinates, raw next observations out."""
        out = self.inner.step(self.standardise(obs), act, generator, deterministic, uncertainty, members)
        out["next_observations"] = self.unstandardise(out["next_observations"])
        return out

    @torch.no_grad()
    def sample_next_observations(self, obs: torch.Tensor, act: torch.Tensor, samples: int,
                                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
        return self.unstandardise(self.inner.sample_next_observations(self.standardise(obs), act, samples, generator))


def standardised_dataset(dataset, eps: float = 0.0, statistics=None):
    """``dataset`` with observations and next observations standardised by the observations' mean and
    (population) std + ``eps`` (OfflineRL-Kit's ``ReplayBuffer.normalize_obs``), or by given ``statistics``
    ``(mean, std)`` (a refit keeps its model's), and those statistics."""
    mean, std = statistics if statistics is not None else (dataset.observations.mean(0),
                                                           dataset.observations.std(0) + eps)
    copy_ = replace(dataset, observations=(dataset.observations - mean) / std,
                    next_observations=(dataset.next_observations - mean) / std,
                    source=f"{dataset.source} (observations standardised)")
    return copy_, mean, std


def mixture_log_prob(mean: torch.Tensor, std: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """log of the equal-weight mixture density of the members at each row's sample: ``(B,)`` from the
    members' means and stds ``(E, B, D)`` and samples ``(B, D)``, as
    ``logsumexp_k sum_d log N(sample_d; mean_kd, std_kd) - log E``."""
    log_n = torch.distributions.Normal(mean, std).log_prob(sample.unsqueeze(0)).sum(-1)  # (E, B)
    return torch.logsumexp(log_n, dim=0) - math.log(mean.shape[0])


def normalised_advantage(advantage: torch.Tensor, eps: float) -> torch.Tensor:
    """``(A - mean A) / (std A + eps)`` over the batch (the unbiased std, as torch's and OfflineRL-Kit's)."""
    return (advantage - advantage.mean()) / (advantage.std() + eps)


def mle_loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The ensemble's supervised loss on (standardised inputs, member-space targets), ``(B, ...)`` shared
    or ``(N, B, ...)`` per member: `GaussianEnsembleDynamics.loss` (Gaussian NLL summed over members and
    the log-variance bound term) plus each layer's L2 decay as 1/2 wd |W|^2 (OfflineRL-Kit's
    ``get_decay_loss``)."""
    loss = model.loss(inputs, targets)
    for layer, decay in zip([*model.hidden, model.head], model.layer_weight_decay):
        if decay:
            loss = loss + 0.5 * decay * layer.weight.pow(2).sum()
    return loss


def adversarial_step(model, optimizer: torch.optim.Optimizer, obs: torch.Tensor, policy: Policy,
                     value: ValueFunction, real: dict[str, torch.Tensor], termination_fn: TerminationFn,
                     config: AdversarialConfig, to_raw=None, from_raw=None,
                     generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One adversarial gradient step on ``model`` (a `GaussianEnsembleDynamics`), from the rollout states
    ``obs`` ``(B, obs_dim)`` in the model's coordinates; returns the next states (model coordinates,
    detached) and the step's metrics (detached scalars).

    ``real``: a batch of real rows (raw units) for the MLE term, ``(B, ...)`` or, for
    ``mle_batch="per_member"``, ``(N, B, ...)``. ``to_raw``/``from_raw`` convert observations between
    the model's coordinates and the raw units the policy, the value and the termination function read
    (None: the same). The policy and the value run without gradients: only the model's parameters
    get any."""
    to_raw = to_raw or (lambda x: x)
    from_raw = from_raw or (lambda x: x)
    lam = config.coef
    metrics = {}
    next_obs = obs
    loss = torch.zeros((), device=obs.device)
    if lam > 0:
        raw = to_raw(obs)
        with torch.no_grad():
            actions = policy.sample(raw)[0]
        # The elites only: the step's sample and its log-probability read no other member, so the others'
        # forward (and its backward, of zeros) would be wasted: 2/7 of this pass at RAMBO's 5 elites of 7.
        elites = model.elites
        mean, logvar = model.predict(obs, actions, elites_only=True)  # (E, B, obs_dim + 1)
        mean = torch.cat([mean[..., :-1] + obs, mean[..., -1:]], dim=-1)  # [s', r]
        std = (0.5 * logvar).exp()
        with torch.no_grad():  # one sample of each elite, then one elite per row (OfflineRL-Kit's order):
            # the noise is drawn for all N members, as OfflineRL-Kit draws it, and the elites' rows kept, so
            # the generator's stream and every sample are those of a pass over all members
            noise = torch.randn((model.config.ensemble_size, *mean.shape[1:]), device=obs.device,
                                generator=generator)[elites]
            samples = mean + std * noise
            pick = torch.randint(0, len(elites), (len(obs),), device=obs.device, generator=generator)
            sample = samples[pick, torch.arange(len(obs), device=obs.device)]
        log_p = mixture_log_prob(mean, std, sample)  # (B,), grad into every elite's mean and std
        next_obs, rewards = sample[:, :-1], sample[:, -1]
        with torch.no_grad():
            next_raw = to_raw(next_obs)
            terminals = termination_fn(next_raw).float()
            next_q = value.q_value(next_raw, value.mode(next_raw))
            advantage = rewards + value.discount * (1.0 - terminals) * next_q - value.q_value(raw, actions)
            advantage_hat = normalised_advantage(advantage, config.advantage_eps)
        adversarial = (advantage_hat * log_p).mean()
        loss = lam * adversarial
        metrics = {"adversarial_loss": adversarial.detach(), "log_prob": log_p.detach().mean(),
                   "advantage_mean": advantage.mean(), "advantage_std": advantage.std(),
                   "terminated_fraction": terminals.mean()}
    real_obs, real_next = from_raw(real["observations"]), from_raw(real["next_observations"])
    targets = torch.cat([real_next - real_obs, real["rewards"].unsqueeze(-1)], dim=-1)
    targets = (targets - model.output_shift) / model.output_scale  # the members' space
    mle = mle_loss(model, model.normalise(real_obs, real["actions"]), targets)
    loss = loss + mle
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    metrics.update(mle_loss=mle.detach(), loss=loss.detach())
    return next_obs.detach(), metrics


class AdversarialTrainer:
    """RAMBO's adversarial phases on one ensemble (`adversarial_step`): its own Adam, the start states and
    MLE rows drawn from the real data, ``steps`` steps in rollouts of ``horizon`` steps."""

    def __init__(self, dynamics, termination_fn: TerminationFn, config: AdversarialConfig, horizon: int):
        self.dynamics, self.termination_fn, self.config = dynamics, termination_fn, config
        self.horizon = config.horizon or horizon
        self.model = dynamics.inner if isinstance(dynamics, StandardisedDynamics) else dynamics
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate, **adam_kernel())

    def run(self, policy: Policy, value: ValueFunction, real: dict[str, torch.Tensor],
            generator: Optional[torch.Generator] = None) -> dict[str, float]:
        """One phase: ``steps`` adversarial steps (none where lambda = 0 and ``when_zero="skip"``);
        returns the metrics averaged over them."""
        cfg, model = self.config, self.model
        if not cfg.active:
            return {}
        wrapped = isinstance(self.dynamics, StandardisedDynamics)
        to_raw = self.dynamics.unstandardise if wrapped else None
        from_raw = self.dynamics.standardise if wrapped else None
        n, device = len(real["observations"]), real["observations"].device
        members = model.config.ensemble_size if cfg.mle_batch == "per_member" else None

        def rows(shape) -> dict[str, torch.Tensor]:
            index = torch.randint(0, n, shape, device=device, generator=generator)
            return {k: real[k][index] for k in ("observations", "actions", "next_observations", "rewards")}

        sums: dict[str, torch.Tensor] = {}
        model.train()
        steps, obs = 0, None
        while steps < cfg.steps:
            if steps % self.horizon == 0:
                obs = rows((cfg.batch_size,))["observations"]
                obs = from_raw(obs) if wrapped else obs
            batch = rows((members, cfg.batch_size) if members else (cfg.batch_size,))
            obs, metrics = adversarial_step(model, self.optimizer, obs, policy, value, batch, self.termination_fn,
                                            cfg, to_raw, from_raw, generator)
            for key, v in metrics.items():
                sums[key] = sums.get(key, 0.0) + v
            steps += 1
        model.eval()
        return {key: (v / steps).item() for key, v in sums.items()}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


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
    # Fit the ensemble on, and roll out in, observations standardised with the dataset's mean and std +
    # observation_std_eps (OfflineRL-Kit's RAMBO: 1e-3); rows are stored in raw units either way.
    standardise_observations: bool = False
    observation_std_eps: float = 1e-3
    # RAMBO's adversarial model training against the agent's value estimates (off unless adversarial.every > 0).
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)

    def __post_init__(self):
        super().__post_init__()
        require_nonnegative(self, "observation_std_eps", section="generator")
        if self.true_dynamics and (self.standardise_observations or self.adversarial.every > 0):
            raise ConfigError("generator.true_dynamics=true rolls out in the simulator, which has no model to "
                              "standardise or train adversarially; set generator.standardise_observations=false and "
                              "generator.adversarial.every=0.")
        if self.standardise_observations and self.rollout.planner == "upmpc":
            raise ConfigError("generator.rollout.planner=upmpc plans with the model's raw-unit predictions; set "
                              "generator.standardise_observations=false.")
        if self.true_dynamics and self.rollout.refiner.enabled:
            raise ConfigError("generator.rollout.refiner refines a learned model's predictions, and "
                              "generator.true_dynamics=true rolls out in the simulator; set one of them to false.")
        if self.rollout.halt == "usad" and (self.true_dynamics or self.dynamics.ensemble_size < 2):
            model = "the simulator" if self.true_dynamics else "a model of one member"
            raise ConfigError(f"generator.rollout.halt=usad thresholds the disagreement between ensemble members, and "
                              f"{model} has none; use a learned ensemble (generator.true_dynamics=false, "
                              f"generator.dynamics.ensemble_size >= 2) or set generator.rollout.halt=none.")

    def check_agent(self, agent, algo_config) -> None:
        """Adversarial training needs the agent's value role (``provides_value``: an action for a state and
        its pessimistic Q; `mbrl_offline.roles.ValueFunction`). An on-policy agent (`mbrl_offline.roles.
        AgentClass`'s ``on_policy``: MOReL's NPG) reads whole paths: refuse rollouts without their path labels."""
        if self.adversarial.active and not getattr(agent, "provides_value", False):
            raise ConfigError(f"generator.adversarial trains the model against the agent's value estimates, and "
                              f"{agent.name} provides none (its class declares provides_value False); set "
                              f"generator.adversarial.every=0, or use an agent with critics (e.g. sac, iql, td3bc).")
        if getattr(agent, "on_policy", False) and not self.rollout.label_paths:
            raise ConfigError(f"{agent.name} reads whole paths, and these rollouts are not labelled with them; set "
                              f"generator.rollout.label_paths=true (generator={agent.name} does).")

    def without_penalty(self) -> "RolloutGeneratorConfig":
        """No reward penalty (``rollout.penalty_coef`` 0: MOPO's, COPlanner's), no halting (``rollout.halt``
        none: MOReL's pessimistic MDP) and no adversarial model training (``adversarial.every`` 0: RAMBO's):
        MBPO's rollouts. UP-MPC's planning stays as set."""
        rollout = replace(self.rollout, penalty="none", penalty_coef=0.0, halt="none")
        return replace(self, rollout=rollout, adversarial=replace(self.adversarial, every=0))

    def check_refit(self) -> None:
        """The simulator has no model to refit."""
        if self.true_dynamics:
            raise ConfigError("trainer.online.refit_every refits a learned model, and generator.true_dynamics=true "
                              "rolls out in the simulator; leave trainer.online.refit_every null.")

    def fitted_model(self) -> Optional[str]:
        """The learned ensemble is fitted into the dynamics cache (the simulator needs none)."""
        return None if self.true_dynamics else "dynamics"

    def check_dataset(self, dataset, model_path=None) -> None:
        """Enough rows for the ensemble's holdout and batches (`mbrl_offline.models.fitting.check_fit_rows`)."""
        if model_path is None and not self.true_dynamics:
            check_dynamics_rows(dataset, self.dynamics)
        refiner = self.rollout.refiner
        if refiner.enabled:
            check_fit_rows(len(dataset), refiner.holdout_ratio, None, refiner.batch_size,
                           f"the dataset ({dataset.source}) for generator.rollout.refiner")


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
                 config: RolloutGeneratorConfig = RolloutGeneratorConfig(), refiner: Optional[DynamicsRefiner] = None):
        self.config = config
        self.fitted = dynamics  # the model as fitted or loaded (``model``): changed by `refit` only
        self.refits = 0  # `refit` calls so far
        self.adversary = None
        if config.adversarial.active:  # the rollouts step a copy that the adversarial phases train
            dynamics = copy.deepcopy(dynamics)
            self.adversary = AdversarialTrainer(dynamics, termination_fn, config.adversarial, config.rollout.horizon)
        self.rollouts = BranchedRollouts(dynamics, termination_fn, config.rollout, refiner)

    @property
    def dynamics(self):
        """The model the rollouts step (the adversarially trained copy where ``adversarial`` is on)."""
        return self.rollouts.dynamics

    @property
    def adapt_every(self) -> int:
        """Agent updates between `adapt` calls (`mbrl_offline.roles.Generator`): the adversarial phases'
        ``every``; 0 (never) when they are off."""
        return self.config.adversarial.every if self.adversary is not None else 0

    def adapt(self, policy: Policy, value: ValueFunction, real: dict[str, torch.Tensor],
              rng: Optional[torch.Generator] = None) -> dict[str, float]:
        """One adversarial phase (`AdversarialTrainer.run`) against the agent's current ``policy`` and
        ``value``, from the real rows ``real``; returns its mean metrics."""
        check_policy(self, policy)
        return self.adversary.run(policy, value, real, rng) if self.adversary is not None else {}

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
        the first time); with ``rollout.refiner.enabled`` also the refiner, from the cache (fitted on
        ``dataset``'s raw transitions the first time, `load_or_fit_refiner`; in ``cache_dir`` too where it is
        given)."""
        env = dataset_env(dataset, "generator=rollouts")
        if config.true_dynamics:
            if model_path is not None:
                raise ConfigError("generator.true_dynamics=true rolls out in the simulator; leave dynamics_path unset.")
            dynamics = TrueDynamics(env.name)
        else:
            data, mean, std = (standardised_dataset(dataset, config.observation_std_eps)
                               if config.standardise_observations else (dataset, None, None))
            if model_path is not None:  # with standardise_observations: a model fitted on the standardised data
                dynamics = GaussianEnsembleDynamics.load(model_path, map_location=device)
            else:
                dynamics, _ = load_or_fit_dynamics(data, config.dynamics, cache_dir, device, progress)
            if config.rollout.halt == "usad" and dynamics.config.ensemble_size < 2:
                raise ConfigError(f"generator.rollout.halt=usad thresholds the disagreement between ensemble members, and "
                                  f"the model in {model_path} has one member; give a model of several members or set "
                                  f"generator.rollout.halt=none.")
            if config.standardise_observations:
                dynamics = StandardisedDynamics(dynamics, torch.as_tensor(mean), torch.as_tensor(std))
        refiner = None
        if config.rollout.refiner.enabled:  # it refines raw-unit transitions, as the rollouts store them
            refiner, _ = load_or_fit_refiner(dataset, config.rollout.refiner, cache_dir, device, progress)
        return cls(dynamics.to(torch.device(device)), env.termination_fn, config, refiner)

    def generate(self, policy: Policy, real: dict[str, torch.Tensor], rng: Optional[torch.Generator] = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        check_policy(self, policy)  # branched rollouts step a feed-forward policy
        return self.rollouts.generate(policy, real, rng)

    def refit(self, dataset, progress: bool = False) -> dict[str, float]:
        """MBPO's model training during interaction (Janner et al. 2019; jannerm/mbpo, ``mbpo/algorithms/mbpo.py``:
        every ``model_train_freq`` = 250 env steps, ``_train_model(max_epochs=None, holdout_ratio=0.2)``, and
        ``mbpo/models/bnn.py``: ``max_epochs_since_update`` = 5, from the current weights): the model
        the rollouts step is trained further on ``dataset`` (online fine-tuning's real rows: the offline
        data and the online rows so far) by its own `fit`, in place: from its current weights, with the
        input (and output) statistics recomputed on the rows, a fresh holdout, early stopping by
        ``dynamics.patience`` with no minimum of epochs (MBPO's ``max_epochs_since_update``; a recipe's
        ``min_epochs`` is for a fit from scratch) and the elites chosen again. With
        ``standardise_observations`` the model keeps the offline data's statistics (the agent of RAMBO
        reads them too). With adversarial training it is the adversarially trained copy that is refitted.
        The refiner and MOReL's halt threshold: the refiner stays as fitted; the threshold is set again
        from the real rows at the next generation. Returns ``refits`` (so far) and this refit's
        ``epochs``, ``rows`` and ``holdout_mse`` (the elites' mean)."""
        model = self.rollouts.dynamics
        if isinstance(model, TrueDynamics):
            raise ConfigError("refit: this generator rolls out in the simulator, which has no model to refit.")
        if isinstance(model, StandardisedDynamics):  # the statistics it was built with
            dataset, _, _ = standardised_dataset(dataset, statistics=(model.obs_mean.cpu().numpy(),
                                                                      model.obs_std.cpu().numpy()))
            model = model.inner
        log = model.fit(dataset, model.elites.device, progress=progress, min_epochs=0)
        self.rollouts.threshold = None  # MOReL's halt threshold: from the refitted model at the next generation
        self.refits += 1
        best = torch.as_tensor(log[-1]["best_holdout_mse"])[model.elites.cpu()]
        return {"refits": float(self.refits), "epochs": float(len(log)), "rows": float(len(dataset.rewards)),
                "holdout_mse": float(best.mean())}

    @property
    def model(self):
        """The dynamics model as fitted or loaded (the ensemble, or the simulator), which the checkpoint
        knows by the fingerprint it had when the run was built; `refit` trains it further and the
        adversarial phases train a copy of it (`state_dict` holds what they change)."""
        return self.fitted

    def state_dict(self) -> dict:
        """What the model the run was built with does not give back: MOReL's halt threshold once set
        (it was set from the real rows of that time, and online rows may have come since); after a
        `refit`, the refit count and the refitted weights; with adversarial training, the trained
        copy's weights and its optimiser. Plain rollouts keep nothing else between generations."""
        state = {}
        if self.rollouts.threshold is not None:
            state["threshold"] = self.rollouts.threshold
        if self.refits:  # the weights once: with adversarial training they are the adversary's copy's
            state["refit"] = {"refits": self.refits}
            if self.adversary is None:
                state["refit"]["model"] = self.rollouts.dynamics.state_dict()
        if self.adversary is not None:
            state["adversary"] = self.adversary.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.adversary is not None:
            self.adversary.load_state_dict(state["adversary"])
        elif "adversary" in state:  # a run that trained its model adversarially, continued without (penalty=off)
            self.rollouts.dynamics.load_state_dict(state["adversary"]["model"])
        if "refit" in state:
            self.refits = int(state["refit"]["refits"])
            if "model" in state["refit"]:
                self.rollouts.dynamics.load_state_dict(state["refit"]["model"])
        self.rollouts.threshold = state.get("threshold")


__all__ = ["AdversarialConfig", "BranchedRollouts", "RolloutConfig", "RolloutGenerator", "RolloutGeneratorConfig",
           "StandardisedDynamics", "adversarial_step", "episode_starts", "mixture_log_prob", "normalised_advantage",
           "usad_threshold"]
