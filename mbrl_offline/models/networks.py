"""Actor and critic networks shared by every SAC-family agent."""
from __future__ import annotations

import math

import torch
from torch import nn

from mbrl_offline.models.ensemble import EnsembleMLP


def mlp(in_features: int, out_features: int, hidden_size: int, hidden_layers: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(hidden_layers):
        layers += [nn.Linear(width, hidden_size), nn.ReLU()]
        width = hidden_size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


class CriticEnsemble(nn.Module):
    """N Q-functions Q_i(s, a), computed together: returns ``(N, B)``."""

    def __init__(self, obs_dim: int, act_dim: int, num_critics: int, hidden_size: int = 256,
                 hidden_layers: int = 2, layer_norm: bool = False):
        super().__init__()
        self.num_critics = num_critics
        self.net = EnsembleMLP(obs_dim + act_dim, 1, num_critics, hidden_size, hidden_layers,
                               layer_norm=layer_norm)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)
        return self.net(x).squeeze(-1)


class TanhGaussianActor(nn.Module):
    """pi(a|s) = scale * tanh(u) + offset, u ~ N(mu(s), sigma(s)); log-probabilities include the
    tanh change of variables. ``action_low``/``action_high`` are the env's bounds."""

    log_std_min, log_std_max = -5.0, 2.0

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, hidden_size: int = 256,
                 hidden_layers: int = 2):
        super().__init__()
        self.trunk = mlp(obs_dim, 2 * act_dim, hidden_size, hidden_layers)
        low = torch.as_tensor(action_low, dtype=torch.float32)
        high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_offset", (high + low) / 2)

    def forward(self, obs: torch.Tensor, deterministic: bool = False, with_log_prob: bool = True):
        """Returns ``(action, log_prob)``; ``log_prob`` is None when not asked for."""
        mu, log_std = self.trunk(obs).chunk(2, dim=-1)
        if deterministic:
            return torch.tanh(mu) * self.action_scale + self.action_offset, None
        log_std = log_std.clamp(self.log_std_min, self.log_std_max)
        std = log_std.exp()
        noise = torch.randn_like(mu)
        u = mu + std * noise
        squashed = torch.tanh(u)
        action = squashed * self.action_scale + self.action_offset
        if not with_log_prob:
            return action, None
        # log N(u; mu, std) - sum log |d action / d u|, with the numerically stable
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)).
        gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        log_det = 2 * (math.log(2) - u - nn.functional.softplus(-2 * u)) + torch.log(self.action_scale)
        return action, (gaussian - log_det).sum(-1)
