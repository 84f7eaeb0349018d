"""The contract of the spine, written as code: what `mbrl_offline.trainer.Trainer` needs from an agent,
a policy, a generator and a mixing rule (the instance protocols `Agent`, `Policy`, `EpisodePolicy`,
`Generator`, `Mixing`), what the registries need from an agent class and a generator class (the class
protocols `AgentClass` and `GeneratorClass`), and the settings every generator has (`GeneratorConfig`).

The trainer composes them: it asks the *generator* (if there is one) for synthetic data from the
agent's *policy* on its schedule, draws each batch from the real and the synthetic buffer with the
*mixing* rule, and hands it to the *agent*. Any agent meets any generator this way; nothing in the
trainer names an algorithm, and `mbrl_offline.compose.check_pair` is the one place that judges whether
an agent and a generator fit together, from their classes' declarations alone.

A family is added by one module: a class meeting `AgentClass` (or `GeneratorClass`) registered with
`mbrl_offline.registry.register_agent` (or ``register_generator``), which checks the class members at
registration. ``tests/test_agent_contract.py`` runs the behavioural contract over every registered agent
and generator, a user's own included (`mbrl_offline.registry`, ``docs/contributing.md``).

Agents learn from transitions or from sequences (``consumes``), and generators produce one or the
other (``produces``); the trainer keeps each in the buffer that fits (`mbrl_offline.buffer`). A
recurrent policy (NEUBAY's) reads `mbrl_offline.policies.history_inputs` and carries a state;
evaluation goes through the agent's `EpisodePolicy`, which carries that state through each real
episode. Helpers that are not protocols (feed-forward agents' common parts, `FunctionPolicy`, ...) are in
`mbrl_offline.policies`.

The protocols are ``runtime_checkable``: ``isinstance(x, Agent)`` checks that the members exist (not
their signatures); the type checker and the registration checks do the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
import torch

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import check_field_types, require_in_range
from mbrl_offline.errors import ConfigError

Batch = dict[str, torch.Tensor]


SEQUENCE_KINDS = ("transitions", "sequences")  # what an agent ``consumes`` and a generator ``produces``


@runtime_checkable
class Policy(Protocol):
    """What a generator may ask of the policy it generates for.

    ``sample`` gives actions for observations (stochastic where the policy is); ``log_prob`` is
    log pi(a|s) of given actions, differentiable in the actions, which guided generation (policy-guided
    diffusion) follows. Observations and actions are tensors on the agent's device, in the env's units.

    A feed-forward policy (``recurrent`` False) reads observations ``(B, obs_dim)`` (``input_dim`` =
    obs_dim), keeps no state (``initial_state`` and the returned state are ``None``) and ignores
    ``starts``. A recurrent policy (NEUBAY's) reads `mbrl_offline.policies.history_inputs` rows ``(B, input_dim)`` with
    ``input_dim`` = obs_dim + act_dim + 1, one step, or a whole history ``(B, T, input_dim)``; ``starts``
    ``(B,)`` or ``(B, T)`` marks the rows where an episode starts (the state is reset there); ``state``
    is the one carried in (``initial_state(B)`` for a fresh rollout; None means that too), and
    ``sample`` returns the actions at the last step with the state after it.
    """

    recurrent: bool  # whether ``sample`` carries a state from step to step
    input_dim: int  # the width of one input row: obs_dim (feed-forward) or obs_dim + act_dim + 1 (recurrent)

    def initial_state(self, batch_size: int) -> Any:
        """The state a rollout starts from (``None`` for a feed-forward policy)."""
        ...

    def sample(self, observations: torch.Tensor, state: Any = None,
               starts: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Any]:
        """``(actions (B, act_dim), next state)`` for inputs ``(B, input_dim)`` (or ``(B, T, input_dim)``
        for a recurrent policy: the actions of the last step)."""
        ...

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state: Any = None,
                 starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """log pi(a|s) ``(B,)``, differentiable in ``actions`` (a recurrent policy: of the last step's
        action given the inputs, as ``sample``)."""
        ...


@runtime_checkable
class ValueFunction(Protocol):
    """What a generator whose model learns from the agent (RAMBO's adversarial model training,
    `mbrl_offline.generators.rollouts.AdversarialConfig`) asks of the agent's value estimates: an agent
    whose class declares ``provides_value`` True is its own value function. Observations and actions are
    tensors on the agent's device in the env's units (raw observations: an agent that standardises them
    does so inside); nothing here builds a graph (the calls run under ``torch.no_grad``).

    ``mode`` is the policy's deterministic action (the mean or mode, as evaluation acts); ``q_value`` the
    agent's pessimistic estimate of Q(s, a) ``(B,)``: the min over its critics, in the env's reward
    units (an agent that scales rewards divides its estimate back); ``discount`` its gamma."""

    discount: float

    def mode(self, observations: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``(B, act_dim)`` for observations ``(B, obs_dim)``."""
        ...

    def q_value(self, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """min over the critics of Q(s, a), ``(B,)``, in the env's reward units."""
        ...


@runtime_checkable
class EpisodePolicy(Protocol):
    """A policy acting in real episodes (evaluation, `mbrl_offline.evaluation.evaluate_policy`): numpy in,
    numpy out, and whatever state it needs kept per episode.

    ``reset(episodes)`` starts ``episodes`` episodes; each call then gives the actions ``(n, act_dim)``
    for the ``n`` running episodes ``rows`` ``(n,)`` (their indices below ``episodes``), from their
    observations ``(n, obs_dim)``, the rewards received on the previous step ``(n,)`` (0 at a start)
    and ``starts`` ``(n,)`` (True on an episode's first step). A recurrent policy updates only the
    states of ``rows``; a feed-forward one acts on the observations alone."""

    def reset(self, episodes: int) -> None:
        ...

    def __call__(self, observations: np.ndarray, rewards: np.ndarray, starts: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
        ...


@runtime_checkable
class Agent(Protocol):
    """A learner: the trainer calls ``update`` on each batch, evaluates ``episode_policy(True)`` in the
    env, hands ``policy`` to the generator, and saves ``state_dict`` in checkpoints.

    Also expected: ``name`` (the registry's), ``config`` (a dataclass with ``batch_size``: rows per
    batch, or the tape's length for an agent of sequences), ``device`` and ``consumes`` (in
    `SEQUENCE_KINDS`; read with "transitions" as its default); where its class declares
    ``provides_value`` True, the value role (`ValueFunction`: ``mode``, ``q_value``, ``discount``), which
    the trainer hands to a generator's ``adapt``; optionally ``on_epoch_end(epoch,
    total_epochs)`` for per-epoch schedules, ``deterministic_sampling`` (True where its policy's ``sample()``
    takes ``deterministic=``; read as False) and ``set_total_updates(total)``, which the trainer calls
    once, when it is built, with the run's number of updates (for schedules over updates). An agent of
    transitions gets batches of the transition fields plus a bool ``synthetic`` column marking
    generated rows; an agent of sequences gets tapes (`mbrl_offline.buffer.SequenceBuffer.tape`) with
    per-row loss ``weights`` (`mbrl_offline.buffer.Mixing`'s ``tape`` rule).
    """

    name: str
    config: Any
    device: torch.device

    @property
    def policy(self) -> Policy:
        """The policy generators roll out."""
        ...

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One learning step; metrics as detached scalar tensors (no device sync needed)."""
        ...

    def act(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Action(s) for one observation or a batch, as numpy: the policy's mode (evaluation in the real
        env) or a sample. Callers pass ``deterministic``; the agents' defaults differ (SAC samples, as
        data collection wants; TD3+BC and IQL give the mode). Observations of another shape, or
        with NaN or infinite values, raise `mbrl_offline.errors.InputError`
        (`mbrl_offline.policies.checked_observations`)."""
        ...

    def episode_policy(self, deterministic: bool) -> EpisodePolicy:
        """The policy for real episodes (evaluation): the mode with ``deterministic``, else samples;
        a recurrent agent carries its state through each episode."""
        ...

    def deterministic(self, observations: torch.Tensor, state: Any = None,
                      starts: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Any]:
        """``(actions (B, act_dim), next state)``: the policy's mode for tensor inputs, read as the policy's
        ``sample`` reads them; the actions ``act(obs, deterministic=True)`` and evaluation take. An exported
        policy (`mbrl_offline.export`) is this computation alone."""
        ...

    def state_dict(self) -> dict:
        ...

    def load_state_dict(self, state: dict) -> None:
        ...


@runtime_checkable
class Generator(Protocol):
    """A producer of synthetic experience: built (fitted, or loaded from the cache) for a dataset, it
    generates from a policy and the real data (start states or histories), and it has state the
    checkpoint keeps.

    ``config`` is its settings dataclass: ``config.every`` is the trainer's schedule (updates between
    generations; 0: once, at the start), or, where the config has a ``utd`` that is not None, the
    update-to-data ratio (after a generation of N transitions, ``max(1, ceil(utd * N))`` updates until
    the next: NEUBAY's), and ``config.mixing`` the rule for batches. ``produces`` (in `SEQUENCE_KINDS`)
    says what ``generate`` returns: transition rows, or sequences (whole episodes concatenated, with a
    bool ``starts`` field True at each episode's first row; `mbrl_offline.buffer.SequenceBuffer.add_episodes`). ``buffer_capacity``
    sizes the synthetic buffer (generated rows kept; the oldest go first); ``extra_fields`` declares
    the fields its rows carry besides the transition's (`mbrl_offline.buffer.transition_schema`: the
    member that produced a row, its uncertainty, ...), which the synthetic buffer keeps.

    Optionally, a generator whose model learns from the agent during the run (RAMBO's adversarial
    model training) has ``adapt_every`` (agent updates between calls; 0: never, as when absent) and
    ``adapt(policy, value, real, rng) -> metrics``, which the trainer calls after every
    ``adapt_every``-th update with the agent's policy, its value role (`ValueFunction`) and every real
    row. What ``adapt`` changes belongs to ``state_dict()`` (its ``model`` stays the fitted one).
    """

    config: Any
    produces: str

    @property
    def buffer_capacity(self) -> int:
        ...

    @property
    def extra_fields(self) -> dict:
        ...

    def generate(self, policy: Policy, real: Batch,
                 rng: Optional[torch.Generator] = None) -> tuple[Batch, dict[str, float]]:
        """Synthetic rows (transition fields and ``extra_fields``, on the device; sequences also
        ``starts``) and statistics (``transitions``: the rows generated, which a ``utd`` schedule
        counts), from ``policy`` and the real data ``real`` (every real row's fields, on the device)."""
        ...

    def state_dict(self) -> dict:
        ...

    def load_state_dict(self, state: dict) -> None:
        ...


@runtime_checkable
class Mixing(Protocol):
    """How a batch is drawn from the real and the synthetic buffer (`mbrl_offline.buffer.Mixing`)."""

    def sample(self, real, synthetic, batch_size: int, rng: Optional[torch.Generator] = None) -> Batch:
        """A batch of ``batch_size`` rows with the bool field ``synthetic``; all real while the
        synthetic buffer is missing or empty. A rule that mixes in the loss adds per-row loss weights
        (the float field ``weights``), which agents honour. The ``tape`` rule draws a tape of
        ``batch_size`` rows from sequence buffers; the ``latest`` rule gives every row of the synthetic
        buffer's newest generation, whatever ``batch_size`` (on-policy agents: ``AgentClass.on_policy``)."""
        ...




@runtime_checkable
class AgentClass(Protocol):
    """What the registry (`mbrl_offline.registry.register_agent`), `mbrl_offline.compose.build_run`, the
    command line and `mbrl_offline.algorithms.load_policy` need from an agent's class, before any
    instance exists. `mbrl_offline.registry.check_agent_class` checks these members at registration.

    - ``name``: the registry's name (``algo=<name>``), unique.
    - ``summary`` and ``defaults_from``: what it is, and the code its defaults come from, one line each
      (the docs' tables, `mbrl_offline.doc_tables`).
    - ``config_class``: its settings, a dataclass whose defaults are the published settings, with a
      ``batch_size`` field (rows per batch, or the tape's length for an agent of sequences).
    - ``consumes``: what it learns from, one of `SEQUENCE_KINDS`.
    - ``recurrent``: whether its policy carries a state (reads `mbrl_offline.policies.history_inputs`).
    - ``needs_dynamics``: whether its own losses use the generator's dynamics model (MOBILE's penalty);
      the generator hands it over as the ``dynamics`` part (`GeneratorClass.provides_dynamics`).
    - ``provides_value`` (optional, read as False): whether instances are their own `ValueFunction`
      (``mode``, ``q_value``, ``discount``), which a generator that trains its model against the agent
      (``generator.adversarial``) needs; `mbrl_offline.compose.check_pair` refuses that pair otherwise.
    - ``divergence_metric``: the metric of ``update`` (an estimate of the value) that the trainer's
      divergence guard watches (``trainer.divergence_q``), or None for none.
    - ``on_policy`` (optional, read as False): whether it learns only from rollouts of its current policy,
      each update from a fresh generation taken whole (MOReL's NPG). `mbrl_offline.pairing.check_pair`
      then requires a generator with ``every=1`` and the ``latest`` mixing rule
      (`mbrl_offline.buffer.Mixing`), so that the trainer generates before every update and the batch
      is that generation; a generator whose learner needs its rows grouped into paths labels them
      (``path`` and ``step`` fields, e.g. `mbrl_offline.generators.rollouts.RolloutConfig.label_paths`).
    - ``deterministic_policy`` (optional, read as False; a class attribute, or a property where the
      settings decide it, as IQL's ``deterministic_actor`` does): whether its policy is deterministic,
      with no distribution to sample (TD3+BC). Online interaction (`mbrl_offline.online`) then explores
      with Gaussian noise on its actions; an agent whose policy samples explores with its samples
      (``act(obs, deterministic=False)``).
    - ``penalty_off`` (optional, read as ``{}``): the settings of its config (field -> value) that turn its
      own conservatism off, for fine-tuning with ``penalty=off`` (`mbrl_offline.finetune`): CQL's
      ``cql_weight`` 0, MOBILE's ``penalty_coef`` 0. A generator's penalty is its config's
      (`GeneratorConfig.without_penalty`).
    - ``check_dataset(config, dataset)`` (optional, a classmethod): refuse, in one line, settings
      ``config`` that do not fit ``dataset`` (its sizes: MOReL's ``observation_scale`` needs one factor per
      observation dimension); `mbrl_offline.compose.build_run` calls it before any model is fitted.
    - ``published_generator()``: the generator config it was published with (``generator=`` unset).
    - ``for_dataset(dataset, config=None, device="cpu", **parts)``: the agent for a dataset's env (sizes,
      action bounds, and whatever it takes from the data: IQL's reward scale, TD3+BC's state
      statistics); ``parts`` are the generator's parts the agent needs (``dynamics``).
    - the constructor ``(obs_dim, act_dim, action_low, action_high, config, device, **parts)``: the agent
      for an env without data, which `load_policy` fills from a checkpoint.
    """

    name: str
    summary: str
    defaults_from: str
    config_class: type
    consumes: str
    recurrent: bool
    needs_dynamics: bool
    divergence_metric: Optional[str]

    @classmethod
    def published_generator(cls) -> Any:
        ...

    @classmethod
    def for_dataset(cls, dataset, config=None, device: str | torch.device = "cpu", **parts) -> Agent:
        ...


@runtime_checkable
class GeneratorClass(Protocol):
    """What the registry (`mbrl_offline.registry.register_generator`), `mbrl_offline.compose.check_pair`
    and `mbrl_offline.generators.build_generator` need from a generator's class.
    `mbrl_offline.registry.check_generator_class` checks these members at registration.

    - ``config_class``: its settings, a `GeneratorConfig` subclass whose ``kind`` default is the
      registry's name (``generator=<kind>``).
    - ``summary``: what it gives, one line (the docs' tables, `mbrl_offline.doc_tables`).
    - ``produces``: what ``generate`` returns, one of `SEQUENCE_KINDS`.
    - ``recurrent_policy``: whether ``generate`` can roll out a recurrent policy (one that carries a
      state); a generator that cannot is refused for a recurrent agent by ``check_pair``.
    - ``provides_dynamics``: whether instances have a ``dynamics`` model (`mbrl_offline.models.dynamics`'s
      interface) to hand to an agent whose losses need one (``AgentClass.needs_dynamics``).
    - ``for_dataset(config, dataset, device, cache_dir, model_path, progress)``: the generator for a
      dataset, its model fitted on it, loaded from ``model_path`` or from the cache in ``cache_dir``.
    - ``model``: the fitted model ``generate`` uses (anything with ``state_dict()``), or None. One rule
      puts every generator into a checkpoint (`mbrl_offline.trainer`): the fingerprint of the model as
      the run was built with it (`mbrl_offline.checkpoint.model_fingerprint`), never its weights, which
      ``for_dataset`` gives back from the cache or ``model_path`` (a resume whose model differs is
      refused), and ``state_dict()``: what ``generate`` depends on besides that model (PGD's generation
      count; ``{}`` for most).
    - ``refit(dataset, progress)`` (optional): train the model further on ``dataset`` (an
      `OfflineDataset` of every real row so far) and return the refit's metrics; online fine-tuning calls
      it every ``trainer.online.refit_every`` env steps (`mbrl_offline.online`). A generator with it puts
      the refitted weights in ``state_dict()`` (a resume loads them over the model ``for_dataset`` gave
      back), and its config's ``check_refit`` refuses the settings under which it cannot refit. Without
      it the model never changes during a run, and ``refit_every`` is refused.
    """

    config_class: type
    summary: str
    produces: str
    recurrent_policy: bool
    provides_dynamics: bool

    @classmethod
    def for_dataset(cls, config, dataset, device: str | torch.device = "cpu", cache_dir=None, model_path=None,
                    progress: bool = True) -> Generator:
        ...


@dataclass
class GeneratorConfig:
    """The settings every generator has, checked once here: its ``kind`` (the registry's name), its
    schedule (``every`` or ``utd``) and the batches' ``mixing`` rule. A generator's own config subclasses
    it (a dataclass), redeclares the defaults that differ (at least ``kind``) and adds its own settings;
    its ``__post_init__`` calls this one's first.

    The schedule: generations come before the first update and then every ``every`` updates (0: only
    before the first), or, where ``utd`` is set, ``max(1, ceil(utd * N))`` updates after a generation
    of N transitions (NEUBAY's update-to-data ratio; ``mbrl_offline.trainer``). Setting ``every`` under
    a ``utd`` schedule would have no effect, and is refused. A mixing setting that differs from the
    class's default but that the chosen rule does not read is refused too
    (`mbrl_offline.buffer.MixingConfig.check_effective`).
    """

    kind: str = ""  # the registry's name: each subclass redeclares it with its own
    every: int = 0  # updates between generations; 0: generate once, at the start
    utd: Optional[float] = None  # update-to-data ratio schedule (see above); null: ``every`` schedules
    mixing: MixingConfig = field(default_factory=MixingConfig)  # real and synthetic rows per batch

    def __post_init__(self):
        check_field_types(self, "generator")  # types first; nested mappings become configs
        kind = self.default_kind()
        if self.kind != kind:
            raise ConfigError(f"a {type(self).__name__} has kind '{kind}', not '{self.kind}'.")
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 0:
            raise ConfigError(f"generator.every must be >= 0 (0: generate once), got {self.every}.")
        require_in_range(self, "utd", low=0.0, low_open=True, section="generator", hint=" (null: use every)")
        if self.utd is not None and self.every > 0:  # a setting the other makes ineffective is refused
            raise ConfigError(f"generator.every={self.every} has no effect while generator.utd={self.utd} schedules the "
                              f"generations (ceil(utd x the transitions generated) updates apart); set generator.utd=null "
                              f"to generate every {self.every} updates, or leave generator.every at 0.")
        self.mixing.check_effective(self.default_mixing())

    @classmethod
    def default_kind(cls) -> str:
        """The ``kind`` this class declares (its field's default)."""
        return cls.__dataclass_fields__["kind"].default

    @classmethod
    def default_mixing(cls) -> MixingConfig:
        """The class's default mixing rule, which `MixingConfig.check_effective` compares settings with."""
        return cls.__dataclass_fields__["mixing"].default_factory()

    def fitted_model(self) -> Optional[str]:
        """The model cache's folder (under `mbrl_offline.cache.cache_root`) that building this generator
        fits a model into, unless a model file is given: ``"dynamics"``, ``"diffusion"``, or None where
        nothing is fitted. The command line checks that it can be written before any work."""
        return None

    def check_dataset(self, dataset, model_path=None) -> None:
        """Refuse, in one line, a dataset this generator's model cannot be fitted on (too few rows for
        its batches and holdout), before anything is fitted or written; ``model_path``: a saved model is
        used instead of a fit."""

    def check_agent(self, agent, algo_config) -> None:
        """Refuse, in one line, settings of this generator that do not fit the agent's class (or instance)
        ``agent`` with settings ``algo_config``; `mbrl_offline.compose.check_pair` calls it."""

    def without_penalty(self) -> "GeneratorConfig":
        """These settings with the generator's own conservatism turned off (a reward penalty, halting,
        adversarial model training), for fine-tuning with ``penalty=off`` (`mbrl_offline.finetune`); a
        generator without any returns them unchanged."""
        return self

    def check_refit(self) -> None:
        """Refuse, in one line, settings under which this generator cannot refit its model
        (``trainer.online.refit_every``; asked only of a generator class with ``refit``)."""
