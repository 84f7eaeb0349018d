"""What the model-free agents (TD3+BC, IQL, CQL) share: the dataset's state normalisation and CORL's
reward scale, kept inside the agent, their action bounds as tensors, and building an agent for a
dataset's env. They train on the
dataset alone by default (their papers' setting, ``published_generator``: none) and on any transition
generator by configuration (``algo=iql generator=rollouts``)."""
from __future__ import annotations

import math

import numpy as np
import torch

from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import NoGeneratorConfig
from mbrl_offline.policies import agent_for_dataset


class ObservationNormaliser:
    """``(obs - mean) / std`` with a dataset's statistics; the identity until `fit` or `set`. Part of the
    agent's state, so a saved agent acts on raw observations."""

    def __init__(self, obs_dim: int, device: torch.device):
        self.obs_dim, self.device = obs_dim, device
        self.mean = torch.zeros(obs_dim, device=device)
        self.std = torch.ones(obs_dim, device=device)

    def set(self, mean, std) -> None:
        mean = torch.as_tensor(np.asarray(mean, dtype=np.float32), device=self.device)
        std = torch.as_tensor(np.asarray(std, dtype=np.float32), device=self.device)
        if mean.shape != (self.obs_dim,) or std.shape != (self.obs_dim,) or not bool((std > 0).all()):
            raise ConfigError(f"state normalisation needs a mean and a positive std of shape ({self.obs_dim},).")
        self.mean, self.std = mean, std

    def fit(self, observations: np.ndarray, eps: float) -> None:
        """The mean and the std + ``eps`` of ``observations`` (CORL's ``compute_mean_std``)."""
        self.set(observations.mean(0), observations.std(0) + eps)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.mean) / self.std

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "std": self.std.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.set(state["mean"].cpu().numpy(), state["std"].cpu().numpy())


def action_box(action_low, action_high, device: torch.device):
    """The env's action bounds as tensors on ``device``: ``(low, high, centre, half-width)``."""
    low = torch.as_tensor(np.asarray(action_low, dtype=np.float32), device=device)
    high = torch.as_tensor(np.asarray(action_high, dtype=np.float32), device=device)
    return low, high, (high + low) / 2, (high - low) / 2


def new_agent_for(cls, dataset, config, device, parts: dict):
    """`mbrl_offline.policies.agent_for_dataset` with the state normalisation fitted when
    ``config.normalize_states``, and the reward scale set when the config has ``normalize_reward`` on
    (`reward_scale`), both from the real data, whatever a generator adds."""
    agent = agent_for_dataset(cls, dataset, config, device, parts)
    if agent.config.normalize_states:
        agent.normalise.fit(dataset.observations, agent.config.state_std_eps)
    if getattr(agent.config, "normalize_reward", False):
        agent.set_reward_scale(reward_scale(dataset))
    return agent


def reward_scale(dataset) -> float:
    """CORL's reward normalisation: 1000 / (max - min episode return of the dataset) (``modify_reward``
    in CORL's ``iql.py`` and ``cql.py``)."""
    returns = dataset.episode_returns()
    spread = float(returns.max() - returns.min()) if len(returns) else 0.0
    if not spread > 0:
        raise ConfigError("algo.normalize_reward needs episodes with different returns in the dataset; "
                          "set algo.normalize_reward=false.")
    return 1000.0 / spread


def checked_reward_scale(scale) -> float:
    """``scale`` as a float, refused unless positive and finite (an agent's ``set_reward_scale``)."""
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"the reward scale must be positive and finite, got {scale}.")
    return float(scale)


def published_generator() -> NoGeneratorConfig:
    """The model-free agents' papers train on the dataset alone."""
    return NoGeneratorConfig()


__all__ = []
