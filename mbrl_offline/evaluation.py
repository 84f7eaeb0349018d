"""Evaluation of a policy in the real Gymnasium environment, reported on D4RL's normalised scale."""
from __future__ import annotations

from typing import Callable

import numpy as np

from mbrl_offline.data.envs import EnvInfo


def evaluate_policy(policy: Callable[[np.ndarray], np.ndarray], env: EnvInfo, episodes: int = 10,
                    seed: int = 0) -> dict:
    """Run ``episodes`` episodes (env ``i`` reset with seed ``seed + i``) in lockstep, so the policy is
    called once per step on all running episodes' observations ``(n, obs_dim)`` and returns actions
    ``(n, act_dim)``. Returns per-episode returns and lengths, their mean and the normalised score.
    """
    envs = [env.make() for _ in range(episodes)]
    try:
        obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
        returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            active = np.flatnonzero(running)
            actions = policy(obs[active])
            for row, i in enumerate(active):
                next_obs, reward, terminated, truncated, _ = envs[i].step(actions[row])
                returns[i] += reward
                lengths[i] += 1
                obs[i] = next_obs
                running[i] = not (terminated or truncated)
    finally:
        for e in envs:
            e.close()
    scores = env.normalized_score(returns)
    return {"return_mean": float(returns.mean()), "return_std": float(returns.std()),
            "normalized_score": float(scores.mean()), "normalized_score_std": float(scores.std()),
            "length_mean": float(lengths.mean()), "returns": returns.tolist()}
