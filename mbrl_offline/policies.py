"""Policies' helpers that every agent or generator may use, outside the role protocols
(`mbrl_offline.roles`): a recurrent policy's input rows (`history_inputs`), the `EpisodePolicy` of a
feed-forward agent (`ActEpisodePolicy`), what feed-forward agents share (`FeedForwardAgent`), the
observation check of ``act`` (`checked_observations`) and a policy from a function (`FunctionPolicy`).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from mbrl_offline.errors import InputError, InputTypeError, type_name


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


class FeedForwardAgent:
    """What every agent with a feed-forward policy shares (SAC and its settings, TD3+BC, IQL): the agent
    is its own policy (`Policy`: it adds ``sample`` and ``log_prob``), keeps no recurrent state, learns
    from transition rows and, unless it says otherwise, needs no dynamics model of the generator."""

    recurrent = False  # the policy role: a feed-forward policy
    needs_dynamics = False  # whether the agent's own losses use the generator's dynamics model (MOBILE)
    provides_value = False  # whether it is its own value role (`roles.ValueFunction`: mode, q_value, discount)
    consumes = "transitions"  # the data it learns from: transition rows (not sequences; `SEQUENCE_KINDS`)
    divergence_metric = "q_mean"  # the update metric the trainer's divergence guard watches (its Q estimate)

    @classmethod
    def for_dataset(cls, dataset, config=None, device: str | torch.device = "cpu", **parts):
        """The agent for ``dataset``'s env (its sizes and action bounds); ``parts`` go to the
        constructor (MOBILE's ``dynamics``). `mbrl_offline.roles.AgentClass`'s signature."""
        return agent_for_dataset(cls, dataset, config, device, parts)

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

    @torch.no_grad()
    def deterministic(self, observations: torch.Tensor, state=None, starts=None) -> tuple[torch.Tensor, None]:
        """The policy's mode for observations ``(B, obs_dim)``: the actions ``act(obs, deterministic=True)``
        gives, as a tensor, and no state (the policy role; what an exported policy computes,
        `mbrl_offline.export`). It is the agent's ``mode``."""
        return self.mode(observations), None

    def act_input(self, obs) -> torch.Tensor:
        """What every agent's ``act`` does first: `checked_observations` for this agent's ``obs_dim``
        (one observation or a batch, finite numbers) as a float32 tensor on its device."""
        return checked_observations(obs, self.obs_dim, self.device, f"{self.name}.act")


def agent_for_dataset(cls, dataset, config, device, parts: dict):
    """``cls(obs_dim, act_dim, action_low, action_high, config, device, **parts)`` for ``dataset``'s env
    (`mbrl_offline.roles.AgentClass`'s constructor), after checking that ``dataset`` is a dataset with
    an env and that ``config`` is ``cls.config_class`` (or None: its defaults)."""
    from mbrl_offline.config import config_argument
    from mbrl_offline.data.dataset import dataset_env

    env = dataset_env(dataset, f"{cls.__name__}.for_dataset")
    config = config_argument(config, cls.config_class, f"{cls.__name__}.for_dataset's config")
    low, high = env.action_bounds()
    return cls(env.obs_dim, env.act_dim, low, high, config, device, **parts)


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


class CriticValue:
    """The value role (`mbrl_offline.roles.ValueFunction`) of an agent with critics: ``q_value`` is the
    minimum over ``critic(states, actions)`` ``(N, B)``, the states through the agent's ``normalise`` and
    the estimate divided by its ``reward_scale`` where it has them (so in the env's reward units), and
    ``discount`` its ``config.gamma``. The agent writes ``mode``, its deterministic action."""

    provides_value = True

    @property
    def discount(self) -> float:
        return self.config.gamma

    @torch.no_grad()
    def q_value(self, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """min over the critics of Q(s, a) ``(B,)``, in the env's reward units."""
        normalise = getattr(self, "normalise", None)
        states = normalise(observations) if normalise is not None else observations
        return self.critic(states, actions).min(dim=0).values / getattr(self, "reward_scale", 1.0)


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
