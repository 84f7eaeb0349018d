"""Termination functions: done(s, a, s') for model rollouts, one per environment.

Each takes ``next_observations`` of shape ``(..., obs_dim)`` (torch) and returns a bool tensor of
shape ``(...)`` that is True where the true Gymnasium v5 environment would report ``terminated``.
They read the observation only, so one caveat holds for Hopper: the env also checks its unclipped
joint velocities against ±100, but the observation clips velocities to ±10, so that rare case is
invisible to any function of the observation (as in MBPO, MOPO and RAVL's code).
"""
from __future__ import annotations

from typing import Callable

import torch

TerminationFn = Callable[[torch.Tensor], torch.Tensor]


def never(next_obs: torch.Tensor) -> torch.Tensor:
    """HalfCheetah, Pendulum: episodes end only by the time limit."""
    return torch.zeros(next_obs.shape[:-1], dtype=torch.bool, device=next_obs.device)


def hopper(next_obs: torch.Tensor) -> torch.Tensor:
    """Hopper-v5: healthy while height > 0.7, |angle| < 0.2 and |s[1:]| < 100."""
    height, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (
        torch.isfinite(next_obs).all(-1)
        & (next_obs[..., 1:].abs() < 100).all(-1)
        & (height > 0.7)
        & (angle.abs() < 0.2)
    )
    return ~healthy


def walker2d(next_obs: torch.Tensor) -> torch.Tensor:
    """Walker2d-v5: healthy while 0.8 < height < 2.0 and -1 < angle < 1."""
    height, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (height > 0.8) & (height < 2.0) & (angle > -1.0) & (angle < 1.0)
    return ~healthy


def ant(next_obs: torch.Tensor) -> torch.Tensor:
    """Ant-v5: healthy while the state is finite and 0.2 <= torso height <= 1.0."""
    height = next_obs[..., 0]
    healthy = torch.isfinite(next_obs).all(-1) & (height >= 0.2) & (height <= 1.0)
    return ~healthy


def inverted_pendulum(next_obs: torch.Tensor) -> torch.Tensor:
    """InvertedPendulum-v5: done when the state is not finite or |pole angle| > 0.2."""
    return ~torch.isfinite(next_obs).all(-1) | (next_obs[..., 1].abs() > 0.2)


TERMINATION_FUNCTIONS: dict[str, TerminationFn] = {
    "hopper": hopper,
    "walker2d": walker2d,
    "halfcheetah": never,
    "ant": ant,
    "pendulum": never,
    "inverted-pendulum": inverted_pendulum,
}
