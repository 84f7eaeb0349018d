"""Evaluation of a policy in the real Gymnasium environment, reported on D4RL's normalised scale.

The policy is an `mbrl_offline.roles.EpisodePolicy` (``agent.episode_policy(deterministic=True)``),
which sees each step's observations, the rewards of the previous step and the episode starts, and so
can carry a recurrent state through each episode; a plain function of observations still works.
Episodes run until they end (the library's protocol: N complete episodes; NEUBAY's code instead runs
20 envs for exactly 1000 steps each and averages the completed episodes).
"""
from __future__ import annotations

from typing import Callable, Union

import numpy as np

from mbrl_offline.data.envs import EnvInfo
from mbrl_offline.roles import EpisodePolicy


class _ObservationsOnly:
    """A function of observations as an `EpisodePolicy` (no state, rewards and starts ignored)."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]):
        self.fn = fn

    def reset(self, episodes: int) -> None:
        pass

    def __call__(self, observations, rewards, starts, rows):
        return self.fn(observations)


def evaluate_policy(policy: Union[EpisodePolicy, Callable[[np.ndarray], np.ndarray]], env: EnvInfo,
                    episodes: int = 10, seed: int = 0) -> dict:
    """Run ``episodes`` episodes (env ``i`` reset with seed ``seed + i``) in lockstep, so the policy is
    called once per step on all running episodes: ``policy(observations (n, obs_dim), rewards (n,),
    starts (n,), rows (n,))`` gives actions ``(n, act_dim)`` after ``policy.reset(episodes)`` (an
    `EpisodePolicy`; ``rewards`` are those received on the previous step, 0 at a start, ``rows`` the
    running episodes' indices), or ``policy(observations)`` for a plain function. Returns per-episode
    returns and lengths, their mean and the normalised score.
    """
    if not hasattr(policy, "reset"):
        policy = _ObservationsOnly(policy)
    policy.reset(episodes)
    envs = [env.make() for _ in range(episodes)]
    try:
        obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
        returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
        last_rewards = np.zeros(episodes, dtype=np.float32)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            active = np.flatnonzero(running)
            actions = policy(obs[active], last_rewards[active], lengths[active] == 0, active)
            for row, i in enumerate(active):
                next_obs, reward, terminated, truncated, _ = envs[i].step(actions[row])
                returns[i] += reward
                lengths[i] += 1
                last_rewards[i] = reward
                obs[i] = next_obs
                running[i] = not (terminated or truncated)
    finally:
        for e in envs:
            e.close()
    scores = env.normalized_score(returns)
    return {"return_mean": float(returns.mean()), "return_std": float(returns.std()),
            "normalized_score": float(scores.mean()), "normalized_score_std": float(scores.std()),
            "length_mean": float(lengths.mean()), "returns": returns.tolist()}
