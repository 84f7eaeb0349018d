"""Posterior rollouts (NEUBAY; Ni et al. 2025): ``generator=posterior``, which produces **sequences**.

Written from the official JAX code (twni2016/neubay: ``experience/collector.py::ContCollector``,
``offline_world/cont_ensemble.py::LearnedContEnv.{load_model_and_data,reset,step}``,
``experience/world_buffer.py::{get_history_dataset,HistorySampler}``).

**Histories** (`Histories`). The dataset's episodes cut at the env's horizon (rows beyond it are
dropped; the cut row gets ``timeouts`` unless it is terminal). A history is drawn uniformly over all
positions t = 0..L of all episodes, the position L after the last row included: there the episode is
finished, and the rollout is the real episode alone ("pure history"). With ``start_from_s0`` every
history starts at t = 0 of a uniformly drawn episode.

**Rollouts** (`PosteriorRollouts.generate`), ``parallel`` (P) at a time:

* warm-up: a recurrent policy reads the whole real prefix, inputs ``[s_k, a_{k-1}, r_{k-1}]`` for
  k = 0..t (zeros for the previous action and reward at k = 0; `history_inputs`), from its initial
  state; its last output is the first action a_t, its state carries on;
* rollout i uses elite ``elites[i·E // P]`` for its whole length (P a multiple of E: with P = E each
  elite drives one rollout), one posterior sample per step
  (`mbrl_offline.models.dynamics.GaussianEnsembleDynamics.posterior_step`); U, the spread of all
  elites' means on (s_t, a_t), comes from the same forward;
* a rollout ends at the first of: the env's termination function says the next state is terminal
  (``terminals``); U > Ū (strictly; ``timeouts``); the clock, continuing from t, reaches the env's
  horizon (``timeouts``); ``max_rollout_len`` steps (``timeouts``). The row that ends it is kept.
  Ū = ``dynamics.uncertainty_threshold(quantile)`` over the model's fitting rows (ζ = 1: their max);
  ``quantile < 0`` never truncates on U. Truncated rows bootstrap (the agent reads only terminals);
* the stored reward is ``r - (penalty_coef / Ū_mean)·U`` (Ū_mean: the fitting rows' mean U); the next
  policy input, and the extra field ``observed_rewards``, carry the raw model reward r.

**Rows** are sequence rows (`mbrl_offline.roles`): one episode per rollout,
the real prefix (t rows, copied from the data: ``synthetic`` False, ``member`` -1, ``uncertainty``
NaN, ``observed_rewards`` = the data's rewards) followed by the imagined continuation (H rows:
``synthetic`` True, the member, U, the raw reward), with ``starts`` True at each episode's first row.
``transitions`` in the statistics is Σ(t_i + H_i): the trainer's update-to-data ratio counts the
real prefix rows too, as the official ``data_size`` does.

Deviations from the official code, and why:

* no dummy row is appended: `mbrl_offline.buffer.SequenceBuffer.tape` appends each episode's final
  observation row itself; rows are the library's transitions (s, a, r, s', flags), from which the
  agent builds the official augmented inputs [s, a_prev, r_prev];
* the warm-up pads its inputs on the left only to the longest sampled prefix, not to the dataset's
  longest episode (pads are zeros with ``starts`` set, so the outputs are the same); pure histories
  and finished rollouts leave the batch (active-row compaction), which changes only how the random
  streams are used, not the distributions;
* a row ending in both a terminal and a truncation is stored as terminal only (``timeouts`` is
  ``truncated & ~terminals``: the library's flags are exclusive; the agent reads terminals alone, as
  the official's does);
* the termination functions read the next state only (`mbrl_offline.data.termination`);
* a transition whose predicted next state or reward is not finite is dropped and its rollout ends
  there (its last kept row gets ``timeouts``); an episode left with no rows is left out. The
  official code has no such case handling (none expected with bounded log-stds);
* the histories come from the dataset the generator was built for; ``real`` is unused.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import check_field_types, require_in_range, require_nonnegative, require_positive
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.data.termination import TerminationFn
from mbrl_offline.errors import ConfigError
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, load_or_fit_dynamics
from mbrl_offline.models.fitting import check_dynamics_rows, check_fit_rows
from mbrl_offline.models.refiner import DynamicsRefiner, RefinerConfig, load_or_fit_refiner
from mbrl_offline.policies import history_inputs
from mbrl_offline.registry import register_generator
from mbrl_offline.roles import GeneratorConfig, Policy

# The fields each generated row carries besides the transition's (`mbrl_offline.buffer.transition_schema`).
POSTERIOR_EXTRA_FIELDS = {"synthetic": ((), torch.bool), "member": ((), torch.long),
                          "uncertainty": ((), torch.float32), "observed_rewards": ((), torch.float32)}


@dataclass
class PosteriorConfig:
    parallel: int = 100  # P: rollouts per generation; a multiple of the model's elites (official 100 = N)
    # zeta: the uncertainty threshold is this quantile of U over the model's fitting rows (1.0: their
    # max); below 0: no uncertainty truncation.
    quantile: float = 1.0
    penalty_coef: float = 0.0  # lambda: stored reward r - lambda / mean(U over the data) * U (official 0)
    max_rollout_len: int = -1  # model steps per rollout at most; -1: the env's horizon
    start_from_s0: bool = False  # histories start at t = 0 only (official default: any position)
    deterministic_actions: bool = False  # the policy's mode instead of a sample (needs sample(deterministic=))
    # A PDE-Refiner for each model step's sample (`mbrl_offline.models.refiner`; off unless refiner.enabled).
    # Truncation and the penalty keep reading the ensemble's U; the refiner's spread is not used here.
    refiner: RefinerConfig = field(default_factory=RefinerConfig)

    def __post_init__(self):
        check_field_types(self, "posterior")  # types first; nested mappings become configs
        require_positive(self, "parallel", section="posterior")
        require_in_range(self, "quantile", high=1.0, section="posterior", hint=" (below 0: no truncation)")
        require_nonnegative(self, "penalty_coef", section="posterior")
        if not isinstance(self.max_rollout_len, int) or isinstance(self.max_rollout_len, bool) or \
                not (self.max_rollout_len == -1 or self.max_rollout_len >= 1):
            raise ConfigError(f"posterior.max_rollout_len must be -1 (the env's horizon) or at least 1, got "
                              f"{self.max_rollout_len!r}.")


def _neubay_dynamics() -> DynamicsConfig:
    """The official posterior's recipe (``DYNAMICS_RECIPES["neubay"]`` of `mbrl_offline.models.dynamics`)."""
    from mbrl_offline.models.dynamics import dynamics_recipe

    return dynamics_recipe("neubay")


@dataclass
class PosteriorGeneratorConfig(GeneratorConfig):
    """``generator=posterior``: NEUBAY's posterior rollouts, their ensemble, schedule and mixing."""

    kind: str = "posterior"
    # Generations are scheduled by ``utd``: after one that produced n transitions (real prefixes
    # included) the next comes ceil(utd * n) updates later (official 0.05). ``every`` > 0 with
    # ``utd`` unset (null) schedules every that many updates instead; 0 with no utd: once, at the start.
    every: int = 0
    utd: Optional[float] = 0.05
    posterior: PosteriorConfig = field(default_factory=PosteriorConfig)  # the rollouts' settings
    dynamics: DynamicsConfig = field(default_factory=_neubay_dynamics)  # the posterior ensemble's settings
    buffer_rows: int = 40_000_000  # the synthetic sequence buffer's rows (oldest episodes go first)
    # Tapes of whole episodes, the loss weighted kappa on real rows (official real_weight 0.05).
    mixing: MixingConfig = field(default_factory=lambda: MixingConfig(rule="tape", kappa=0.05))

    def __post_init__(self):
        super().__post_init__()  # kind, schedule and mixing (`mbrl_offline.roles.GeneratorConfig`)
        require_positive(self, "buffer_rows", section="generator")

    def fitted_model(self) -> Optional[str]:
        """The posterior ensemble is fitted into the dynamics cache."""
        return "dynamics"

    def check_dataset(self, dataset, model_path=None) -> None:
        """Enough rows for the ensemble's holdout and batches (`mbrl_offline.models.fitting.check_fit_rows`)."""
        if model_path is None:
            check_dynamics_rows(dataset, self.dynamics)
        refiner = self.posterior.refiner
        if refiner.enabled:
            check_fit_rows(len(dataset), refiner.holdout_ratio, None, refiner.batch_size,
                           f"the dataset ({dataset.source}) for generator.posterior.refiner")

    def check_agent(self, agent, algo_config) -> None:
        """The checks of these settings with the agent's (`mbrl_offline.compose.check_pair`), made before
        the ensemble is fitted: ``dynamics.record_uncertainty`` set (the truncation needs it), ``posterior.parallel`` a multiple of ``dynamics.num_elites`` (each elite
        drives parallel / elites rollouts), and ``posterior.deterministic_actions`` only for an agent whose
        policy can give its mode (``deterministic_sampling``: its ``sample()`` takes ``deterministic=``)."""
        if not self.dynamics.record_uncertainty:
            raise ConfigError("the posterior truncates rollouts by the model's data uncertainty, so it needs "
                              "generator.dynamics.record_uncertainty=true (the 'neubay' recipe sets it).")
        elites = self.dynamics.num_elites
        if self.posterior.parallel % elites:
            raise ConfigError(f"posterior.parallel ({self.posterior.parallel}) must be a multiple of the model's "
                              f"elites (generator.dynamics.num_elites = {elites}): each elite drives parallel / "
                              f"elites rollouts; e.g. posterior.parallel={max(1, self.posterior.parallel // elites) * elites}.")
        if self.posterior.deterministic_actions and not getattr(agent, "deterministic_sampling", False):
            raise ConfigError(f"posterior.deterministic_actions=true needs a policy whose sample() takes "
                              f"deterministic=, and {getattr(agent, 'name', type(agent).__name__)}'s does not; "
                              f"set generator.posterior.deterministic_actions=false.")


class Histories:
    """The dataset's episodes cut at ``horizon`` rows, as flat tensors on ``device`` (see the module
    docstring): ``first`` (E,) and ``lengths`` (E,) locate episode e's rows in the transition fields."""

    def __init__(self, dataset, horizon: int, device: str | torch.device = "cpu"):
        if horizon < 1:
            raise ConfigError(f"the env's horizon must be at least 1 step, got {horizon}.")
        self.horizon, self.device = horizon, torch.device(device)
        parts = [np.arange(part.start, min(part.stop, part.start + horizon)) for part in dataset.episode_slices()]
        index = np.concatenate(parts)
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        terminals, timeouts = dataset.terminals[index].copy(), dataset.timeouts[index].copy()
        last = np.cumsum(lengths) - 1
        timeouts[last] |= ~terminals[last]  # a cut row ends its episode without terminating

        def tensor(values):
            return torch.as_tensor(np.ascontiguousarray(values), device=self.device)

        self.observations, self.actions = tensor(dataset.observations[index]), tensor(dataset.actions[index])
        self.rewards, self.next_observations = tensor(dataset.rewards[index]), tensor(dataset.next_observations[index])
        self.terminals, self.timeouts = tensor(terminals), tensor(timeouts)
        self.lengths = tensor(lengths)
        self.first = torch.cumsum(self.lengths, 0) - self.lengths
        # episode e owns the history positions [positions[e] - L_e - 1, positions[e]) (t = 0..L_e)
        self.positions = torch.cumsum(self.lengths + 1, 0)
        self.num_positions = int(lengths.sum() + len(lengths))
        self.max_length = int(lengths.max())

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    def sample(self, count: int, generator: Optional[torch.Generator] = None, start_from_s0: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(episodes (count,), t (count,))``: positions uniform over all Σ(L_e + 1) of them (t = L_e:
        the whole episode), or t = 0 of uniformly drawn episodes with ``start_from_s0``."""
        if start_from_s0:
            episodes = torch.randint(0, self.num_episodes, (count,), device=self.device, generator=generator)
            return episodes, torch.zeros_like(episodes)
        position = torch.randint(0, self.num_positions, (count,), device=self.device, generator=generator)
        episodes = torch.searchsorted(self.positions, position, right=True)
        return episodes, position - (self.positions[episodes] - self.lengths[episodes] - 1)

    def observations_at(self, episodes: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """s_t of each history: the data's observation at row t, or the last next observation at t = L."""
        lengths, first = self.lengths[episodes], self.first[episodes]
        inside = self.observations[first + torch.minimum(t, lengths - 1)]
        return torch.where((t < lengths).unsqueeze(-1), inside, self.next_observations[first + lengths - 1])

    def warmup_inputs(self, episodes: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefixes 0..t as recurrent inputs ``(B, T, S + A + 1)`` and ``starts`` ``(B, T)``, padded
        on the left to T = max(t) + 1 with zero rows that start."""
        steps = int(t.max()) + 1
        k = torch.arange(steps, device=self.device) - (steps - 1 - t).unsqueeze(1)  # (B, T): history step, < 0 pads
        pad = k < 0
        k = k.clamp(min=0)
        rows = episodes.unsqueeze(1).expand_as(k)
        obs = self.observations_at(rows.reshape(-1), k.reshape(-1)).reshape(*k.shape, -1)
        obs = torch.where(pad.unsqueeze(-1), torch.zeros((), device=self.device), obs)
        previous = self.first[rows] + (k - 1).clamp(min=0)
        starts = pad | (k == 0)
        act_dim = self.actions.shape[-1]
        inputs = history_inputs(obs.reshape(-1, obs.shape[-1]), self.actions[previous].reshape(-1, act_dim),
                                self.rewards[previous].reshape(-1), starts.reshape(-1))
        return inputs.reshape(*k.shape, -1), starts


def _select_state(state: Any, index: torch.Tensor) -> Any:
    """A recurrent state (None, a tensor, or lists/tuples of them, batch first) at rows ``index``."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state[index]
    if isinstance(state, (list, tuple)):
        return type(state)(_select_state(s, index) for s in state)
    raise TypeError(f"a recurrent state must be tensors with the batch first (or lists of them), got {type(state)}")


class PosteriorRollouts:
    """NEUBAY's rollouts (module docstring) of a policy in a posterior ensemble, from dataset histories."""

    produces = "sequences"

    def __init__(self, dynamics, termination_fn: TerminationFn, histories: Histories,
                 config: PosteriorConfig = PosteriorConfig(), refiner: Optional[DynamicsRefiner] = None):
        self.dynamics, self.termination_fn, self.histories, self.config = dynamics, termination_fn, histories, config
        if config.refiner.enabled and refiner is None:
            raise ConfigError("posterior.refiner.enabled is set and no refiner was given; pass a fitted "
                              "DynamicsRefiner (load_or_fit_refiner), or set posterior.refiner.enabled=false.")
        self.refiner = refiner if config.refiner.enabled else None
        elites = len(dynamics.elites)
        if config.parallel % elites:
            raise ConfigError(f"posterior.parallel ({config.parallel}) must be a multiple of the model's elites "
                              f"({elites}): each elite drives parallel / elites rollouts.")
        self.refresh_thresholds()

    def refresh_thresholds(self) -> None:
        """Ū and Ū_mean from the model's data uncertainties."""
        cfg = self.config
        self.threshold = float(self.dynamics.uncertainty_threshold(cfg.quantile)) if cfg.quantile >= 0 else math.inf
        self.penalty_scale = 0.0
        if cfg.penalty_coef > 0:
            self.penalty_scale = cfg.penalty_coef / float(self.dynamics.uncertainty_mean())

    @property
    def max_rollout_len(self) -> int:
        return self.config.max_rollout_len if self.config.max_rollout_len > 0 else self.histories.horizon

    def _sampler(self, policy: Policy):
        """``act(observations, state, starts) -> (actions, state)`` for ``policy`` and the config."""
        kwargs = {}
        if self.config.deterministic_actions:
            if "deterministic" not in inspect.signature(policy.sample).parameters:
                raise ConfigError("posterior.deterministic_actions=true needs a policy whose sample() takes "
                                  "deterministic=; set it to false.")
            kwargs["deterministic"] = True
        if policy.recurrent:
            return lambda obs, state, starts: policy.sample(obs, state=state, starts=starts, **kwargs)
        return lambda obs, state, starts: policy.sample(obs, **kwargs)

    @torch.no_grad()
    def generate(self, policy: Policy, real: Optional[dict[str, torch.Tensor]] = None,
                 generator: Optional[torch.Generator] = None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """``parallel`` episodes of a real prefix and its imagined continuation, as sequence rows (every
        transition field, `POSTERIOR_EXTRA_FIELDS` and ``starts``, on the device), and statistics.
        ``policy``: recurrent (NEUBAY: warmed up on each prefix) or feed-forward (a Markov ablation: it
        acts on s_t alone)."""
        cfg, hist = self.config, self.histories
        device, count = hist.device, cfg.parallel
        act = self._sampler(policy)
        episodes, t = hist.sample(count, generator, cfg.start_from_s0)
        elites = self.dynamics.elites.to(device)
        members = elites[torch.arange(count, device=device) * len(elites) // count]
        finished = t >= hist.lengths[episodes]  # pure histories: the whole episode, nothing imagined

        ids = torch.nonzero(~finished).squeeze(1)  # the rollouts still running, by index
        steps: list[dict[str, torch.Tensor]] = []
        if len(ids):
            obs = hist.observations_at(episodes[ids], t[ids])
            if policy.recurrent:
                inputs, starts = hist.warmup_inputs(episodes[ids], t[ids])
                actions, state = act(inputs, policy.initial_state(len(ids)), starts)
            else:
                actions, state = act(obs, None, None)
            clock = t[ids]
            for k in range(self.max_rollout_len):
                model = self.dynamics.posterior_step(obs, actions, members[ids], generator)
                if self.refiner is not None:  # refine the member's sample (step 0); U stays the ensemble's
                    model.update(self.refiner.refine(obs, actions, model["next_observations"], model["rewards"],
                                                     generator, samples=1))
                next_obs, raw, unc = model["next_observations"], model["rewards"], model["uncertainty"]
                finite = torch.isfinite(next_obs).all(-1) & torch.isfinite(raw)
                terminal = self.termination_fn(next_obs) & finite
                clock = clock + 1
                over = unc > self.threshold
                time_limit = (clock >= hist.horizon) | (k == self.max_rollout_len - 1)
                truncated = (over | time_limit) & ~terminal
                going = finite & ~terminal & ~truncated
                rewards = raw - self.penalty_scale * unc if self.penalty_scale else raw
                steps.append({"rollout": ids, "step": torch.full_like(ids, k), "observations": obs, "actions": actions,
                              "rewards": rewards, "next_observations": next_obs, "terminals": terminal,
                              "timeouts": truncated, "member": model["member"], "uncertainty": unc,
                              "observed_rewards": raw, "kept": finite, "ended": ~going, "over": over,
                              "time_limit": time_limit})
                alive = torch.nonzero(going).squeeze(1)
                if len(alive) == 0:
                    break
                ids, obs, clock, state = ids[alive], next_obs[alive], clock[alive], _select_state(state, alive)
                if policy.recurrent:
                    no_start = torch.zeros(len(alive), dtype=torch.bool, device=device)
                    inputs = history_inputs(obs, actions[alive], raw[alive], no_start)
                    actions, state = act(inputs, state, no_start)
                else:
                    actions, state = act(obs, None, None)
        return self._rows(episodes, t, steps, count)

    def _rows(self, episodes: torch.Tensor, t: torch.Tensor, steps: list[dict[str, torch.Tensor]], count: int
              ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The sequence rows of the prefixes and the recorded imagined steps, and the statistics."""
        hist, device = self.histories, self.histories.device
        imagined = {key: torch.cat([s[key] for s in steps]) for key in steps[0]} if steps else None
        if imagined is not None:
            ended = imagined["ended"] & imagined["kept"]  # the row that ended each rollout (if finite)
            end = {key: imagined[key][ended] for key in ("terminals", "timeouts", "over", "time_limit")}
            nonfinite = (~imagined["kept"]).sum()
            imagined = {key: value[imagined["kept"]] for key, value in imagined.items()}
            horizons = torch.bincount(imagined["rollout"], minlength=count)
        else:
            horizons = torch.zeros(count, dtype=torch.long, device=device)
        lengths = t + horizons
        offsets = torch.cumsum(lengths, 0) - lengths
        total = int(lengths.sum())
        obs_dim, act_dim = hist.observations.shape[1], hist.actions.shape[1]
        rows = {"observations": torch.zeros(total, obs_dim, device=device),
                "actions": torch.zeros(total, act_dim, device=device),
                "rewards": torch.zeros(total, device=device),
                "next_observations": torch.zeros(total, obs_dim, device=device),
                "terminals": torch.zeros(total, dtype=torch.bool, device=device),
                "timeouts": torch.zeros(total, dtype=torch.bool, device=device),
                "synthetic": torch.zeros(total, dtype=torch.bool, device=device),
                "member": torch.full((total,), -1, dtype=torch.long, device=device),
                "uncertainty": torch.full((total,), float("nan"), device=device),
                "observed_rewards": torch.zeros(total, device=device)}
        # the real prefixes: rows 0..t-1 of each history's episode
        owner = torch.repeat_interleave(torch.arange(count, device=device), t)
        within = torch.arange(len(owner), device=device) - (torch.cumsum(t, 0) - t)[owner]
        source, target = hist.first[episodes[owner]] + within, offsets[owner] + within
        for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
            rows[key][target] = getattr(hist, key)[source]
        rows["observed_rewards"][target] = hist.rewards[source]
        if imagined is not None:  # the imagined continuations after them
            owner = imagined["rollout"]
            target = offsets[owner] + t[owner] + imagined["step"]
            for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts",
                        "member", "uncertainty", "observed_rewards"):
                rows[key][target] = imagined[key].to(rows[key].dtype)
            rows["synthetic"][target] = True
        nonempty = lengths > 0
        last = (offsets + lengths - 1)[nonempty]
        rows["timeouts"][last] |= ~rows["terminals"][last]  # every episode ends done (a dropped row cuts it)
        rows["starts"] = torch.zeros(total, dtype=torch.bool, device=device)
        rows["starts"][offsets[nonempty]] = True

        returns = torch.zeros(count, device=device).index_add_(
            0, torch.repeat_interleave(torch.arange(count, device=device), lengths), rows["rewards"])
        h = horizons.float()
        q25, q50, q75 = torch.quantile(h, torch.tensor([0.25, 0.5, 0.75], device=device)).tolist()
        n_imagined = int(horizons.sum())
        stats = {"transitions": float(total), "rollout_transitions": float(n_imagined),
                 "prefix_mean": t.float().mean().item(), "horizon_mean": h.mean().item(),
                 "horizon_q25": q25, "horizon_q50": q50, "horizon_q75": q75, "horizon_max": h.max().item(),
                 "finished_history_fraction": (t >= hist.lengths[episodes]).float().mean().item(),
                 "return_mean": returns.mean().item(), "threshold": self.threshold}
        if imagined is not None:
            terminal = end["terminals"]
            stats.update({
                "terminated_fraction": terminal.sum().item() / count,
                "truncated_fraction": end["timeouts"].sum().item() / count,
                "uncertainty_truncated_fraction": (end["over"] & ~terminal).sum().item() / count,
                "time_limit_fraction": (end["time_limit"] & ~terminal).sum().item() / count,
                "nonfinite_fraction": nonfinite.item() / count})
        else:
            stats.update({key: 0.0 for key in ("terminated_fraction", "truncated_fraction", "nonfinite_fraction",
                                               "uncertainty_truncated_fraction", "time_limit_fraction")})
        if n_imagined:
            used = torch.bincount(imagined["member"] - imagined["member"].min())
            stats.update({"uncertainty_mean": imagined["uncertainty"].mean().item(),
                          "members_used": float((used > 0).sum().item()),
                          "member_share_max": used.max().item() / n_imagined})
        else:
            stats.update({"uncertainty_mean": float("nan"), "members_used": 0.0, "member_share_max": float("nan")})
        return rows, stats


def env_horizon(env) -> int:
    """The env's time limit in steps (`mbrl_offline.data.envs.EnvInfo.max_episode_steps`)."""
    horizon = getattr(env, "max_episode_steps", None)
    if horizon is None:
        raise ConfigError(f"env '{env.name}' declares no max_episode_steps; posterior rollouts need its horizon.")
    return int(horizon)


@register_generator
class PosteriorGenerator:
    """The posterior generator of a run: `PosteriorRollouts` in a posterior ensemble, with the settings
    of a `PosteriorGeneratorConfig` (schedule and mixing are read by the trainer)."""

    # what it gives, for the docs' tables
    summary = ("NEUBAY's: whole episodes, a real prefix then rollouts in a posterior over world models, for a "
               "recurrent agent")
    config_class = PosteriorGeneratorConfig
    produces = "sequences"
    recurrent_policy = True  # warms a recurrent policy up on each real prefix; a feed-forward one works too
    provides_dynamics = True  # its ensemble

    def __init__(self, dynamics, termination_fn: TerminationFn, histories: Histories,
                 config: PosteriorGeneratorConfig = None, refiner: Optional[DynamicsRefiner] = None):
        self.config = config if config is not None else PosteriorGeneratorConfig()
        self.rollouts = PosteriorRollouts(dynamics, termination_fn, histories, self.config.posterior, refiner)

    @property
    def dynamics(self):
        return self.rollouts.dynamics

    @property
    def buffer_capacity(self) -> int:
        return self.config.buffer_rows

    @property
    def extra_fields(self) -> dict:
        return dict(POSTERIOR_EXTRA_FIELDS)

    @classmethod
    def for_dataset(cls, config: PosteriorGeneratorConfig, dataset, device: str | torch.device = "cpu",
                    cache_dir: Optional[str | Path] = None, model_path: Optional[str | Path] = None,
                    progress: bool = True) -> "PosteriorGenerator":
        """The generator for ``dataset``: the ensemble from ``model_path``, or from the cache (fitted on
        ``dataset`` with ``config.dynamics`` the first time), and the dataset's histories cut at the
        env's horizon; with ``posterior.refiner.enabled`` also the refiner (`load_or_fit_refiner`, in
        ``cache_dir`` too where it is given)."""
        env = dataset_env(dataset, "generator=posterior")
        histories = Histories(dataset, env_horizon(env), device)  # an env without a horizon fails before the fit
        if model_path is not None:
            dynamics = GaussianEnsembleDynamics.load(model_path, map_location=device)
        else:
            dynamics, _ = load_or_fit_dynamics(dataset, config.dynamics, cache_dir, device, progress)
        refiner = None
        if config.posterior.refiner.enabled:
            refiner, _ = load_or_fit_refiner(dataset, config.posterior.refiner, cache_dir, device, progress)
        return cls(dynamics.to(torch.device(device)), env.termination_fn, histories, config, refiner)

    def generate(self, policy: Policy, real: Optional[dict[str, torch.Tensor]] = None,
                 rng: Optional[torch.Generator] = None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        return self.rollouts.generate(policy, real, rng)

    @property
    def model(self):
        """The posterior ensemble, which the checkpoint knows by fingerprint."""
        return self.rollouts.dynamics

    def state_dict(self) -> dict:
        """Nothing besides the model: the rollouts keep no state between collections."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


__all__ = ["PosteriorConfig", "PosteriorGenerator", "PosteriorGeneratorConfig"]
