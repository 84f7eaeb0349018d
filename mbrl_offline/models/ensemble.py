"""Ensemble layers: N independent networks evaluated as one batched matmul per layer.

Every ensemble in the library (critics, dynamics members) is built from `EnsembleLinear`, so an
ensemble of N members costs one `baddbmm` per layer instead of N Python-level calls.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn


class EnsembleLinear(nn.Module):
    """`ensemble_size` independent affine maps, applied together.

    Input ``(N, B, in)`` or a shared ``(B, in)`` (broadcast to every member); output ``(N, B, out)``.
    Each member is initialised as `torch.nn.Linear` would be (uniform in ±1/sqrt(fan_in)).
    """

    def __init__(self, in_features: int, out_features: int, ensemble_size: int):
        super().__init__()
        self.in_features, self.out_features, self.ensemble_size = in_features, out_features, ensemble_size
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(ensemble_size, 1, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return torch.matmul(x, self.weight) + self.bias
        return torch.baddbmm(self.bias, x, self.weight)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, members={self.ensemble_size}"


class EnsembleLayerNorm(nn.Module):
    """LayerNorm with separate affine parameters per member (input ``(N, B, features)``)."""

    def __init__(self, features: int, ensemble_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ensemble_size, 1, features))
        self.bias = nn.Parameter(torch.zeros(ensemble_size, 1, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return x * self.weight + self.bias


class EnsembleMLP(nn.Module):
    """N MLPs with identical shapes: ``hidden_layers`` hidden layers of ``hidden_size`` units.

    ``(B, in)`` or ``(N, B, in)`` -> ``(N, B, out)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        ensemble_size: int,
        hidden_size: int = 256,
        hidden_layers: int = 2,
        activation: Callable[[], nn.Module] = nn.ReLU,
        layer_norm: bool = False,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(hidden_layers):
            layers.append(EnsembleLinear(width, hidden_size, ensemble_size))
            if layer_norm:
                layers.append(EnsembleLayerNorm(hidden_size, ensemble_size))
            layers.append(activation())
            width = hidden_size
        layers.append(EnsembleLinear(width, out_features, ensemble_size))
        self.net = nn.Sequential(*layers)

    @property
    def output_layer(self) -> EnsembleLinear:
        return self.net[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
