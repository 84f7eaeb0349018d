"""Affine maps ``x W^T + b`` whose products run on the oneDNN library in torch's CPU wheel where MKL
would run code below the CPU's.

Why: torch's x86 wheels do fp32 products with Intel's MKL, which picks its code by the CPU's vendor:
on AMD CPUs with AVX-512 (Zen 4, Zen 5) it runs its AVX2 code, at about half of what the CPU can do.
The oneDNN library in the same wheel picks its code by instruction set on any vendor's CPU, and it is
what torch itself uses for convolutions. On such a CPU (`mbrl_offline.platform.would_help`), unless
``MBRL_OFFLINE_MKL_AVX512=1`` already lets MKL run its AVX-512 code (`mbrl_offline.platform.is_on`),
`linear` routes a float32 CPU product to oneDNN, with its backward written out (`_OneDNNLinear`: the
input's gradient and the weight's gradient are two more oneDNN products, the bias's a sum). Anything
else (another CPU, another dtype, a GPU, a torch without oneDNN, a small product) runs
`torch.nn.functional.linear`: where MKL already runs the CPU's best code, oneDNN gained nothing
(docs/performance.md). The values are the same sums in another order: they differ from MKL's in float
rounding only (`tests/test_products.py` compares values and gradients with autograd through
``F.linear``). The speed-up is measured in ``docs/performance.md`` (NEUBAY's update).

It is used where the products are large and plain (one weight for every row): NEUBAY's recurrent
encoders and actor head, and the first layer of its critic heads, whose input is shared by every head
(`mbrl_offline.models.recurrent`). torch exposes no batched fp32 product on oneDNN, so products with a
weight per member (`EnsembleLinear`) stay on MKL's ``baddbmm``.

`set_enabled(False)` sends every product to ``F.linear`` (for comparisons); ``ROUTE_CPU`` (None: decided
from the CPU and MKL's code at the first product) says whether this CPU routes at all.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch.nn import functional as F

from mbrl_offline import platform

_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_enabled = True
ROUTE_CPU: Optional[bool] = None  # None: `_cpu_routes` decides at the first product


def available() -> bool:
    """Whether this torch has oneDNN's product (``torch.ops.mkldnn._linear_pointwise``)."""
    return _AVAILABLE


def routes() -> bool:
    """Whether large float32 CPU products go to oneDNN in this process (see the module docstring)."""
    return _enabled and _cpu_routes()


def set_enabled(enabled: bool) -> None:
    """Turn the oneDNN route on or off for the process (on at import)."""
    global _enabled
    _enabled = bool(enabled)


@contextmanager
def disabled() -> Iterator[None]:
    """Every `linear` inside runs ``F.linear``; the previous setting comes back on exit."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def _product(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x2 (R, in) @ weight (out, in)^T + bias`` on oneDNN (no autograd)."""
    return torch.ops.mkldnn._linear_pointwise(x2, weight, bias, "none", [], "")


# Products of fewer multiply-adds than this stay on MKL: a oneDNN call has a fixed cost of its own,
# more than it saves on a product this small (docs/performance.md). An episode's step
# (one row) stays on MKL.
MIN_MULTIPLY_ADDS = 1 << 21


def _cpu_routes() -> bool:
    """Whether this CPU's products go to oneDNN: where MKL runs its AVX2 code on a CPU with AVX-512
    (an AMD one) and ``MBRL_OFFLINE_MKL_AVX512=1`` did not let it run its AVX-512 code. Decided once."""
    global ROUTE_CPU
    if ROUTE_CPU is None:
        ROUTE_CPU = _AVAILABLE and platform.would_help() and not platform.is_on()
    return ROUTE_CPU


def _routed(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.dim() >= 2 and weight.dim() == 2 and x.numel() * weight.shape[0] >= MIN_MULTIPLY_ADDS
            and routes())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x (..., in)``, ``weight (out, in)``, ``bias (out,)`` or None;
    on oneDNN for float32 CPU tensors (see the module docstring)."""
    if not _routed(x, weight):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _OneDNNLinear.apply(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    return _product(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])


class _OneDNNLinear(torch.autograd.Function):
    """`linear` with its backward written out: for ``y = x W^T + b`` and the gradient g of y, the input's
    gradient is ``g W`` (a product with the weight ``W^T``), the weight's ``g^T x`` (from the transposed
    views, with the narrower of x and g as the product's input: oneDNN copies that one, and reads the
    other in place) and the bias's the sum of g's rows."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.in_shape = x.shape
        return _product(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(g2, weight.t().contiguous(), None).view(ctx.in_shape)
        if ctx.needs_input_grad[1]:  # the narrower of x and g as the product's input reads fastest
            if weight.shape[1] <= weight.shape[0]:
                grad_weight = _product(x2.t(), g2.t(), None).t()  # (x^T g)^T
            else:
                grad_weight = _product(g2.t(), x2.t(), None)
        if ctx.needs_input_grad[2]:
            grad_bias = g2.sum(0)
        return grad_x, grad_weight, grad_bias


__all__ = ["available", "disabled", "linear", "routes", "set_enabled"]
