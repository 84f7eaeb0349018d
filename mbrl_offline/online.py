"""Online interaction during training (``trainer.online.enabled=true``; ``mbrl-finetune ... online=true``):
offline-to-online fine-tuning, in which the agent also acts in the real env and learns from what it sees.

Before each update the trainer takes ``steps_per_update`` steps in the real env with the agent's
exploration policy (`OnlineInteraction.step`), and adds each transition to the real buffer, after the
offline rows: the agent's own update then learns from both, and a generator starts its rollouts from
both (an agent of the SAC family keeps generating from its dynamics model, as MBPO does). The model is
the one fitted on the offline data unless ``refit_every`` is set: then, every ``refit_every`` env steps
(MBPO's ``model_train_freq``, 250), the generator's ``refit`` trains it further on every real row so far,
the offline and the online ones (`mbrl_offline.generators.rollouts.RolloutGenerator.refit`: from its
current weights, input statistics recomputed, early stopping on a fresh holdout, elites chosen again),
and the rollouts after it step the refitted model. How a batch draws its real rows:

- ``offline_ratio`` None (the default): offline and online rows pooled and drawn uniformly, one buffer
  for both, as CORL's fine-tuning scripts do;
- ``offline_ratio`` r: a share r of each batch's real rows from the offline data and the rest from the
  online rows once there are any (RLPD's symmetric sampling is r = 0.5) (`MixedRealBuffer`).

Exploration: an agent whose policy samples (the SAC family, IQL's Gaussian actor) acts with samples,
``act(obs, deterministic=False)``; an agent whose policy is deterministic (``AgentClass.deterministic_policy``:
TD3+BC) acts with its action plus Gaussian noise of std ``exploration_noise`` times half the action
range, clipped to the action bounds, as TD3's exploration does.

Episodes: each epoch starts a fresh episode, its reset seed drawn from the run seed and the epoch, and an
episode still running when the epoch ends is cut there (its last transition stored as a timeout, as a
time limit would). So a checkpoint, taken at an epoch's end, holds every online row and nothing of a
half-run episode, and ``resume=true`` continues exactly (same device and threads). With
``updates_per_epoch`` x ``steps_per_update`` at or above the env's time limit (1000 steps on MuJoCo),
the cut falls at most once per epoch and shortens at most one episode.

Each epoch's record (``metrics.jsonl``, the trackers) has an ``online`` group: ``env_steps`` (all so far),
``episodes`` (finished, all so far) and ``return_mean`` / ``normalized_score`` of the episodes finished in
the epoch (NaN where none finished). With ``refit_every`` an epoch in which the model was refitted also
has a ``refit`` group: ``refits`` (all so far), and the last refit's ``epochs``, ``rows`` and
``holdout_mse`` (the elites' mean).

The agent acts through its episode policy (``Agent.episode_policy``), as evaluation does: a recurrent
policy (NEUBAY's) carries its state through each episode, from the previous action and reward. An agent
of sequences learns from whole episodes, so each online episode also joins its buffer of real episodes
when it ends or is cut (`add_online_episodes`); its tapes then draw from the offline and online episodes
alike, weighed by the generator's mixing rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from mbrl_offline.buffer import TransitionBuffer
from mbrl_offline.config import check_field_types, require_fraction, require_nonnegative, require_positive
from mbrl_offline.errors import ConfigError


@dataclass
class OnlineConfig:
    enabled: bool = False  # act in the real env during training (offline-to-online fine-tuning)
    steps_per_update: int = 1  # real env steps before each update (one step, one update: CORL's fine-tuning loops)
    exploration_noise: float = 0.1  # a deterministic policy's Gaussian noise, in half action ranges (TD3's 0.1)
    offline_ratio: Optional[float] = None  # share of a batch's real rows from the offline data; None: pooled, uniform
    max_episode_steps: Optional[int] = None  # the online episodes' time limit; None: the env's own
    refit_every: Optional[int] = None  # env steps between refits of the generator's model on every real row (MBPO: 250); None: never

    def __post_init__(self):
        check_field_types(self, "trainer.online")
        require_positive(self, "steps_per_update", "max_episode_steps", "refit_every", section="trainer.online")
        require_nonnegative(self, "exploration_noise", section="trainer.online")
        require_fraction(self, "offline_ratio", section="trainer.online")


def check_online(config: OnlineConfig, agent_cls, generator_config) -> None:
    """Refuse in one line, from the settings alone (before a model is fitted or a file written), what
    online interaction cannot do with this agent class and generator config (None: no generator)."""
    if not config.enabled:
        return
    if config.offline_ratio is not None and agent_cls.consumes == "sequences":
        raise ConfigError(f"trainer.online.offline_ratio sets the share of offline rows in a batch of transitions, "
                          f"and {agent_cls.name} learns from tapes of whole episodes (the generator's mixing rule "
                          f"weighs them); leave trainer.online.offline_ratio null.")
    if config.refit_every is not None:
        from mbrl_offline.registry import GENERATORS

        kind = getattr(generator_config, "kind", "none")
        if kind == "none":
            raise ConfigError(f"trainer.online.refit_every={config.refit_every} refits the generator's model, and this "
                              f"run has no generator; leave trainer.online.refit_every null or choose a generator.")
        if not callable(getattr(GENERATORS[kind][1], "refit", None)):
            raise ConfigError(f"trainer.online.refit_every={config.refit_every}: generator.kind={kind} keeps the model it "
                              f"was built with (its class has no refit); leave trainer.online.refit_every null.")
        generator_config.check_refit()
    rule = getattr(getattr(generator_config, "mixing", None), "rule", None)
    if config.offline_ratio is not None and rule == "weights" and getattr(generator_config, "kind", "none") != "none":
        raise ConfigError("trainer.online.offline_ratio sets the share of offline rows among a batch's real rows, "
                          "and generator.mixing.rule=weights draws from the real and synthetic rows pooled; "
                          "leave trainer.online.offline_ratio null or use the fraction or counts rule.")


def online_steps(config: OnlineConfig, updates: int) -> int:
    """Real env steps a run of ``updates`` updates takes (0 with online interaction off)."""
    return config.steps_per_update * updates if config.enabled else 0


class MixedRealBuffer(TransitionBuffer):
    """The real buffer of a run with online interaction and an ``offline_ratio``: rows ``[0, offline)``
    are the offline data, the rows after them the online ones; ``sample`` draws ``round(ratio * n)`` rows
    uniformly from the offline rows and the rest uniformly from the online rows (all offline while there
    are none)."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, device, offline_ratio: float):
        super().__init__(capacity, obs_dim, act_dim, device)
        self.offline_ratio = offline_ratio
        self.offline = 0  # offline rows, set once the dataset is added

    def add_dataset(self, dataset) -> None:
        super().add_dataset(dataset)
        self.offline = self.size

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None) -> dict[str, torch.Tensor]:
        online = self.size - self.offline
        if online == 0:
            return super().sample(batch_size, generator)
        n_offline = int(round(self.offline_ratio * batch_size))
        index = torch.cat([
            torch.randint(0, self.offline, (n_offline,), device=self.device, generator=generator),
            torch.randint(self.offline, self.size, (batch_size - n_offline,), device=self.device, generator=generator)])
        return self.rows(index)


class OnlineInteraction:
    """The agent's steps in the real env during training (see the module docstring). ``buffer``: the run's
    real buffer, with room for every online row after the offline ones; ``sequences``: for an agent of
    sequences, its buffer of whole real episodes, which each online episode joins when it ends (or is
    cut at an epoch's end). The agent acts through its episode policy (``Agent.episode_policy``, as in
    evaluation), which carries a recurrent policy's state through the episode."""

    def __init__(self, config: OnlineConfig, agent, env_info, buffer: TransitionBuffer, seed: int,
                 deterministic_policy: bool, sequences=None):
        self.config, self.env_info, self.buffer = config, env_info, buffer
        self.seed, self.deterministic_policy, self.sequences = seed, deterministic_policy, sequences
        kwargs = {} if config.max_episode_steps is None else {"max_episode_steps": config.max_episode_steps}
        try:
            self.env = env_info.make(**kwargs)
        except Exception as exc:  # a missing simulator (MuJoCo), or an env Gymnasium does not know
            raise ConfigError(f"trainer.online.enabled=true needs the {env_info.name} env ({env_info.gym_id}), which "
                              f"cannot be simulated here ({type(exc).__name__}: {exc}); install its simulator "
                              f"(pip install 'gymnasium[mujoco]') or train offline.") from None
        self.low = self.env.action_space.low.astype(np.float32)
        self.high = self.env.action_space.high.astype(np.float32)
        # a deterministic policy acts with its mode and explores with noise; any other samples
        self.policy = agent.episode_policy(deterministic=deterministic_policy)
        self.env_steps = 0
        self.episodes = 0
        self.noise = np.random.default_rng(np.random.SeedSequence([seed, 7]))  # exploration noise: its own stream
        self.obs: Optional[np.ndarray] = None
        self.episode_return = 0.0
        self.finished: list[float] = []  # returns of the episodes finished in this epoch

    def _reset(self, *key: int) -> np.ndarray:
        """The first observation of an episode reset with a seed drawn from the run seed and ``key``; the
        episode policy starts a fresh episode."""
        reset_seed = int(np.random.SeedSequence([self.seed, *key]).generate_state(1)[0] % 2**31)
        self.policy.reset(1)
        self.start, self.reward = True, 0.0  # the policy's inputs besides the observation
        self.episode_first = len(self.buffer)  # the buffer row of the episode's first transition (it never wraps)
        return np.asarray(self.env.reset(seed=reset_seed)[0], dtype=np.float32)

    def start_epoch(self, epoch: int) -> None:
        """A fresh episode, reset with a seed of the run seed and the epoch."""
        self.obs = self._reset(epoch, 11)
        self.episode_return = 0.0
        self.finished = []

    def action(self) -> np.ndarray:
        action = np.asarray(self.policy(self.obs[None], np.array([self.reward], dtype=np.float32),
                                        np.array([self.start]), np.zeros(1, dtype=np.int64))[0], dtype=np.float32)
        self.start = False
        if not self.deterministic_policy:
            return action
        noise = self.noise.normal(0.0, self.config.exploration_noise, size=action.shape).astype(np.float32)
        return np.clip(action + noise * (self.high - self.low) / 2, self.low, self.high)

    def step(self) -> None:
        """One env step: the transition goes to the real buffer; a finished episode starts the next."""
        action = self.action()
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        next_obs = np.asarray(next_obs, dtype=np.float32)
        self.buffer.add(single=True, observations=self.obs, actions=action, rewards=np.float32(reward),
                        next_observations=next_obs, terminals=bool(terminated), timeouts=bool(truncated))
        self.env_steps += 1
        self.episode_return += float(reward)
        self.reward = float(reward)
        if terminated or truncated:
            self.episodes += 1
            self.finished.append(self.episode_return)
            self.episode_return = 0.0
            self._episode_to_sequences()
            next_obs = self._reset(self.episodes, 13)
        self.obs = next_obs

    def _episode_to_sequences(self) -> None:
        """For an agent of sequences: the episode just ended (its rows from ``episode_first`` to the newest)
        joins the buffer of whole episodes."""
        if self.sequences is not None and len(self.buffer) > self.episode_first:
            add_online_episodes(self.sequences, self.buffer, self.episode_first, len(self.buffer))

    def end_epoch(self) -> dict[str, float]:
        """Cut a running episode (its last transition becomes a timeout); the epoch's ``online`` record."""
        last = (self.buffer.cursor - 1) % self.buffer.capacity  # the newest online row
        if not (self.buffer.data["terminals"][last] or self.buffer.data["timeouts"][last]):
            self.buffer.data["timeouts"][last] = True
            self._episode_to_sequences()
        returns = np.asarray(self.finished, dtype=np.float64)
        return {"env_steps": float(self.env_steps), "episodes": float(self.episodes),
                "episodes_in_epoch": float(len(returns)),
                "return_mean": float(returns.mean()) if len(returns) else float("nan"),
                "normalized_score": float(self.env_info.normalized_score(returns).mean()) if len(returns)
                else float("nan")}

    def state_dict(self) -> dict:
        return {"env_steps": self.env_steps, "episodes": self.episodes,
                "noise": self.noise.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.env_steps, self.episodes = int(state["env_steps"]), int(state["episodes"])
        self.noise.bit_generator.state = state["noise"]


def add_online_episodes(sequences, buffer: TransitionBuffer, first: int, stop: int) -> None:
    """Rows ``[first, stop)`` of the real buffer, whole episodes (each ends with a terminal or a timeout,
    the last one at least cut), appended to the buffer of whole episodes ``sequences`` in order: one
    episode as it ends, or every online row of a resumed run at once (the same buffer either way)."""
    rows = {key: value[first:stop] for key, value in buffer.data.items()}
    ends = rows["terminals"] | rows["timeouts"]
    starts = torch.zeros_like(ends)
    starts[0] = True
    starts[1:] = ends[:-1]
    sequences.add_episodes(starts, **rows)


__all__ = ["OnlineConfig", "OnlineInteraction", "MixedRealBuffer", "add_online_episodes", "check_online",
           "online_steps"]
