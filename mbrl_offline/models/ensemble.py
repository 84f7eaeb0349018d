"""Ensemble layers: N independent networks evaluated as one batched matmul per layer.

Every ensemble in the library (critics, dynamics members) is built from `EnsembleLinear`, so an
ensemble of N members costs one `baddbmm` per layer instead of N Python-level calls.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

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

    def forward(self, x: torch.Tensor, members: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``members`` (indices) evaluates only those members; ``x`` then has ``len(members)`` rows first."""
        weight, bias = (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])
        if x.dim() == 2:
            return torch.matmul(x, weight) + bias
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, members={self.ensemble_size}"


class EnsembleLayerNorm(nn.Module):
    """LayerNorm with separate affine parameters per member (input ``(N, B, features)``)."""

    def __init__(self, features: int, ensemble_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ensemble_size, 1, features))
        self.bias = nn.Parameter(torch.zeros(ensemble_size, 1, features))

    def forward(self, x: torch.Tensor, members: Optional[torch.Tensor] = None) -> torch.Tensor:
        weight, bias = (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])
        x = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return x * weight + bias


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

        self.relu_only = activation is nn.ReLU and not layer_norm

    @property
    def linears(self) -> list[EnsembleLinear]:
        return [m for m in self.net if isinstance(m, EnsembleLinear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def forward_with_input_gradient(self, x: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs ``(N, B)`` (``out_features`` must be 1) and each member's gradient of its output with
        respect to ``x[..., columns]``: ``(N, B, width of columns)``, itself differentiable in the weights.

        The gradient is computed by an explicit backward pass through the ReLU layers, reusing this
        forward pass's activation masks. Autograd's ``grad(create_graph=True)`` would need a second
        forward, and its double backward also differentiates ReLU's backward (whose derivative is
        zero), about twice the matmuls needed (see ../shared/research/peer_speed.md on EDAC). Only
        ReLU networks without LayerNorm have this piecewise-linear form.
        """
        if not self.relu_only:
            raise ValueError("forward_with_input_gradient needs a ReLU network without LayerNorm")
        linears = self.linears
        if linears[-1].out_features != 1:
            raise ValueError("forward_with_input_gradient needs a scalar output per member")
        masks = []
        h = x
        for layer in linears[:-1]:
            h = layer(h)
            masks.append((h > 0).to(h.dtype))  # float once: a bool mask would be converted at every use
            h = h.relu()
        out = linears[-1](h).squeeze(-1)
        # d out / d h_last = w_out, shared across the batch; then back through each ReLU and layer.
        grad = linears[-1].weight.transpose(1, 2) * masks[-1]
        for layer, mask in zip(reversed(linears[1:-1]), reversed(masks[:-1])):
            grad = torch.bmm(grad, layer.weight.transpose(1, 2)) * mask
        grad = torch.bmm(grad, linears[0].weight[:, columns, :].transpose(1, 2))
        return out, grad
