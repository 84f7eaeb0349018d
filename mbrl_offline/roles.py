"""The four roles of the spine, written as typed protocols: what `mbrl_offline.trainer.Trainer` needs from
an agent, a policy, a generator and a mixing rule, and nothing more.

The trainer composes them: it asks the *generator* (if there is one) for synthetic data from the
agent's *policy* on its schedule, draws each batch from the real and the synthetic buffer with the
*mixing* rule, and hands it to the *agent*. Any agent meets any generator this way; nothing in the
trainer names an algorithm. ``tests/test_agent_contract.py`` checks every registered agent against
`Agent` and `Policy`, and every registered generator against `Generator`.

Agents learn from transitions or from sequences (``consumes``), and generators produce one or the
other (``produces``); the trainer keeps each in the buffer that fits (`mbrl_offline.buffer`). A
recurrent policy (NEUBAY's) reads `history_inputs` and carries a state; evaluation goes through the
agent's `EpisodePolicy`, which carries that state through each real episode.

The protocols are ``runtime_checkable``: ``isinstance(x, Agent)`` checks that the members exist (not
their signatures); the type checker checks the rest.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
import torch

from mbrl_offline.errors import InputError, InputTypeError, type_name

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
    ``starts``. A recurrent policy (NEUBAY's) reads `history_inputs` rows ``(B, input_dim)`` with
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


def history_inputs(observations: torch.Tensor, previous_actions: torch.Tensor, previous_rewards: torch.Tensor,
                   starts: torch.Tensor) -> torch.Tensor:
    """A recurrent policy's input rows ``[s_t, a_{t-1}, r_{t-1}]`` ``(B, obs_dim + act_dim + 1)`` from
    observations ``(B, obs_dim)``, the previous step's actions ``(B, act_dim)`` and rewards ``(B,)``, with
    zeros for the previous action and reward where ``starts`` ``(B,)`` (bool) marks an episode's first
    step (there is none before it). ``r_{t-1}`` is the reward received on reaching ``s_t`` (NEUBAY's
    ``[s_t, a_{t-1}, r_t]`` in its own indexing)."""
    keep = ~starts.to(torch.bool)
    actions = torch.where(keep[:, None], previous_actions, torch.zeros((), dtype=previous_actions.dtype,
                                                                       device=previous_actions.device))
    rewards = torch.where(keep, previous_rewards, torch.zeros((), dtype=previous_rewards.dtype,
                                                              device=previous_rewards.device))
    return torch.cat([observations, actions.to(observations.dtype), rewards.to(observations.dtype)[:, None]], dim=-1)


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


class ActEpisodePolicy:
    """The `EpisodePolicy` of a feed-forward agent: its ``act(observations, deterministic)``, nothing
    else (so evaluation is the same call, bit for bit, as before episode policies existed)."""

    def __init__(self, agent, deterministic: bool):
        self.agent, self.deterministic = agent, deterministic

    def reset(self, episodes: int) -> None:
        pass

    def __call__(self, observations: np.ndarray, rewards: np.ndarray = None, starts: np.ndarray = None,
                 rows: np.ndarray = None) -> np.ndarray:
        return self.agent.act(observations, deterministic=self.deterministic)


@runtime_checkable
class Agent(Protocol):
    """A learner: the trainer calls ``update`` on each batch, evaluates ``episode_policy(True)`` in the
    env, hands ``policy`` to the generator, and saves ``state_dict`` in checkpoints.

    Also expected: ``name`` (the registry's), ``config`` (a dataclass with ``batch_size``: rows per
    batch, or the tape's length for an agent of sequences), ``device`` and ``consumes`` (in
    `SEQUENCE_KINDS`; read with "transitions" as its default); optionally ``on_epoch_end(epoch,
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
        with NaN or infinite values, raise `mbrl_offline.errors.InputError` (`checked_observations`)."""
        ...

    def episode_policy(self, deterministic: bool) -> EpisodePolicy:
        """The policy for real episodes (evaluation): the mode with ``deterministic``, else samples;
        a recurrent agent carries its state through each episode."""
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
        ``batch_size`` rows from sequence buffers."""
        ...


class FeedForwardAgent:
    """What every agent with a feed-forward policy shares (SAC and its settings, TD3+BC, IQL): the agent
    is its own policy (`Policy`: it adds ``sample`` and ``log_prob``), keeps no recurrent state, learns
    from transition rows and, unless it says otherwise, needs no dynamics model of the generator."""

    recurrent = False  # the policy role: a feed-forward policy
    needs_dynamics = False  # whether the agent's own losses use the generator's dynamics model (MOBILE)
    consumes = "transitions"  # the data it learns from: transition rows (not sequences; `SEQUENCE_KINDS`)

    @property
    def policy(self):
        """The policy generators roll out: this agent's actor (``sample``, ``log_prob``)."""
        return self

    @property
    def input_dim(self) -> int:
        """The policy reads observations: ``obs_dim``."""
        return self.obs_dim

    def initial_state(self, batch_size: int) -> None:
        """No recurrent state: None."""
        return None

    def episode_policy(self, deterministic: bool) -> ActEpisodePolicy:
        """``act(observations, deterministic)`` on each step (`ActEpisodePolicy`)."""
        return ActEpisodePolicy(self, deterministic)

    def act_input(self, obs) -> torch.Tensor:
        """What every agent's ``act`` does first: `checked_observations` for this agent's ``obs_dim``
        (one observation or a batch, finite numbers) as a float32 tensor on its device."""
        return checked_observations(obs, self.obs_dim, self.device, f"{self.name}.act")


def checked_observations(obs, obs_dim: int, device, where: str = "act") -> torch.Tensor:
    """``obs`` (a numpy array, a list or a tensor) as a float32 tensor on ``device``, after checking
    what a policy can act on: numbers (else `InputTypeError`), one observation ``(obs_dim,)`` or a batch
    ``(B, obs_dim)`` (else `InputError`), all finite (else `InputError`: a NaN observation would give a
    NaN action silently). Messages name ``where``, the problem and the fix. Meant for ``act`` (evaluation
    and data collection), not for the training updates."""
    if isinstance(obs, torch.Tensor):
        if obs.is_complex() or obs.dtype == torch.bool:
            raise InputTypeError(f"{where}: observations must be real numbers, got a {obs.dtype} tensor.")
        tensor = obs.to(device=device, dtype=torch.float32)
        finite = bool(torch.isfinite(tensor).all())  # act returns numpy, so it waits for the device anyway
    else:
        try:
            if obs is None or isinstance(obs, (str, bytes, dict)):
                raise TypeError
            array = np.asarray(obs, dtype=np.float32)
        except (TypeError, ValueError):
            raise InputTypeError(f"{where}: observations must be numbers, a numpy array of shape ({obs_dim},) or "
                                 f"(batch, {obs_dim}), got {type_name(obs)}.") from None
        finite = bool(np.isfinite(array).all())
        tensor = torch.as_tensor(array, device=device)
    if tensor.dim() not in (1, 2) or tensor.shape[-1] != obs_dim:
        raise InputError(f"{where}: observations must have shape ({obs_dim},) (one) or (batch, {obs_dim}), got "
                         f"{tuple(tensor.shape)}; pass observations of the env the agent was built for.")
    if not finite:
        bad = torch.nonzero(~torch.isfinite(tensor.reshape(-1, obs_dim)).all(dim=1))[0].item()
        row = f"row {bad} of the batch" if tensor.dim() == 2 else "the observation"
        raise InputError(f"{where}: {row} holds NaN or infinite values, and the action for it would be NaN; "
                         f"check what produced it (a simulation that diverged, a reset that failed).")
    return tensor


class FunctionPolicy:
    """A feed-forward `Policy` from a function of observations to actions (a scripted or external
    policy, or a test's). It has no density: ``log_prob`` raises, so guided generation refuses it.
    ``input_dim`` is the observations' width where the caller knows it (None otherwise)."""

    recurrent = False

    def __init__(self, fn, input_dim: Optional[int] = None):
        self.fn, self.input_dim = fn, input_dim

    def initial_state(self, batch_size: int) -> None:
        return None

    def sample(self, observations: torch.Tensor, state: Any = None,
               starts: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, None]:
        return self.fn(observations), None

    def log_prob(self, observations: torch.Tensor, actions: torch.Tensor, state: Any = None,
                 starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise TypeError("a FunctionPolicy has no log-probability; guided generation needs the agent's policy.")
