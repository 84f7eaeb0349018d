"""Evaluation of a policy in the real Gymnasium environment, reported on D4RL's normalised scale.

The policy is an `mbrl_offline.roles.EpisodePolicy` (``agent.episode_policy(deterministic=True)``),
which sees each step's observations, the rewards of the previous step and the episode starts, and so
can carry a recurrent state through each episode; a plain function of observations still works.
Episodes run until they end (the library's protocol: N complete episodes; NEUBAY's code instead runs
20 envs for exactly 1000 steps each and averages the completed episodes).

Beside the mean, every evaluation gives the lower tail of the episode returns at a risk level alpha
(`risk_measures`): the value at risk, the alpha-quantile of the returns, and the conditional value at
risk, the mean of the worst alpha share of them (CDSA, arXiv 2406.07541, reports the former as its
agents' risk aversion; both are standard, e.g. Rockafellar and Uryasev 2002).
"""
from __future__ import annotations

import math
from typing import Callable, Union

import numpy as np

from mbrl_offline.data.envs import EnvInfo
from mbrl_offline.errors import ConfigError
from mbrl_offline.roles import EpisodePolicy


class _ObservationsOnly:
    """A function of observations as an `EpisodePolicy` (no state, rewards and starts ignored)."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]):
        self.fn = fn

    def reset(self, episodes: int) -> None:
        pass

    def __call__(self, observations, rewards, starts, rows):
        return self.fn(observations)


def check_risk_level(level, name: str = "risk_level") -> None:
    """Refuse a risk level outside (0, 1) in one line."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.0 < level < 1.0:
        raise ConfigError(f"{name} = {level!r} must be a number strictly between 0 and 1 (the share of worst "
                          f"episodes the value at risk looks at), e.g. {name}=0.1.")


def risk_measures(values, level: float) -> tuple[float, float]:
    """``(VaR, CVaR)`` of the lower tail of ``values`` (episode returns or scores) at ``level`` alpha in
    (0, 1), for their empirical distribution (each value weighing 1/n): with the values sorted,
    x_(1) <= ... <= x_(n), and k = ceil(alpha n),

        VaR_alpha  = x_(k)                                    (the alpha-quantile: inverted CDF),
        CVaR_alpha = (sum_{i<k} x_(i) + (alpha n - (k - 1)) x_(k)) / (alpha n),

    the mean of the quantile function over [0, alpha]: the mean of the worst alpha n values when
    alpha n is whole, with the k-th value weighted by the fraction left otherwise. With 10 episodes
    and alpha = 0.1 both are the worst episode."""
    check_risk_level(level, "level")
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0:
        raise ValueError("risk_measures needs at least one value")
    tail = level * x.size
    k = max(1, math.ceil(tail - 1e-9))  # the rounding guard keeps e.g. 0.3 x 10 at k = 3
    cvar = (x[:k - 1].sum() + (tail - (k - 1)) * x[k - 1]) / tail
    return float(x[k - 1]), float(cvar)


def evaluate_policy(policy: Union[EpisodePolicy, Callable[[np.ndarray], np.ndarray]], env: EnvInfo,
                    episodes: int = 10, seed: int = 0, risk_level: float = 0.1) -> dict:
    """Run ``episodes`` episodes (env ``i`` reset with seed ``seed + i``) in lockstep, so the policy is
    called once per step on all running episodes: ``policy(observations (n, obs_dim), rewards (n,),
    starts (n,), rows (n,))`` gives actions ``(n, act_dim)`` after ``policy.reset(episodes)`` (an
    `EpisodePolicy`; ``rewards`` are those received on the previous step, 0 at a start, ``rows`` the
    running episodes' indices), or ``policy(observations)`` for a plain function. Returns per-episode
    returns and lengths, their mean and the normalised score, and the value at risk and conditional
    value at risk of the returns and of the scores at ``risk_level`` (`risk_measures`).
    """
    check_risk_level(risk_level)
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
    return_var, return_cvar = risk_measures(returns, risk_level)
    score_var, score_cvar = risk_measures(scores, risk_level)
    return {"return_mean": float(returns.mean()), "return_std": float(returns.std()),
            "return_var": return_var, "return_cvar": return_cvar,
            "normalized_score": float(scores.mean()), "normalized_score_std": float(scores.std()),
            "normalized_score_var": score_var, "normalized_score_cvar": score_cvar,
            "length_mean": float(lengths.mean()), "returns": returns.tolist()}
