"""Diffusion models of experience: EDM (Karras et al. 2022) training and its stochastic Heun sampler,
with optional guidance of the sampler, per-dimension normalisation, EMA weights and the library's
disk cache. The diffusion generators build on it: ``generator=synther`` (SynthER, Lu et al. 2023:
single transitions) and policy-guided diffusion (Jackson et al. 2024: trajectory windows).

The parts, each usable alone:

* `EDMConfig`: EDM's constants (training noise distribution, preconditioning, sampler schedule);
* `ElucidatedDiffusion`: a raw network ``F(x, c_noise)`` wrapped in EDM's preconditioning
  (`ElucidatedDiffusion.denoise` is EDM's D), its training `loss`, its noise schedule (`sigmas`) and
  its stochastic Heun sampler (`sample`), optionally guided (`Guidance`) and with known entries held
  fixed (`KnownEntries`: inpainting, as Diffuser conditions on the current state);
* `Normalizer`: per-dimension z-scoring of the last axis (SynthER's ``standard`` normaliser);
* `ResidualMLPDenoiser`: SynthER's denoiser; `DENOISERS` names the denoisers by kind (``resmlp``, and PGD's
  ``unet``, `mbrl_offline.models.unet.TemporalUNet`);
* `DiffusionTrainConfig` and `fit_diffusion`: the training loop, with EMA weights kept by torch's
  `torch.optim.swa_utils.AveragedModel`;
* `DiffusionModel`: the saved bundle (normaliser, EDM constants, denoiser kind and settings, EMA
  weights) that samples in the data's own units, and `load_or_fit_diffusion`, which fits it once per
  data and settings through `mbrl_offline.cache`.

Everything runs on autograd; nothing is hand-differentiated. What is written here and what is
torch's: the EDM mathematics (preconditioning, loss, schedule, sampler, guidance) and the denoiser are
written here, in a few lines each, following the official codes; the EMA is torch's ``AveragedModel``
with ``get_ema_multi_avg_fn`` (the maintained piece the official code's ``ema_pytorch`` corresponds
to), the optimiser torch's ``AdamW`` and the schedules torch's ``LambdaLR``.

Sources read: SynthER's PyTorch code (conglu1997/SynthER: ``synther/diffusion/elucidated_diffusion.py``,
``denoiser_network.py``, ``norm.py``, ``config/resmlp_denoiser.gin``) and policy-guided diffusion's JAX
code (EmptyJackson/policy-guided-diffusion: ``diffusion/edm.py``). Both use the same EDM constants
(`EDMConfig`'s defaults) and ``c_noise = ln(sigma) / 4``.

Deviations from the official codes, and why:

* EMA: SynthER's ``ema_pytorch.EMA(beta=0.995, update_every=10)`` also has that package's warm-up
  (the EMA copies the weights for its first 100 calls, then decays with ``min(0.995, 1 - (1 + t)^(-2/3))``,
  which reaches 0.995 after about 2,800 steps). Here the EMA is torch's ``AveragedModel``: a copy of
  the weights at the first update (step ``ema_every``), then a constant decay of ``ema_decay`` every
  ``ema_every`` steps, as the issue and PGD's code describe it. Only short trainings differ.
* Training batches are drawn uniformly with replacement (SynthER: a shuffled ``DataLoader``, i.e.
  epochs without replacement); with 10^4 steps and more the two see the data alike.
* The sampler draws its churn noise only on steps that churn (SynthER draws it on every step and
  discards it where gamma = 0): the random stream differs, not the distribution.
* SynthER's ``clamp`` option (clamp D to [-1, 1] for its min-max normaliser; off for the standard
  normaliser its configs use) is not offered.
* ``euler_from="unchurned"`` reproduces PGD's sampler, whose Euler step starts from the un-churned x
  while its Heun correction starts from the churned x-hat; the default ``"churned"`` is EDM's
  Algorithm 2 (and SynthER's).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from mbrl_offline.cache import load_or_fit
from mbrl_offline.config import (check_field_types,
                                 require_above_zero, require_fraction, require_in_range, require_nonnegative,
                                 require_positive)
from mbrl_offline.errors import CheckpointError, ConfigError, InputError, NotFittedError
from mbrl_offline.models.unet import TemporalUNet
from mbrl_offline.torch_files import load_plain, save_plain
from mbrl_offline.utils import adam_kernel, cosine_decay, progress_bar

EULER_FROM = ("churned", "unchurned")
SCHEDULES = ("cosine", "warmup_cosine", "constant")


# ------------------------------------------------------------------------------------------- configs
@dataclass
class EDMConfig:
    """EDM's constants (Karras et al. 2022, Table 1 and Algorithm 2), as SynthER's and PGD's codes set them."""

    sigma_data: float = 1.0  # std of the (normalised) data
    p_mean: float = -1.2  # training noise: ln(sigma) ~ N(p_mean, p_std^2)
    p_std: float = 1.2
    sigma_min: float = 0.002  # sampler: the smallest non-zero noise level
    sigma_max: float = 80.0  # sampler: the noise level it starts from
    rho: float = 7.0  # sampler: shape of the schedule (larger: more steps at small sigma)
    s_churn: float = 80.0  # stochasticity: gamma = min(s_churn / steps, sqrt(2) - 1) ...
    s_tmin: float = 0.05  # ... for sigma in [s_tmin, s_tmax], else 0
    s_tmax: float = 50.0
    s_noise: float = 1.003  # scale of the churn noise
    steps: int = 128  # N: Heun steps (2N - 1 network evaluations; SynthER 128, PGD 256)
    # Where the Euler step starts: "churned" (EDM's Algorithm 2, SynthER: from x-hat, the churned x)
    # or "unchurned" (PGD's official code: from x before the churn; its Heun correction still uses x-hat).
    euler_from: str = "churned"

    def __post_init__(self):
        check_field_types(self, "generator.edm")  # types first; nested mappings become configs
        require_above_zero(self, "sigma_data", "p_std", "sigma_min", "sigma_max", "rho", "s_noise",
                           section="generator.edm")
        require_in_range(self, "p_mean", section="generator.edm")
        require_nonnegative(self, "s_churn", "s_tmin", "s_tmax", section="generator.edm")
        require_positive(self, "steps", section="generator.edm")
        if self.sigma_min >= self.sigma_max:
            raise ConfigError(f"generator.edm.sigma_min ({self.sigma_min}) must be below generator.edm.sigma_max "
                              f"({self.sigma_max}).")
        if self.s_tmin > self.s_tmax:
            raise ConfigError(f"generator.edm.s_tmin ({self.s_tmin}) must not exceed generator.edm.s_tmax "
                              f"({self.s_tmax}).")
        if self.euler_from not in EULER_FROM:
            raise ConfigError(f"unknown generator.edm.euler_from '{self.euler_from}'; choose one of "
                              f"{', '.join(EULER_FROM)}.")

    # The fields that change what a model learns (the rest only change how it samples).
    TRAINING_FIELDS = ("sigma_data", "p_mean", "p_std")


@dataclass
class DiffusionTrainConfig:
    """The training loop: SynthER's recipe by default (``config/resmlp_denoiser.gin``).

    ``steps`` is the official 100,000: at the paper's width 2048 a GPU job; the CPU sizes are the quick
    budget's (``budget=quick``; docs/generators.md has the timings that chose them).

    The EMA's horizon is ``ema_every / (1 - ema_decay)`` = 2,000 steps at the defaults: a training much
    shorter than that samples from an average that still holds its early weights (lower ``ema_every``).
    """

    steps: int = 100_000  # gradient steps (SynthER: 100k)
    batch_size: Optional[int] = None  # None: SynthER's rule, 1024, or 256 below 800,000 training rows
    lr: float = 3e-4  # peak learning rate (SynthER 3e-4; PGD 2e-3)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (SynthER: 0, i.e. Adam)
    betas: tuple = (0.9, 0.99)  # AdamW's betas (SynthER)
    # Learning-rate schedule: "cosine" (SynthER: cosine from lr to 0 over the steps), "warmup_cosine"
    # (PGD: linear from 0.1 lr to lr over warmup_fraction of the steps, then cosine to 0), "constant".
    schedule: str = "cosine"
    warmup_fraction: float = 0.1  # warmup_cosine only
    grad_clip: Optional[float] = 1.0  # clip of the gradient's global norm (SynthER: 1.0); None: no clipping
    ema_decay: float = 0.995  # EMA of the weights, which is what samples (both codes: 0.995 ...)
    ema_every: int = 10  # ... updated every 10 steps

    def __post_init__(self):
        check_field_types(self, "generator.train")  # types first; nested mappings become configs
        require_positive(self, "steps", "batch_size", "ema_every", section="generator.train")
        require_above_zero(self, "lr", section="generator.train")
        require_nonnegative(self, "weight_decay", section="generator.train")
        require_fraction(self, "warmup_fraction", "ema_decay", section="generator.train")
        if self.grad_clip is not None:
            require_above_zero(self, "grad_clip", section="generator.train", hint=" (null: no clipping)")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown generator.train.schedule '{self.schedule}'; choose one of "
                              f"{', '.join(SCHEDULES)}.")
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"generator.train.betas must be two numbers in [0, 1), got {list(self.betas)}.")
        self.betas = tuple(float(b) for b in self.betas)

    def batch_for(self, rows: int) -> int:
        """The batch size for ``rows`` training rows (SynthER: 1024, or 256 below 800k rows)."""
        if self.batch_size is not None:
            return self.batch_size
        return 256 if rows < 800_000 else 1024


# ------------------------------------------------------------------------------------------- EDM
@dataclass
class Guidance:
    """Guidance of the sampler, exactly as PGD's ``sample_trajectory`` applies it (``diffusion/edm.py``).

    Before denoising step k of N (none at the last), x moves by ``lambda_k * g`` with
    ``lambda_k = scale * ((1 - k / N) + cosine_coeff * sin(pi (k + 1) / N))`` (`guidance_weights`) and
    ``g = grad(x)``, the gradient of the summed target log-likelihood with respect to x (normalised space;
    PGD: the policy's log-likelihood of the action channels, zero elsewhere). ``grad`` runs with autograd
    enabled; `Guidance.from_log_prob` builds it from a log-likelihood function.

    * ``normalize``: ``g / ||g|| + 1e-8`` per sample, the norm over all of a sample's entries (PGD: the
      Frobenius norm of one trajectory's action block; its 1e-8 is added after the division);
    * ``denoised``: g is evaluated at the denoised estimate D(x; sigma) instead of x (no gradient flows
      through the denoiser: the log-likelihood is differentiated with respect to D's output, taken as
      a leaf), and still moves x itself, as in PGD's ``denoised_guidance``;
    * ``mask``: the entries that move (broadcastable to a sample's shape, e.g. the action channels);
      None: every entry (``grad`` is zero outside the guided channels anyway; the mask also keeps the
      normalisation's 1e-8 off the other channels, as in PGD, which adds it to the actions only).

    A ``scale`` of 0 is no guidance: ``grad`` is never called and samples equal unguided ones bit for bit.
    """

    grad: Callable[[Tensor], Tensor]
    scale: float = 0.0  # lambda (PGD's policy_guidance_coeff; its default 0 is unguided)
    cosine_coeff: float = 0.3  # PGD's policy_guidance_cosine_coeff
    normalize: bool = False  # PGD's normalize_action_guidance
    denoised: bool = False  # PGD's denoised_guidance
    mask: Optional[Tensor] = None

    def __post_init__(self):
        if not callable(self.grad):
            raise ConfigError("Guidance.grad must be a function from x to the gradient of the log-likelihood.")
        require_in_range(self, "scale", section="guidance")
        require_in_range(self, "cosine_coeff", section="guidance")

    @staticmethod
    def from_log_prob(log_prob: Callable[[Tensor], Tensor], **settings) -> "Guidance":
        """Guidance whose ``grad`` is autograd's gradient of ``log_prob(x).sum()`` with respect to x."""
        def grad(x: Tensor) -> Tensor:
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                return torch.autograd.grad(log_prob(x).sum(), x)[0]
        return Guidance(grad=grad, **settings)


@dataclass
class KnownEntries:
    """Entries of the samples that are known (inpainting), in normalised space: where ``mask`` is true the
    sample is ``values``, whatever the sampler does. Diffuser (Janner et al. 2022, ``apply_conditioning``)
    conditions its trajectories on the current state this way: the known entries are written into x at
    the start (over the sigma_max noise) and again after every step, so the denoiser always sees them
    clean and the other entries are denoised around them; the last write leaves them exactly ``values``.

    ``mask`` (bool) and ``values`` broadcast to the samples' shape ``(B, *event)`` (e.g. a mask of one
    event's shape, values with a batch axis). `DiffusionModel.sample` draws its batches from the leading
    axis of each where it has one per sample."""

    mask: Tensor
    values: Tensor

    def __post_init__(self):
        if not isinstance(self.mask, Tensor) or not isinstance(self.values, Tensor):
            raise InputError("KnownEntries takes a boolean mask tensor and a tensor of values.")
        self.mask = self.mask.bool()

    def expand(self, shape: Sequence[int], device, dtype) -> tuple[Tensor, Tensor]:
        """``(mask, values)`` broadcast to ``shape`` on ``device``; a shape they do not broadcast to is refused."""
        try:
            return (self.mask.to(device).broadcast_to(tuple(shape)),
                    self.values.to(device, dtype).broadcast_to(tuple(shape)))
        except RuntimeError:
            raise InputError(f"known entries of shapes {tuple(self.mask.shape)} (mask) and {tuple(self.values.shape)} "
                             f"(values) do not broadcast to the samples' shape {tuple(shape)}.") from None

    def rows(self, start: int, stop: int, shape: Sequence[int]) -> "KnownEntries":
        """The entries of samples ``start:stop`` of samples of ``shape`` (n, *event): a tensor with the
        samples' axis (as many axes as ``shape``, the first of n) is sliced, one without it is kept."""
        def part(t: Tensor) -> Tensor:
            return t[start:stop] if t.dim() == len(shape) and t.shape[0] == shape[0] else t
        return KnownEntries(part(self.mask), part(self.values))


def guidance_weights(scale: float, cosine_coeff: float, steps: int) -> list[float]:
    """lambda_k for k = 0 .. steps - 1: ``scale ((1 - k/N) + cosine_coeff sin(pi (k+1)/N))``, 0 at the last."""
    return [scale * ((1 - k / steps) + cosine_coeff * math.sin(math.pi * (k + 1) / steps)) if k < steps - 1 else 0.0
            for k in range(steps)]


class ElucidatedDiffusion(nn.Module):
    """EDM around a raw network ``net(x, c_noise)`` (x: (B, *event), c_noise: (B,)), in normalised space."""

    def __init__(self, net: nn.Module, config: EDMConfig = EDMConfig()):
        super().__init__()
        self.net, self.config = net, config

    # Preconditioning (EDM Table 1): D(x; sigma) = c_skip x + c_out F(c_in x; c_noise).
    def preconditioning(self, sigma: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(c_skip, c_out, c_in, c_noise)`` at noise levels ``sigma`` (c_noise = ln(sigma)/4, as both codes)."""
        sd2 = self.config.sigma_data ** 2
        c_skip = sd2 / (sigma ** 2 + sd2)
        c_out = sigma * self.config.sigma_data / (sigma ** 2 + sd2).sqrt()
        c_in = 1.0 / (sigma ** 2 + sd2).sqrt()
        c_noise = sigma.clamp(min=1e-20).log() / 4  # SynthER clamps at 1e-20 before the log
        return c_skip, c_out, c_in, c_noise

    def denoise(self, x: Tensor, sigma: float | Tensor) -> Tensor:
        """EDM's D(x; sigma): the denoised estimate of x at noise level sigma (a number or one per sample)."""
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).expand(x.shape[0])
        c_skip, c_out, c_in, c_noise = self.preconditioning(sigma)
        pad = (-1,) + (1,) * (x.dim() - 1)
        return c_skip.view(pad) * x + c_out.view(pad) * self.net(c_in.view(pad) * x, c_noise)

    def loss_weight(self, sigma: Tensor) -> Tensor:
        """lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2."""
        sd = self.config.sigma_data
        return (sigma ** 2 + sd ** 2) / (sigma * sd) ** 2

    def loss(self, x0: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
        """EDM's training loss on clean (normalised) samples ``x0``: sigma ~ exp(N(p_mean, p_std^2)), the
        weighted squared error of D(x0 + sigma n; sigma), averaged over a sample's entries, then the batch."""
        cfg = self.config
        b = x0.shape[0]
        sigma = (cfg.p_mean + cfg.p_std * torch.randn(b, generator=generator, device=x0.device, dtype=x0.dtype)).exp()
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        pad = (-1,) + (1,) * (x0.dim() - 1)
        error = (self.denoise(x0 + sigma.view(pad) * noise, sigma) - x0) ** 2
        return (error.flatten(1).mean(1) * self.loss_weight(sigma)).mean()

    def sigmas(self, steps: Optional[int] = None) -> list[float]:
        """The sampler's noise levels: ``(s_max^(1/rho) + i/(N-1) (s_min^(1/rho) - s_max^(1/rho)))^rho`` for
        i = 0 .. N-1 (sigma_max down to sigma_min), then a final 0; N + 1 numbers (float64 arithmetic)."""
        cfg, n = self.config, steps or self.config.steps
        lo, hi = cfg.sigma_min ** (1 / cfg.rho), cfg.sigma_max ** (1 / cfg.rho)
        if n == 1:
            return [cfg.sigma_max, 0.0]
        return [(hi + i / (n - 1) * (lo - hi)) ** cfg.rho for i in range(n)] + [0.0]

    def sample(self, shape: Sequence[int], generator: Optional[torch.Generator] = None,
               noise: Optional[Tensor] = None, guidance: Optional[Guidance] = None,
               steps: Optional[int] = None, known: Optional[KnownEntries] = None) -> Tensor:
        """Samples of ``shape`` (B, *event) in normalised space by EDM's stochastic Heun sampler.

        ``noise``: the starting N(0, I) draw (scaled by sigma_max here; default: drawn from ``generator``);
        the churn noise is drawn from ``generator``. No Heun correction on the last step (to sigma = 0).
        ``known``: entries held at given values (`KnownEntries`: set at the start and after every step, as
        Diffuser conditions on the current state), so they come out exactly; without it (or with an
        all-false mask) the samples are bit for bit those of the unconditioned sampler with the same draws.
        Runs without gradients, except inside ``guidance.grad``."""
        cfg = self.config
        n = steps or cfg.steps
        device = next(self.net.parameters()).device
        sigmas = self.sigmas(n)
        gamma_in_range = min(cfg.s_churn / n, math.sqrt(2) - 1)
        weights = guidance_weights(guidance.scale, guidance.cosine_coeff, n) if guidance is not None else None
        with torch.no_grad():
            if noise is None:
                noise = torch.randn(tuple(shape), generator=generator, device=device)
            elif tuple(noise.shape) != tuple(shape):
                raise InputError(f"sample's noise has shape {tuple(noise.shape)}, not the requested {tuple(shape)}.")
            x = noise.to(device) * sigmas[0]
            if known is not None:
                known_mask, known_values = known.expand(x.shape, device, x.dtype)
                x = torch.where(known_mask, known_values, x)
            for k in range(n):
                sigma, sigma_next = sigmas[k], sigmas[k + 1]
                if weights is not None and weights[k] != 0.0:
                    x = self._guide(x, sigma, weights[k], guidance)
                gamma = gamma_in_range if cfg.s_tmin <= sigma <= cfg.s_tmax else 0.0
                sigma_hat = sigma * (1 + gamma)
                x_hat = x
                if gamma > 0:  # churn: raise the noise level from sigma to sigma_hat
                    eps = cfg.s_noise * torch.randn(x.shape, generator=generator, device=device)
                    x_hat = x + math.sqrt(sigma_hat ** 2 - sigma ** 2) * eps
                slope = (x_hat - self.denoise(x_hat, sigma_hat)) / sigma_hat
                start = x_hat if cfg.euler_from == "churned" else x
                x_next = start + (sigma_next - sigma_hat) * slope  # Euler step
                if sigma_next > 0:  # Heun correction (always from x_hat)
                    slope_next = (x_next - self.denoise(x_next, sigma_next)) / sigma_next
                    x_next = x_hat + 0.5 * (sigma_next - sigma_hat) * (slope + slope_next)
                x = x_next if known is None else torch.where(known_mask, known_values, x_next)
        return x

    def _guide(self, x: Tensor, sigma: float, weight: float, guidance: Guidance) -> Tensor:
        """x moved by ``weight * g`` (see `Guidance`)."""
        at = self.denoise(x, sigma) if guidance.denoised else x  # no gradient through the denoiser
        with torch.enable_grad():  # grad may use autograd (the sampler runs under no_grad)
            g = guidance.grad(at.detach()).detach()
        if tuple(g.shape) != tuple(x.shape):
            raise InputError(f"Guidance.grad returned shape {tuple(g.shape)} for x of shape {tuple(x.shape)}.")
        if guidance.normalize:
            norm = g.flatten(1).norm(dim=1).view((-1,) + (1,) * (x.dim() - 1))
            g = g / norm + 1e-8  # as PGD: the 1e-8 after the division
        if guidance.mask is not None:
            g = g * guidance.mask.to(g.device, g.dtype)
        return x + weight * g


# ------------------------------------------------------------------------------------------- parts
class Normalizer(nn.Module):
    """Per-dimension z-scoring of the last axis: ``(x - mean) / std`` (SynthER's ``standard`` normaliser:
    unbiased std + eps; ``skip_dims`` keep mean 0 and std 1, as SynthER does for the terminal flag)."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    @classmethod
    def fit(cls, data: Tensor, eps: float = 1e-5, skip_dims: Sequence[int] = ()) -> "Normalizer":
        """Statistics over every row of ``data`` (all axes but the last)."""
        flat = data.reshape(-1, data.shape[-1]).double()
        normalizer = cls(data.shape[-1]).to(data.device)
        normalizer.mean.copy_(flat.mean(0))
        normalizer.std.copy_(flat.std(0) + eps if len(flat) > 1 else torch.ones_like(flat[0]))
        skip = list(skip_dims)
        if skip:
            normalizer.mean[skip], normalizer.std[skip] = 0.0, 1.0
        return normalizer

    def normalize(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def unnormalize(self, x: Tensor) -> Tensor:
        return x * self.std + self.mean


class ResidualMLPDenoiser(nn.Module):
    """SynthER's denoiser (``denoiser_network.py``): ``proj(x) + time(c_noise)`` (both ``dim_t`` wide), then
    Linear(dim_t -> width), ``blocks`` residual blocks ``h + Linear(ReLU(LN(h)))``, LN, ReLU, Linear(width -> d_in).

    The time embedding is random Fourier features ``[c, sin(2 pi w c), cos(2 pi w c)]`` (w: fourier_dim/2
    fixed N(0, 1) frequencies, a buffer here, a frozen parameter there), then Linear(fourier_dim + 1 ->
    dim_t), SiLU, Linear(dim_t -> dim_t). LayerNorm (``layer_norm``) is off in SynthER's config.

    Sizes: the paper's is width 2048, 6 blocks (``config/resmlp_denoiser.gin``; 25.5M parameters for
    hopper's 27 inputs), the default here; ``budget=quick`` sets width 256 (0.46M) for a 2-core CPU
    (docs/generators.md has the timings that chose it). A sample takes 2N - 1 = 255 evaluations at 128
    steps, so the paper's 5M samples at width 2048 (about 65 PFLOP) are a GPU job.
    """

    def __init__(self, d_in: int, width: int = 256, blocks: int = 6, dim_t: int = 128, fourier_dim: int = 16,
                 layer_norm: bool = False):
        super().__init__()
        if fourier_dim % 2:
            raise ConfigError(f"generator.denoiser.fourier_dim must be even, got {fourier_dim}.")
        self.register_buffer("frequencies", torch.randn(fourier_dim // 2))
        self.time = nn.Sequential(nn.Linear(fourier_dim + 1, dim_t), nn.SiLU(), nn.Linear(dim_t, dim_t))
        self.proj = nn.Linear(d_in, dim_t)
        self.inp = nn.Linear(dim_t, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) if layer_norm else nn.Identity() for _ in range(blocks))
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.final_norm = nn.LayerNorm(width) if layer_norm else nn.Identity()
        self.out = nn.Linear(width, d_in)

    def forward(self, x: Tensor, c_noise: Tensor) -> Tensor:
        c = c_noise.view(-1, 1)
        angles = 2 * math.pi * c * self.frequencies
        h = self.proj(x) + self.time(torch.cat([c, angles.sin(), angles.cos()], dim=-1))
        h = self.inp(h)
        for norm, layer in zip(self.norms, self.layers):
            h = h + layer(torch.relu(norm(h)))
        return self.out(torch.relu(self.final_norm(h)))


@dataclass
class ResidualMLPConfig:
    """`ResidualMLPDenoiser`'s settings (``generator.denoiser.*``); paper: width 2048, 6 blocks."""

    width: int = 2048  # paper 2048 (budget=quick: 256; see ResidualMLPDenoiser)
    blocks: int = 6  # residual blocks (paper 6)
    dim_t: int = 128  # width of the input projection and the time embedding (paper 128)
    fourier_dim: int = 16  # random Fourier features of the noise level (paper 16)
    layer_norm: bool = False  # paper: off

    def __post_init__(self):
        check_field_types(self, "generator.denoiser")  # types first; nested mappings become configs
        require_positive(self, "width", "blocks", "dim_t", "fourier_dim", section="generator.denoiser")
        if self.fourier_dim % 2:
            raise ConfigError(f"generator.denoiser.fourier_dim must be even, got {self.fourier_dim}.")


# kind -> network class, built as cls(d_in, **kwargs) with d_in the size of the event's last axis
DENOISERS: dict[str, type[nn.Module]] = {"resmlp": ResidualMLPDenoiser, "unet": TemporalUNet}


# ------------------------------------------------------------------------------------------- training
def _lr_factor(config: DiffusionTrainConfig) -> Callable[[int], float]:
    """The learning rate's factor at each step (for ``LambdaLR``)."""
    total = config.steps
    if config.schedule == "constant":
        return lambda step: 1.0
    if config.schedule == "cosine":  # torch's CosineAnnealingLR(T_max=steps, eta_min=0), in closed form
        return lambda step: cosine_decay(step, total)
    warmup = max(1, int(config.warmup_fraction * total))

    def warmup_cosine(step: int) -> float:  # optax.warmup_cosine_decay_schedule(0.1 lr, lr, warmup, total)
        if step < warmup:
            return 0.1 + 0.9 * step / warmup
        return cosine_decay(min(step - warmup, total - warmup), max(1, total - warmup))
    return warmup_cosine


def fit_diffusion(model: ElucidatedDiffusion, data: Tensor, config: DiffusionTrainConfig = DiffusionTrainConfig(),
                  generator: Optional[torch.Generator] = None, progress: bool = False,
                  callback: Optional[Callable[[int, nn.Module, AveragedModel], None]] = None
                  ) -> tuple[AveragedModel, list[dict]]:
    """Train ``model`` on ``data`` ((N, *event), already normalised, on the model's device) for
    ``config.steps`` steps of `ElucidatedDiffusion.loss` with AdamW, the schedule and gradient clipping.

    Returns the EMA of the network's weights (torch's ``AveragedModel``: a copy at the first update, then
    ``ema_decay`` every ``ema_every`` steps; ``.module`` is the network that samples; with fewer steps
    than ``ema_every`` it is the final weights) and a log of the mean loss per 1000 steps.
    ``callback(step, net, ema)`` runs after each step (steps counted from 1), e.g. for tests."""
    net = model.net
    device = next(net.parameters()).device
    data = data.to(device)
    batch = config.batch_for(len(data))
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(config.ema_decay))
    optimizer = torch.optim.AdamW(net.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
                                  **adam_kernel())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(config))
    log, running, count = [], torch.zeros((), device=device), 0
    net.train()
    with progress_bar(total=config.steps, desc="diffusion", disable=not progress) as bar:
        for step in range(1, config.steps + 1):
            index = torch.randint(0, len(data), (batch,), generator=generator, device=device)
            loss = model.loss(data[index], generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
            optimizer.step()
            scheduler.step()
            if step % config.ema_every == 0:
                ema.update_parameters(net)
            running, count = running + loss.detach(), count + 1
            if step % 1000 == 0 or step == config.steps:
                log.append({"step": step, "loss": (running / count).item()})
                bar.set_postfix(loss=f"{log[-1]['loss']:.4f}")
                running, count = torch.zeros((), device=device), 0
            if callback is not None:
                callback(step, net, ema)
            bar.update(1)
    if int(ema.n_averaged) == 0:  # fewer steps than ema_every: the EMA is the final weights
        ema.update_parameters(net)
    net.eval()
    ema.eval()
    return ema, log


# ------------------------------------------------------------------------------------------- the bundle
class DiffusionModel(nn.Module):
    """A fitted diffusion model: normaliser, EDM constants, denoiser (kind and settings) with its EMA
    weights. `sample` returns samples in the data's own units; `save`/`load` write and read one file of
    tensors and plain data (`mbrl_offline.torch_files`).

    As `mbrl_offline.models.dynamics.GaussianEnsembleDynamics`, a model knows whether it was fitted:
    `sample` raises `NotFittedError` on one that was neither fitted nor loaded (its samples would be
    noise). The flag is the buffer ``fitted``, saved with the weights (a file saved before the flag
    existed counts as fitted: only fitted models were saved); `mark_fitted` sets it for weights set by
    hand (`fit_diffusion` on ``model.diffusion``, benchmarks of random weights)."""

    def __init__(self, event_shape: Sequence[int], denoiser: str = "resmlp", denoiser_kwargs: Optional[dict] = None,
                 edm: EDMConfig = EDMConfig(), skip_dims: Sequence[int] = ()):
        super().__init__()
        if denoiser not in DENOISERS:
            raise ConfigError(f"unknown denoiser '{denoiser}'; choose one of {', '.join(DENOISERS)}.")
        self.event_shape, self.denoiser_kind = tuple(int(d) for d in event_shape), denoiser
        self.denoiser_kwargs, self.skip_dims = dict(denoiser_kwargs or {}), tuple(int(d) for d in skip_dims)
        self.diffusion = ElucidatedDiffusion(DENOISERS[denoiser](self.event_shape[-1], **self.denoiser_kwargs), edm)
        self.normalizer = Normalizer(self.event_shape[-1])
        self.train_log: list[dict] = []
        self.register_buffer("fitted", torch.tensor(False))  # saved with the weights
        self.is_fitted = False  # the buffer's value as a Python bool (no device sync in `sample`)

    def mark_fitted(self) -> "DiffusionModel":
        """Count the model as fitted (`fit` does this; call it after setting the weights yourself)."""
        self.fitted.fill_(True)
        self.is_fitted = True
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.setdefault(prefix + "fitted", torch.tensor(True))  # saved before the flag: a fitted model's
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.is_fitted = bool(self.fitted)

    @property
    def edm(self) -> EDMConfig:
        return self.diffusion.config

    def fit(self, data: Tensor, config: DiffusionTrainConfig = DiffusionTrainConfig(),
            generator: Optional[torch.Generator] = None, progress: bool = False) -> "DiffusionModel":
        """Fit the normaliser on ``data`` (unnormalised, (N, *event_shape)), train, keep the EMA weights."""
        if tuple(data.shape[1:]) != self.event_shape:
            raise InputError(f"data of shape {tuple(data.shape)} does not match the model's events {self.event_shape}.")
        device = next(self.parameters()).device
        data = data.to(device, torch.float32)
        self.normalizer = Normalizer.fit(data, skip_dims=self.skip_dims)
        ema, self.train_log = fit_diffusion(self.diffusion, self.normalizer.normalize(data), config, generator, progress)
        self.diffusion.net.load_state_dict(ema.module.state_dict())
        return self.mark_fitted()

    def sample(self, n: int, generator: Optional[torch.Generator] = None, guidance: Optional[Guidance] = None,
               steps: Optional[int] = None, batch_size: Optional[int] = None,
               event_shape: Optional[Sequence[int]] = None, known: Optional[KnownEntries] = None) -> Tensor:
        """``n`` samples (n, *event_shape) in the data's units, drawn ``batch_size`` at a time (default all).
        ``guidance`` and ``known`` (`KnownEntries`, inpainting) work in normalised space (`normalizer` maps
        between the two). ``event_shape``: another shape the denoiser accepts, with the same last axis (a
        convolutional denoiser takes windows of any length: PGD generates 129 rows from a model trained on
        32); default the training shape."""
        if not self.is_fitted:
            raise NotFittedError("this DiffusionModel was never fitted, so its samples are noise; call fit(data) "
                                 "first, load a fitted one (DiffusionModel.load, load_or_fit_diffusion), or call "
                                 "mark_fitted() after setting its weights yourself.")
        device = next(self.parameters()).device
        event_shape = tuple(event_shape or self.event_shape)
        if event_shape[-1] != self.event_shape[-1]:
            raise InputError(f"event_shape {event_shape} must end in the model's {self.event_shape[-1]} features.")
        batch_size = batch_size or n
        parts = []
        for start in range(0, n, batch_size):
            count = min(batch_size, n - start)
            part = known.rows(start, start + count, (n, *event_shape)) if known is not None else None
            x = self.diffusion.sample((count, *event_shape), generator, guidance=guidance, steps=steps, known=part)
            parts.append(self.normalizer.unnormalize(x))
        return torch.cat(parts) if parts else torch.zeros((0, *event_shape), device=device)

    def save(self, path: str | Path) -> Path:
        save_plain({"event_shape": list(self.event_shape), "denoiser": self.denoiser_kind,
                    "denoiser_kwargs": self.denoiser_kwargs, "edm": asdict(self.edm), "skip_dims": list(self.skip_dims),
                    "state_dict": self.state_dict(), "train_log": self.train_log}, path)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu",
             edm: Optional[EDMConfig] = None) -> "DiffusionModel":
        """A model written by `save` (read with ``weights_only=True``); ``edm`` replaces the saved sampler
        settings (the training fields must agree: they shaped the weights)."""
        saved = load_plain(path, map_location, "If it is a cached model, delete it and it is fitted again; "
                                               "otherwise load only files from a source you trust.")
        if not isinstance(saved, dict) or not {"event_shape", "denoiser", "edm", "state_dict"} <= saved.keys():
            raise CheckpointError(f"{path} is not a saved DiffusionModel (DiffusionModel.save writes one); pass a "
                                  f"model file, or delete a damaged cached one to fit it again.")
        saved_edm = EDMConfig(**saved["edm"])
        if edm is not None:
            changed = [k for k in EDMConfig.TRAINING_FIELDS if getattr(edm, k) != getattr(saved_edm, k)]
            if changed:
                raise ConfigError(f"{path} was trained with other generator.edm settings ({', '.join(changed)}).")
        model = cls(saved["event_shape"], saved["denoiser"], saved["denoiser_kwargs"], edm or saved_edm,
                    saved.get("skip_dims", ()))
        model.load_state_dict(saved["state_dict"])
        model.train_log = saved.get("train_log", [])
        return model.to(map_location).eval()


def data_fingerprint(data: Tensor) -> str:
    """A hash of a tensor's shape, dtype and values."""
    array = data.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{tuple(array.shape)}{array.dtype}".encode())
    digest.update(array.numpy().tobytes())
    return digest.hexdigest()[:20]


def load_or_fit_diffusion(data: Tensor, denoiser_kind: str = "resmlp", denoiser_kwargs: Optional[dict] = None,
                          edm: EDMConfig = EDMConfig(), train: DiffusionTrainConfig = DiffusionTrainConfig(),
                          cache_dir: Optional[str | Path] = None, fingerprint: Optional[str] = None,
                          name: str = "diffusion", skip_dims: Sequence[int] = (), seed: int = 0,
                          device: str | torch.device = "cpu", progress: bool = True) -> tuple[DiffusionModel, Path]:
    """The `DiffusionModel` trained on ``data`` ((N, *event), unnormalised): loaded from the cache
    (`mbrl_offline.cache`, kind ``diffusion``) if it was trained before, else fitted and saved there.

    The key is ``fingerprint`` (default: a hash of ``data``; pass e.g. the dataset's fingerprint plus how
    the rows were made) and the settings that shape the weights: the denoiser, the training settings,
    EDM's training fields, ``skip_dims`` and ``seed`` (the torch seed of the fit). The sampler settings
    (steps, churn, ...) are not in the key: a cached model samples with the ``edm`` given here. The
    caller's torch random state is left as it was, whether the model is fitted or loaded."""
    if denoiser_kind not in DENOISERS:
        raise ConfigError(f"unknown denoiser '{denoiser_kind}'; choose one of {', '.join(DENOISERS)}.")
    settings = {"event_shape": list(data.shape[1:]), "denoiser": denoiser_kind,
                "denoiser_kwargs": dict(denoiser_kwargs or {}),
                "edm": {k: getattr(edm, k) for k in EDMConfig.TRAINING_FIELDS}, "train": asdict(train),
                "skip_dims": list(skip_dims), "seed": seed}

    def fit() -> DiffusionModel:
        torch.manual_seed(seed)  # the denoiser's init
        model = DiffusionModel(data.shape[1:], denoiser_kind, denoiser_kwargs, edm, skip_dims).to(device)
        rng = torch.Generator(device=torch.device(device)).manual_seed(seed)
        return model.fit(data, train, rng, progress)

    where = torch.device(device)
    cuda = [where.index if where.index is not None else torch.cuda.current_device()] if where.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        return load_or_fit("diffusion", name, fingerprint or data_fingerprint(data), settings, fit,
                           save=lambda model, path: model.save(path),
                           load=lambda path: DiffusionModel.load(path, map_location=device, edm=edm),
                           cache_dir=cache_dir)


__all__ = ["DENOISERS", "DiffusionModel", "DiffusionTrainConfig", "EDMConfig", "ElucidatedDiffusion", "Guidance",
           "KnownEntries", "Normalizer", "ResidualMLPConfig", "ResidualMLPDenoiser", "data_fingerprint",
           "fit_diffusion", "guidance_weights", "load_or_fit_diffusion"]
