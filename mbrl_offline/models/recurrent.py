"""Recurrent encoders for agents that learn from sequences (NEUBAY): the LRU of Orvieto et al. (2023) as
NEUBAY's official code has it (``memory/lru.py``, after minimal-LRU), a GRU alternative, and the
batched ensemble heads that sit on top of them.

An encoder reads a *tape* ``x (B, T, in)`` with bool ``starts (B, T)``: a True at row t means row t is
the first of an episode, so the recurrent state carried into it is dropped (not decayed). The state
passed in (``state``, one tensor per layer with the batch first) is the state before row 0, and the
state returned is the one after row T-1, so a long sequence fed in pieces gives the outputs of one pass.

LRU, per layer, with x the layer's input after its LayerNorm:

    lambda = exp(-exp(nu_log) + i exp(theta_log)),   B_norm = (B_re + i B_im) * exp(gamma_log) (row-wise),
    h_t = lambda * h_{t-1} + B_norm x_t   (h_{t-1} replaced by 0 where starts_t),
    y_t = Re(C h_t) + D * x_t,            C = C_re + i C_im.

The recurrence runs in `lru_scan`, forward and backward written out (`_LRUScan`). On a CPU (complex64) it
runs as two compiled C loops over the rows (`mbrl_offline.models.scan_kernel`: the sequential recurrence
and its adjoint, one call each); elsewhere, or where no C compiler is found, as a parallel prefix scan
of torch operators (`_scan`: about log2 T elementwise rounds instead of T sequential steps).
`lru_scan_reference` is the sequential loop of torch operators, which the tests compare both with.

Deviations from the official code, each with its reason:

* the official code scans with ``jax.lax.associative_scan`` (a work-efficient Blelloch scan); here, on a
  CPU, the rows run in order in a C loop (`mbrl_offline.models.scan_kernel`: the scan's torch operators
  have a fixed cost each, and they were about an eighth of NEUBAY's update at the official sizes), and
  elsewhere Hillis-Steele scans in two levels, within chunks of about sqrt(T) rows and then over the
  chunks (`_scan`: no private torch API, no compilation); each gives the same values up to float
  rounding, and the backward is written out (`lru_scan`);
* the LRU's B and C maps and the GLU's two output maps run as one real product each (`LRU.forward`,
  `SequenceLayer.forward`): the same sums in another order;
* the encoders' products (``pre``, B, C, the GLU) and the heads' first layer on the history features,
  which every head reads, run on the oneDNN library in torch's wheel where MKL runs code below the
  CPU's (AMD CPUs with AVX-512; `mbrl_offline.models.products`), the heads' as one product with the
  heads' maps side by side (`EnsembleLinear`): the same sums, in float rounding only different from
  MKL's, and there about twice as fast;
* on a CPU, at activations of 1M elements or more (NEUBAY's official 10 heads x 2047 rows x 256), the
  heads' LayerNorm, affine map, leaky ReLU and 1-wide output layer run as compiled fused kernels
  (`FusedKernels`, ``torch.compile``; XLA fuses them in the official code too): the same functions in
  another order of float rounding;
* at initialisation the uniform draws u behind ``nu_log`` and ``theta_log`` are kept at or above the
  smallest positive float32: with u = 0 the official code gives ``theta_log = log 0 = -inf`` (and, with
  r_min = 0, ``nu_log = +inf``), a non-finite parameter (probability about 2^-24 per entry);
* `GRUEncoder` is a library extension (not in the official code): ``torch.nn.GRU`` with the same
  reset semantics, for ablations.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models import scan_kernel
from mbrl_offline.models.ensemble import (EnsembleLayerNorm, EnsembleLinear, column_product, layer_norm_affine,
                                         member_parameters)
from mbrl_offline.models.products import linear

try:  # torch's own helper (private): which dispatch mode is active, if any (see `FusedKernels.call`)
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # another torch: no mode is assumed
    def _get_current_dispatch_mode():
        return None

ENCODERS = ("lru", "gru")


def lru_scan(lam: torch.Tensor, bx: torch.Tensor, starts: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """The LRU's hidden states ``h (..., T, H)`` for ``h_t = lambda * h_{t-1} + bx_t``, where
    ``h_{t-1}`` is replaced by 0 at rows with ``starts_t``, from ``h_{-1} = h0``.

    ``lam (H,)`` complex, ``bx (..., T, H)`` complex, ``starts (..., T)`` bool, ``h0 (..., H)`` complex.

    The official code scans the T + 1 elements ``(A_t, b_t, s_t)`` (element 0 the carried state) with
    ``jax.lax.associative_scan`` and an operator that lets a right element with ``s_t`` replace
    everything to its left (``wrapped_associative_update``). Here the recurrence
    ``h_t = lambda keep_t h_{t-1} + b_t`` (``keep_t = not starts_t``) runs, on a CPU, row by row in a C
    loop (`mbrl_offline.models.scan_kernel`), and elsewhere with the carried state folded into row 0
    (``b_0 + lambda h0``, unless row 0 starts) as Hillis-Steele's scans in two levels (`_scan`): the same values
    up to float rounding, in about log2 T rounds of elementwise work, half of them over the whole
    tape. Since lambda is the same at every row, a window's coefficient is a power of lambda times a
    0/1 column, so no per-row complex coefficient is kept. The backward is written out (`_LRUScan`: the
    recurrence run backwards); the tests compare it with autograd through `lru_scan_reference`.
    """
    dtype = bx.dtype
    h0 = h0.to(dtype).expand(*bx.shape[:-2], bx.shape[-1])  # a state shared by every row: its gradient sums
    if bx.shape[-2] == 1:  # one step (acting, an exported policy): h_0 = lambda keep_0 h0 + bx_0, no scan
        keep = (~starts.bool()).to(bx.real.dtype)  # (..., 1)
        return bx + (lam.to(dtype) * h0 * keep).unsqueeze(-2)
    return _LRUScan.apply(lam.to(dtype), bx, starts.bool(), h0)


def _scan(lam: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``h_t = lambda keep_t h_{t-1} + b_t`` from ``h_{-1} = 0`` along dim -2, without autograd.
    ``lam (H,)`` complex, ``b (..., T, H)`` complex and contiguous (overwritten: the states are computed
    in its memory), ``keep (..., T, 1)`` real 0/1.

    In two levels, so that the full tape is passed over fewer times: the T rows are cut into chunks of
    C rows (C = 2^floor(log2(T) / 2), 32 for T = 2048; the last chunk padded with b = 0, keep = 1) and
    each chunk is scanned on its own from a zero state (`_scan_chunks`, log2 C rounds over the tape).
    The state after each chunk, ``S_c = A_c S_{c-1} + e_c`` with e_c the chunk's last local state and
    ``A_c = lambda^C`` times the product of its keeps, is a scan of T / C elements (`_scan_coefficients`).
    Then row i of chunk c adds what enters from before its chunk: ``lambda^(i+1)`` times the product of
    the chunk's keeps up to row i, times ``S_{c-1}``. 5 + 1 passes over the tape instead of 11 for
    T = 2048; the same values up to float rounding (the tests compare both with the sequential loop).

    The 0/1 keeps multiply as real numbers, through the real view of the complex states (``addcmul``
    on ``view_as_real``): a complex product with a real tensor would first copy it to complex numbers
    and then run a complex product, and these passes are bound by memory (a tape's states are 2 MB)."""
    steps = b.shape[-2]
    size = 1 << ((steps.bit_length() - 1) // 2)
    if size < 2:
        return _scan_chunks(lam, b, keep)[0]
    chunks = -(-steps // size)
    if chunks * size != steps:  # pad the last chunk: zero inputs after the tape change none of its rows
        pad = chunks * size - steps
        b = torch.cat([b, b.new_zeros(*b.shape[:-2], pad, b.shape[-1])], dim=-2)
        keep = torch.cat([keep, keep.new_ones(*keep.shape[:-2], pad, 1)], dim=-2)
    b, keep = b.unflatten(-2, (chunks, size)), keep.unflatten(-2, (chunks, size))  # (..., n, C, H), (..., n, C, 1)
    h, window = _scan_chunks(lam, b, keep)  # window: product of the keeps from the chunk's first row on
    powers = torch.cumprod(lam.expand(size, -1), dim=0)  # lambda^(i+1), (C, H)
    carry = _scan_coefficients(powers[-1] * window[..., -1, :], h[..., -1, :].clone())  # S_c, (..., n, H)
    entering = torch.cat([torch.zeros_like(carry[..., :1, :]), carry[..., :-1, :]], dim=-2)  # S_{c-1}
    torch.view_as_real(h).addcmul_(torch.view_as_real(entering.unsqueeze(-2) * powers), window.unsqueeze(-1))
    h = h.flatten(-3, -2)
    return h[..., :steps, :].contiguous() if chunks * size != steps else h


def _scan_chunks(lam: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hillis-Steele's scan of ``h_t = lambda keep_t h_{t-1} + b_t`` along dim -2 from a zero state, in
    ceil(log2 T) rounds, each one product and one sum over the rows, in ``b``'s memory (overwritten).
    After round r, row t holds the sum of its last 2^r terms ``b_j lambda^(t - j)`` (those after a row
    whose keep is 0 dropped), and the product of the keeps of those rows (``window``, one real column:
    the powers of lambda need no tensor per row). Returns ``(h, window)``, h being ``b``, window then
    the product of the keeps of rows 0..t."""
    h, window, power = b, keep.clone(), lam.clone()
    h_real = torch.view_as_real(h)
    steps, shift = b.shape[-2], 1
    while shift < steps:
        carried = h[..., :-shift, :] * power  # a new tensor: h's rows are read before written
        h_real[..., shift:, :, :].addcmul_(torch.view_as_real(carried), window[..., shift:, :].unsqueeze(-1))
        window[..., shift:, :] *= window[..., :-shift, :].clone()
        power = power * power
        shift *= 2
    return h, window


def _scan_coefficients(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``S_c = a_c S_{c-1} + s_c`` from ``S_{-1} = 0`` along dim -2, for coefficients ``a`` that differ
    from element to element (Hillis-Steele; ``a`` and ``s`` are overwritten). Used on the chunks' end
    states, a few dozen elements."""
    shift, steps = 1, s.shape[-2]
    while shift < steps:
        s[..., shift:, :] += a[..., shift:, :] * s[..., :-shift, :]
        a[..., shift:, :] *= a[..., :-shift, :].clone()
        shift *= 2
    return s


class _LRUScan(torch.autograd.Function):
    """`lru_scan` with its backward written out: the adjoint of a linear recurrence is the same
    recurrence run backwards, with the conjugate coefficients (torch's convention for complex
    gradients: the gradient of y = c x in x is conj(c) times y's), so the backward is one more scan
    and one product and sum for lambda's gradient, instead of autograd's graph of every round. Both
    directions run as the C loops of `mbrl_offline.models.scan_kernel` where they apply (``ctx.compiled``),
    else as `_scan` and torch operators."""

    @staticmethod
    def forward(ctx, lam, bx, starts, h0):
        ctx.compiled = scan_kernel.applies(lam, bx)
        if ctx.compiled:  # the C loops (`mbrl_offline.models.scan_kernel`), over (S, T, H) sequences
            steps, states = bx.shape[-2:]
            keep = (~starts).expand(bx.shape[:-1]).to(torch.float32).reshape(-1, steps)
            h0 = h0.reshape(-1, states)
            h = scan_kernel.forward(bx.reshape(-1, steps, states), keep, lam, h0)
            ctx.save_for_backward(lam, h0, keep, h)
            return h.view(bx.shape)
        keep = (~starts).to(lam.real.dtype).unsqueeze(-1)  # (..., T, 1): 0 where the carried state is dropped
        b = bx.clone()
        b[..., 0, :] += lam * h0 * keep[..., 0, :]  # the carried state enters row 0
        h = _scan(lam, b, keep)
        ctx.save_for_backward(lam, h0, keep, h)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        lam, h0, keep, h = ctx.saved_tensors
        if ctx.compiled:
            g, grad_lam = scan_kernel.backward(grad_h.reshape(h.shape), h, keep, lam, h0)
            grad_h0 = None
            if ctx.needs_input_grad[3]:  # conj(lambda) keep_0 g_0, in h0's (expanded) shape
                grad_h0 = (lam.conj() * keep[:, :1] * g[:, 0, :]).view(*grad_h.shape[:-2], -1)
            return (grad_lam if ctx.needs_input_grad[0] else None), g.view(grad_h.shape), None, grad_h0
        # g_t = grad_h_t + conj(lambda) keep_{t+1} g_{t+1}: the forward scan on the reversed rows
        keep_next = torch.cat([keep[..., 1:, :], torch.zeros_like(keep[..., :1, :])], dim=-2)
        g = _scan(lam.conj(), grad_h.flip(-2), keep_next.flip(-2)).flip(-2)  # flip copies: _scan may overwrite it
        grad_lam = None
        if ctx.needs_input_grad[0]:  # sum over rows of conj(keep_t h_{t-1}) g_t, with h_{-1} = h0
            previous = torch.cat([h0.unsqueeze(-2), h[..., :-1, :]], dim=-2)
            torch.view_as_real(previous).mul_(keep.unsqueeze(-1))  # keep_t h_{t-1}: the 0/1 keeps as real numbers
            grad_lam = (previous.conj() * g).reshape(-1, g.shape[-1]).sum(0)
        grad_h0 = lam.conj() * keep[..., 0, :] * g[..., 0, :] if ctx.needs_input_grad[3] else None
        return grad_lam, g, None, grad_h0


def lru_scan_reference(lam: torch.Tensor, bx: torch.Tensor, starts: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """`lru_scan` as the sequential loop it computes (for tests): T steps of
    ``h = (0 if starts_t else lambda * h) + bx_t``."""
    h = h0.to(bx.dtype).expand(*bx.shape[:-2], bx.shape[-1])
    states = []
    for t in range(bx.shape[-2]):
        carried = torch.where(starts[..., t, None].bool(), torch.zeros_like(h), lam * h)
        h = carried + bx[..., t, :]
        states.append(h)
    return torch.stack(states, dim=-2)


class Block(nn.Module):
    """Linear -> LayerNorm (affine, eps 1e-5) -> leaky ReLU (slope 0.01): the official ``common.Block``,
    applied to every row independently."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # U(+-1/sqrt(fan_in)) weights and biases, as Equinox's
        self.norm = nn.LayerNorm(out_features, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.norm(linear(x, self.linear.weight, self.linear.bias)), 0.01)


class LRU(nn.Module):
    """The linear recurrent unit: input and output ``d_model`` wide, ``d_hidden`` complex states.

    Initialisation (official ``nu_init``, ``theta_init``, ``gamma_log_init``, ``matrix_init``), with
    u ~ U[0, 1) drawn separately for nu and theta:
    ``nu_log = log(-log(u (r_max^2 - r_min^2) + r_min^2) / 2)`` (so |lambda|^2 is uniform on
    [r_min^2, r_max^2]), ``theta_log = log(max_phase u)``, ``gamma_log = log sqrt(1 - |lambda|^2)`` (then
    trained as a parameter of its own), ``B_re, B_im ~ N(0, 1) / sqrt(2 d_model)``,
    ``C_re, C_im ~ N(0, 1) / sqrt(d_hidden)``, ``D ~ N(0, 1)``.
    """

    def __init__(self, d_model: int, d_hidden: int, r_min: float = 0.0, r_max: float = 0.9, max_phase: float = 6.28):
        super().__init__()
        if not 0.0 <= r_min < r_max <= 1.0:
            raise ConfigError(f"LRU radii need 0 <= r_min < r_max <= 1, got r_min = {r_min}, r_max = {r_max}.")
        self.d_model, self.d_hidden = d_model, d_hidden
        tiny = torch.finfo(torch.float32).tiny  # u = 0 would give a non-finite log (see the module docstring)
        u = torch.rand(d_hidden).clamp_min(tiny)
        nu_log = torch.log(-0.5 * torch.log(u * (r_max ** 2 - r_min ** 2) + r_min ** 2))
        theta_log = torch.log(max_phase * torch.rand(d_hidden).clamp_min(tiny))
        modulus = torch.exp(-torch.exp(nu_log))
        self.nu_log = nn.Parameter(nu_log)
        self.theta_log = nn.Parameter(theta_log)
        self.gamma_log = nn.Parameter(torch.log(torch.sqrt(1 - modulus ** 2)))
        self.B_re = nn.Parameter(torch.randn(d_hidden, d_model) / math.sqrt(2 * d_model))
        self.B_im = nn.Parameter(torch.randn(d_hidden, d_model) / math.sqrt(2 * d_model))
        self.C_re = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(d_hidden))
        self.C_im = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(d_hidden))
        self.D = nn.Parameter(torch.randn(d_model))

    def eigenvalues(self) -> torch.Tensor:
        """lambda ``(d_hidden,)`` complex64."""
        return torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))

    def interleaved_maps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``B_norm`` and ``C`` as real matrices on interleaved (real, imaginary) columns, the layout of a
        complex tensor: ``(2 d_hidden, d_model)`` with rows alternating ``gamma B_re`` and ``gamma B_im``
        (so ``B_norm x`` is one real product, read as complex without a copy), and ``(d_model, 2 d_hidden)``
        with columns alternating ``C_re`` and ``-C_im`` (so ``Re(C h) = C_re h_re - C_im h_im`` is one product
        on h's parts as stored)."""
        gamma = torch.exp(self.gamma_log).unsqueeze(-1)
        b_interleaved = torch.stack([self.B_re * gamma, self.B_im * gamma], dim=1).reshape(2 * self.d_hidden, -1)
        c_interleaved = torch.stack([self.C_re, -self.C_im], dim=-1).reshape(self.d_model, 2 * self.d_hidden)
        return b_interleaved, c_interleaved

    def forward(self, x: torch.Tensor, starts: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (..., T, d_model)``, ``starts (..., T)``, ``h0 (..., d_hidden)`` complex -> outputs
        ``(..., T, d_model)`` and the last state ``(..., d_hidden)``."""
        b_interleaved, c_interleaved = self.interleaved_maps()
        bx = torch.view_as_complex(linear(x, b_interleaved).unflatten(-1, (self.d_hidden, 2)))  # (B_re + i B_im) gamma x
        h = lru_scan(self.eigenvalues(), bx, starts, h0)
        y = linear(torch.view_as_real(h).flatten(-2), c_interleaved) + self.D * x  # Re(C h) + D x
        return y, h[..., -1, :]


class SequenceLayer(nn.Module):
    """skip -> LayerNorm -> LRU -> GELU (tanh approximation, JAX's default) -> GLU -> + skip, the GLU
    being ``out1(g) * sigmoid(out2(g))`` (official ``lru.SequenceLayer``). The LRU's D x term uses the
    normalised input; the residual adds the input before normalisation."""

    def __init__(self, d_model: int, d_hidden: int, r_min: float = 0.0, r_max: float = 0.9, max_phase: float = 6.28):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=1e-5)
        self.lru = LRU(d_model, d_hidden, r_min, r_max, max_phase)
        self.out1 = nn.Linear(d_model, d_model)
        self.out2 = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, starts: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h_last = self.lru(self.norm(x), starts, h0)
        g = F.gelu(y, approximate="tanh")
        # out1(g) and out2(g) as one product with the two maps side by side
        weight = torch.cat([self.out1.weight, self.out2.weight])
        gate_in, gate = linear(g, weight, torch.cat([self.out1.bias, self.out2.bias])).chunk(2, dim=-1)
        return x + gate_in * torch.sigmoid(gate), h_last


class StackedLRU(nn.Module):
    """``layers`` `SequenceLayer` s, no normalisation after the stack; the state is one complex64
    ``(B, d_hidden)`` tensor per layer."""

    def __init__(self, d_model: int, d_hidden: int, layers: int = 2, r_min: float = 0.0, r_max: float = 0.9,
                 max_phase: float = 6.28):
        super().__init__()
        self.d_model, self.d_hidden = d_model, d_hidden
        self.layers = nn.ModuleList(SequenceLayer(d_model, d_hidden, r_min, r_max, max_phase) for _ in range(layers))

    def initial_state(self, batch_size: int, device=None) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, self.d_hidden, dtype=torch.complex64, device=device) for _ in self.layers]

    def forward(self, x: torch.Tensor, starts: torch.Tensor, state: list[torch.Tensor]):
        """``x (B, T, d_model)``, ``starts (B, T)``, ``state`` per layer ``(B, d_hidden)`` -> ``(y, state)``."""
        new_state = []
        for layer, h0 in zip(self.layers, state):
            x, h_last = layer(x, starts, h0)
            new_state.append(h_last)
        return x, new_state


class GRUEncoder(nn.Module):
    """``torch.nn.GRU(d_model, d_model, layers)`` with episode resets (a library extension, for
    ablations): the state is one ``(B, d_model)`` tensor per layer.

    A tape of T > 1 rows is split at its starts into episodes, which run as one packed sequence (each
    from the carried state if it is the row's first piece and row 0 is no start, else from zeros). A
    single step (T = 1) zeroes the state where it starts and runs the GRU once. Splitting reads the
    episode lengths on the host (a device sync), which the LRU's scan does not need."""

    def __init__(self, d_model: int, layers: int = 2):
        super().__init__()
        self.d_model, self.num_layers = d_model, layers
        self.gru = nn.GRU(d_model, d_model, layers, batch_first=True)

    def initial_state(self, batch_size: int, device=None) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, self.d_model, device=device) for _ in range(self.num_layers)]

    def forward(self, x: torch.Tensor, starts: torch.Tensor, state: list[torch.Tensor]):
        rows, steps, width = x.shape
        h0 = torch.stack(state)  # (layers, B, d)
        if steps == 1:
            y, h_last = self.gru(x, h0 * (~starts[:, 0]).to(h0.dtype)[None, :, None])
            return y, list(h_last.unbind(0))
        # Pieces: every row splits at its starts (row 0 always begins one). In flat positions b * T + t,
        # each piece ends where the next begins, since the next row's first piece begins at (b + 1) T.
        begins = starts.bool().clone()
        begins[:, 0] = True
        row, step = begins.nonzero(as_tuple=True)
        first = row * steps + step
        end = torch.cat([first[1:], first.new_full((1,), rows * steps)])
        lengths = end - first
        carried = ((step == 0) & ~starts[row, 0].bool()).to(h0.dtype)
        h_init = h0[:, row] * carried[None, :, None]  # (layers, pieces, d)
        longest = int(lengths.max())
        offsets = torch.arange(longest, device=x.device)
        valid = offsets[None, :] < lengths[:, None]  # (pieces, longest)
        index = (first[:, None] + offsets[None, :]).clamp_max(rows * steps - 1)
        padded = x.reshape(rows * steps, width)[index]  # (pieces, longest, d)
        packed = nn.utils.rnn.pack_padded_sequence(padded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h_last = self.gru(packed, h_init.contiguous())
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=longest)
        y = x.new_zeros(rows * steps, self.d_model).index_put((index[valid],), out[valid])
        last_piece = (end % steps == 0).nonzero(as_tuple=True)[0]  # each row's last piece, in row order
        return y.reshape(rows, steps, self.d_model), list(h_last[:, last_piece].unbind(0))


class RecurrentEncoder(nn.Module):
    """``pre`` (a `Block`, in -> d_model, per row) then the memory (`StackedLRU` or `GRUEncoder`):
    NEUBAY's history encoder (official ``pre`` + ``memory``).

    ``forward(x (B, T, in) | (T, in), starts (B, T) | (T,), state=None) -> (y (..., T, d_model), state)``;
    ``state`` None is the zero state (`initial_state`). An unbatched tape is a batch of one: its state
    tensors have batch 1.
    """

    def __init__(self, in_dim: int, kind: str = "lru", d_model: int = 256, d_hidden: int = 128, layers: int = 2,
                 r_min: float = 0.0, r_max: float = 0.9, max_phase: float = 6.28):
        super().__init__()
        if kind not in ENCODERS:
            raise ConfigError(f"unknown encoder '{kind}'; choose one of {', '.join(ENCODERS)}.")
        self.in_dim, self.kind, self.d_model = in_dim, kind, d_model
        self.pre = Block(in_dim, d_model)
        self.memory = (StackedLRU(d_model, d_hidden, layers, r_min, r_max, max_phase) if kind == "lru"
                       else GRUEncoder(d_model, layers))

    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        return self.memory.initial_state(batch_size, device=self.pre.linear.weight.device)

    def forward(self, x: torch.Tensor, starts: torch.Tensor, state: Optional[list[torch.Tensor]] = None):
        unbatched = x.dim() == 2
        if unbatched:
            x, starts = x.unsqueeze(0), starts.unsqueeze(0)
        if x.dim() != 3 or x.shape[-1] != self.in_dim or starts.shape != x.shape[:2]:
            raise InputError(f"RecurrentEncoder: inputs must be (B, T, {self.in_dim}) or (T, {self.in_dim}) with starts "
                             f"(B, T) or (T,), got {tuple(x.shape)} and {tuple(starts.shape)}.")
        if state is None:
            state = self.initial_state(x.shape[0])
        y, state = self.memory(self.pre(x), starts.bool(), state)
        return (y[0] if unbatched else y), state


def norm_act(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """A hidden layer's tail in `EnsembleHeads`: `EnsembleLayerNorm`'s function (`layer_norm_affine`, the
    per-member affine map ``(N, 1, F)``), then leaky ReLU (0.01)."""
    return F.leaky_relu(layer_norm_affine(h, weight, bias, eps), 0.01)


def next_layer(h: torch.Tensor, linear_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float) -> torch.Tensor:
    """A later hidden layer after its product ``h (N, R, F)``: its bias ``(N, 1, F)``, then `norm_act`."""
    return norm_act(h + linear_bias, weight, bias, eps)


def last_layer(h: torch.Tensor, linear_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               out_weight: torch.Tensor, out_bias: torch.Tensor) -> torch.Tensor:
    """`next_layer`, then a 1-wide output layer ``(N, F, 1)``, ``(N, 1, 1)`` as a product and a sum
    (`column_product`)."""
    return column_product(next_layer(h, linear_bias, weight, bias, eps), out_weight, out_bias)


class FusedKernels:
    """`norm_act`, `next_layer` and `last_layer` as Inductor's fused C++ kernels (``torch.compile``),
    forward and backward, where they pay: on a CPU, for activations of at least ``FUSE_FROM`` elements.

    Eager autograd runs a hidden layer's tail as separate passes over the ``(N, R, F)`` activations
    (LayerNorm, the affine map, the activation and the 1-wide output column, each with its backward, and
    a copy of the bias that ``baddbmm`` adds to), and at NEUBAY's official sizes (10 heads x 2047 rows x
    256) those passes were about a third of the update's time; fused, they are a few passes per layer
    (docs/performance.md measures the update). Smaller activations gain nothing that pays for the
    compilation, so they stay eager. The kernels compute the same functions in another order of float
    rounding. Compiling needs a C++ compiler: if it fails, the
    layers run eagerly for the rest of the process, after one warning that says why.
    """

    FUSE_FROM = 1 << 20
    failed: Optional[str] = None
    _compiled: dict = {}

    @classmethod
    def wanted(cls, device: torch.device, elements: int) -> bool:
        return cls.failed is None and device.type == "cpu" and elements >= cls.FUSE_FROM

    @classmethod
    def call(cls, fn, *args):
        # Under a dispatch mode (torch's FLOP counter, for one) dynamo would give up on the function for
        # good, so that call runs eagerly and a later one compiles.
        if cls.failed is None and _get_current_dispatch_mode() is None:
            if fn not in cls._compiled:
                cls._compiled[fn] = torch.compile(fn, dynamic=False)
            try:
                return cls._compiled[fn](*args)
            except Exception as error:  # no C++ compiler, or Inductor cannot build here: eager from now on
                text = str(error).strip()
                cls.failed = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]
                warnings.warn(f"the critic heads' fused kernels could not be compiled ({cls.failed}); they run "
                              f"eagerly (slower, the same results). algo.fused_heads=false skips the attempt.")
        return fn(*args)


class EnsembleHeads(nn.Module):
    """``members`` MLP heads computed together: ``layers`` x [EnsembleLinear -> EnsembleLayerNorm ->
    leaky ReLU (0.01)] of ``hidden`` units, then an EnsembleLinear to ``out_dim``: NEUBAY's critic heads
    (official ``CriticHead``, vmapped) as one batched product per layer.

    Every layer starts as Equinox's Linear, U(+-1/sqrt(fan_in)) weights and biases; with ``final_scale``
    the output layer is U(+-sqrt(final_scale / fan_in)) with zero biases (official ``final_linear``).
    ``forward(x (R, in) shared | (N, R, in) | [shared (R, in_i) parts], members=None) -> (N, R, out_dim)``;
    ``members`` (indices) evaluates only those heads; parts are the columns of one input, kept apart so
    that autograd differentiates only in the parts that need it (`EnsembleLinear`). ``fused``: each
    hidden layer's LayerNorm, affine map and activation (with the last one, a 1-wide output layer too)
    as fused kernels where they pay (`FusedKernels`).
    """

    def __init__(self, in_dim: int, out_dim: int, members: int, hidden: int = 256, layers: int = 2,
                 final_scale: Optional[float] = None, fused: bool = False):
        super().__init__()
        self.members, self.fused = members, fused
        self.linears = nn.ModuleList()
        self.norms = nn.ModuleList()
        width = in_dim
        for _ in range(layers):
            self.linears.append(EnsembleLinear(width, hidden, members))
            self.norms.append(EnsembleLayerNorm(hidden, members))
            width = hidden
        self.out = EnsembleLinear(width, out_dim, members)
        if final_scale is not None:
            with torch.no_grad():
                bound = math.sqrt(final_scale / width)
                self.out.weight.uniform_(-bound, bound)
                self.out.bias.zero_()

    def forward(self, x: "torch.Tensor | list[torch.Tensor]", members: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.fused and self._fuse(x, members):
            return self._fused_forward(x, members)
        for linear, norm in zip(self.linears, self.norms):
            # in place: the LayerNorm's affine output is saved by nothing (10 heads x 2047 rows x 256 is 21 MB)
            x = F.leaky_relu(norm(linear(x, members), members), 0.01, inplace=True)
        return self.out(x, members)

    def _fuse(self, x: "torch.Tensor | list[torch.Tensor]", members: Optional[torch.Tensor]) -> bool:
        first = x[0] if isinstance(x, (list, tuple)) else x
        heads = self.members if members is None else len(members)
        return FusedKernels.wanted(first.device, heads * first.shape[-2] * self.linears[0].out_features)

    def _fused_forward(self, x: "torch.Tensor | list[torch.Tensor]", members: Optional[torch.Tensor]) -> torch.Tensor:
        """`forward` with each hidden layer's elementwise work in `FusedKernels` (the same function)."""
        for i, (linear, norm) in enumerate(zip(self.linears, self.norms)):
            weight, bias = member_parameters(norm, members)
            if i == 0:  # shared inputs or parts: EnsembleLinear's products, bias included
                x = FusedKernels.call(norm_act, linear(x, members), weight, bias, norm.eps)
                continue
            linear_weight, linear_bias = member_parameters(linear, members)
            h = torch.bmm(x, linear_weight)  # its bias is added in the fused kernel
            if i == len(self.linears) - 1 and self.out.out_features == 1:
                return FusedKernels.call(last_layer, h, linear_bias, weight, bias, norm.eps,
                                         *member_parameters(self.out, members))
            x = FusedKernels.call(next_layer, h, linear_bias, weight, bias, norm.eps)
        return self.out(x, members)
