"""`TemporalUNet`: policy-guided diffusion's 1-D temporal U-Net over trajectory windows ``(B, T, C)``.

The denoiser of PGD (Jackson et al., RLC 2024), written in PyTorch from the layer list of the official
JAX code (EmptyJackson/policy-guided-diffusion, ``models/diffusion.py``):

* **time embedding**: the noise level's ``c_noise`` (EDM: ln(σ)/4) through sinusoidal features of
  ``base // 8`` frequencies (sin and cos: ``base // 4`` numbers), Linear(base/4 → base), swish,
  Linear(base → base);
* **encoder**: ``levels`` blocks; block i has ``base·2^i`` channels: Conv(k3) + Linear(swish(t)) added,
  GroupNorm(8), ReLU, Conv(k3), GroupNorm(8), ReLU; its output is kept as the skip, then max-pooled by
  2 (the last block's pooled output is unused, as in the official code);
* **decoder**: from the deepest skip, for i = levels−2 … 0: nearest-neighbour resize to skip i's
  length (so any T works, odd ones included), Conv(k2) + Linear(swish(t)), GroupNorm, ReLU,
  concatenate skip i, then 2 × [Conv(k3), GroupNorm, ReLU];
* **output**: Conv(k1) back to C channels.

Sizes. The paper's (``paper_size``): 3 levels at base 1024, i.e. 1024/2048/4096 channels, about
178M parameters for walker2d or halfcheetah windows (17 + 6 + 2 = 25 channels; ``unet_parameter_count``
computes it, and a test checks it on the meta device). That is a GPU model: one 129-row trajectory is
≈19 GFLOP per network evaluation, and the default of ``generator=pgd``. ``budget=quick`` sets **base 32**
(32/64/128 channels; about 0.2M parameters for 25 channels): the conv cost grows with base², so 32 is ~1000× cheaper than
the paper's per row, which makes fitting on a small dataset and one generation of a few hundred
129-row trajectories a CPU job (docs/generators.md has their timings). It still has the paper's depth
and block structure; only the width differs.

Deviations from the official code, all numerically minor:

* the nearest-neighbour resize is torch's ``nearest-exact`` (half-pixel centres, as
  ``jax.image.resize(method="nearest")``); for the power-of-two lengths of training they duplicate
  rows identically;
* GroupNorm's epsilon is Flax's 1e-6 (torch's default is 1e-5), kept as the official;
* initialisation is PyTorch's default (Kaiming-uniform) instead of Flax's (LeCun-normal kernels, zero
  biases);
* ``T`` must be at least ``2^(levels−1)`` rows (the deepest level needs one row); the official code
  fails there too, less clearly.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from mbrl_offline.errors import ConfigError, InputError

PAPER_BASE = 1024  # the paper's base channels (official --num_features)
PAPER_LEVELS = 3  # the paper's levels (official --num_blocks)


def _swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


# `_Conv1d` computes a convolution as one matrix product on a CPU when its weights are at least this many
# numbers (2048 x 2048 x 3: the paper-size U-Net's two deeper levels) and it has at most this many
# positions (batch x rows); `_Conv1d`'s docstring says why.
MATMUL_MIN_WEIGHTS = 2048 * 2048 * 3
MATMUL_MAX_POSITIONS = 512


class _Conv1d(nn.Conv1d):
    """`nn.Conv1d` (stride 1, no dilation, one group) that, on a CPU, computes a wide convolution on few
    positions as one matrix product: the inputs' windows gathered into ``(batch x rows, C_in x k)``
    (``unfold``), times the weights as ``(C_in x k, C_out)``. Same values and gradients (autograd
    through both; a test compares them with ``F.conv1d``).

    Why: torch's CPU convolution (oneDNN) re-lays its weights out at every call, which dominates when
    the weights are large and the positions few: the paper-size U-Net (base 1024) on a CPU
    (docs/performance.md). With smaller weights or more positions the convolution was as fast or
    faster, so it is kept there, and the library's default U-Net (base 32) never takes the product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, rows = x.shape
        if (x.device.type != "cpu" or self.weight.numel() < MATMUL_MIN_WEIGHTS
                or batch * rows > MATMUL_MAX_POSITIONS):
            return super().forward(x)
        k, pad = self.kernel_size[0], self.padding[0]
        windows = F.pad(x, (pad, pad)).unfold(2, k, 1)  # (B, C_in, rows out, k)
        rows_out = windows.shape[2]
        windows = windows.permute(0, 2, 1, 3).reshape(batch * rows_out, channels * k)
        out = torch.addmm(self.bias, windows, self.weight.reshape(self.out_channels, -1).t())
        return out.reshape(batch, rows_out, self.out_channels).transpose(1, 2)


class SinusoidalTimeEmbedding(nn.Module):
    """c_noise ``(B,)`` → ``(B, features)``: sinusoidal features of ``features // 8`` frequencies
    (geometric from 1 to 1/10000), Linear, swish, Linear (the official ``TimeEmbedding``)."""

    def __init__(self, features: int):
        super().__init__()
        half = features // 8
        if half < 2:
            raise ConfigError(f"the U-Net's base channels must be at least 16, got {features}.")
        scale = math.log(10000) / (half - 1)
        self.register_buffer("frequencies", torch.exp(torch.arange(half, dtype=torch.float32) * -scale),
                             persistent=False)
        self.first = nn.Linear(2 * half, features)
        self.second = nn.Linear(features, features)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        angles = t[:, None] * self.frequencies
        emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
        return self.second(_swish(self.first(emb)))


class _EncoderBlock(nn.Module):
    def __init__(self, c_in: int, channels: int, features: int, groups: int):
        super().__init__()
        self.conv1 = _Conv1d(c_in, channels, 3, padding=1)
        self.time = nn.Linear(features, channels)
        self.norm1 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv2 = _Conv1d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels, eps=1e-6)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x) + self.time(t)[:, :, None]
        x = F.relu(self.norm1(x))
        return F.relu(self.norm2(self.conv2(x)))


class _DecoderBlock(nn.Module):
    def __init__(self, c_in: int, channels: int, features: int, groups: int):
        super().__init__()
        self.up = _Conv1d(c_in, channels, 2)  # padded (0, 1) in forward: Flax's "SAME" for kernel 2
        self.time = nn.Linear(features, channels)
        self.norm0 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv1 = _Conv1d(2 * channels, channels, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv2 = _Conv1d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels, eps=1e-6)

    def forward(self, x: torch.Tensor, skip: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=skip.shape[-1], mode="nearest-exact")
        x = self.up(F.pad(x, (0, 1))) + self.time(t)[:, :, None]
        x = F.relu(self.norm0(x))
        x = torch.cat([x, skip], dim=1)
        x = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(x)))


class TemporalUNet(nn.Module):
    """PGD's 1-D temporal U-Net (see the module's docstring): ``net(x, c_noise)`` with ``x`` of shape
    ``(B, T, C)`` (rows of a trajectory window, channels last) and ``c_noise`` of shape ``(B,)`` (or a
    scalar, or any shape with B numbers) gives a tensor of ``x``'s shape, for any ``T ≥ 2^(levels−1)``.

    ``channels``: C, the row width (obs + act + 2 for PGD's [s, a, r, d] rows). ``base``: the first
    level's channels (paper 1024; ``generator=pgd budget=quick``: 32); level i has ``base·2^i``. ``levels``: the
    number of encoder blocks (paper 3). ``groups``: GroupNorm groups (8; ``base`` must be a multiple).
    """

    def __init__(self, channels: int, base: int = 32, levels: int = 3, groups: int = 8):
        super().__init__()
        for name, value in (("channels", channels), ("base", base), ("levels", levels), ("groups", groups)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"TemporalUNet's {name} must be a positive integer, got {value!r}.")
        if base % groups:
            raise ConfigError(f"TemporalUNet's base channels ({base}) must be a multiple of groups ({groups}).")
        self.channels, self.base, self.levels, self.groups = channels, base, levels, groups
        self.time = SinusoidalTimeEmbedding(base)
        widths = [base * 2 ** i for i in range(levels)]
        self.encoder = nn.ModuleList(_EncoderBlock(c_in, c, base, groups)
                                     for c_in, c in zip([channels] + widths[:-1], widths))
        self.decoder = nn.ModuleList(_DecoderBlock(widths[i + 1], widths[i], base, groups)
                                     for i in range(levels - 2, -1, -1))
        self.out = nn.Conv1d(base, channels, 1)

    @property
    def min_length(self) -> int:
        """The fewest rows a window may have: the deepest level needs at least one."""
        return 2 ** (self.levels - 1)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.channels:
            raise InputError(f"TemporalUNet takes windows of shape (batch, rows, {self.channels}), got "
                             f"{tuple(x.shape)}.")
        if x.shape[1] < self.min_length:
            raise InputError(f"TemporalUNet with {self.levels} levels needs windows of at least "
                             f"{self.min_length} rows, got {x.shape[1]}.")
        batch = x.shape[0]
        t = torch.as_tensor(c_noise, dtype=x.dtype, device=x.device).reshape(-1)
        t = t.expand(batch) if t.numel() == 1 else t.reshape(batch)
        t = _swish(self.time(t))  # the blocks' Linear layers all read swish(t), as the official code
        h = x.transpose(1, 2)  # (B, C, T): channels first for Conv1d
        skips = []
        for i, block in enumerate(self.encoder):
            h = block(h, t)
            skips.append(h)
            if i < self.levels - 1:  # the official code also pools the last level, and discards it
                h = F.max_pool1d(h, 2)
        h = skips[-1]
        for block, skip in zip(self.decoder, reversed(skips[:-1])):
            h = block(h, skip, t)
        return self.out(h).transpose(1, 2)


def unet_parameter_count(channels: int, base: int = PAPER_BASE, levels: int = PAPER_LEVELS) -> int:
    """Parameters of a `TemporalUNet`, from its layer list (no tensors made): ``unet_parameter_count(25)``
    is the paper's size for walker2d and halfcheetah windows (≈178M)."""
    def conv(c_in, c_out, k):
        return c_in * c_out * k + c_out

    def linear(n_in, n_out):
        return n_in * n_out + n_out

    def norm(c):
        return 2 * c

    widths = [base * 2 ** i for i in range(levels)]
    total = linear(2 * (base // 8), base) + linear(base, base)  # time embedding
    for c_in, c in zip([channels] + widths[:-1], widths):  # encoder
        total += conv(c_in, c, 3) + linear(base, c) + norm(c) + conv(c, c, 3) + norm(c)
    for i in range(levels - 2, -1, -1):  # decoder
        c = widths[i]
        total += conv(widths[i + 1], c, 2) + linear(base, c) + norm(c) + conv(2 * c, c, 3) + norm(c)
        total += conv(c, c, 3) + norm(c)
    return total + conv(base, channels, 1)


__all__ = ["PAPER_BASE", "PAPER_LEVELS", "SinusoidalTimeEmbedding", "TemporalUNet", "unet_parameter_count"]
