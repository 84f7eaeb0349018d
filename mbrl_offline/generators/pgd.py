"""Policy-guided diffusion (PGD; Jackson, Matthews, Lu, Ellis, Whiteson, Foerster, RLC 2024):
``generator=pgd``.

A diffusion model of trajectory windows under the behaviour distribution (`TemporalUNet` in EDM,
`mbrl_offline.models.diffusion`) samples whole synthetic trajectories; while it denoises, the action
channels move along the gradient of the *current agent's* log-likelihood, so the data move on-policy
without the compounding error of a learned dynamics model. Written from the official JAX code
(EmptyJackson/policy-guided-diffusion: ``environments/dataset.py``, ``util/data.py``,
``diffusion/edm.py``, ``diffusion/rollout_generator.py``, ``train_agent.py``, ``util/args.py``).

**Rows.** A window's rows are ``[s_t, a_t, r_t, d_t]`` (`TrajectoryRows`): the actions stored as
arctanh(clip(a, ±0.999)), the done channel the dataset's ``terminals``; the whole row is then z-scored
per dimension (the diffusion model's `Normalizer`). Decoding: actions tanh, done > 0.5. Training
windows: 32 rows, stride 8, never across an episode end nor ending in a timeout
(`mbrl_offline.data.windows`).

**Guidance** (`policy_guidance`): before each denoising step k of N (none at the last), the action
channels move by λ_k ∇_ã Σ_t log π(tanh(unnorm(ã_t)) | unnorm(s̃_t)), λ_k = λ[(1 − k/N) + 0.3 sin(π(k+1)/N)]
(`mbrl_offline.models.diffusion.Guidance`). States and the other channels get no gradient, as in the
official code (its policy distribution is built from the states outside the differentiated function).
Options: ``normalize`` (the gradient divided by its norm over one trajectory's actions) and
``denoised`` (the gradient taken at the denoised estimate D(x; σ), applied to x). A deterministic
actor guides as N(μ(s), I): TD3+BC's ``log_prob`` is that density already; the SAC family's inverts
its tanh; IQL's is its Gaussian.

**Generation** (`PGDGenerator.generate`): as the official ``SyntheticRolloutGenerator``, whole
trajectories of ``length`` rows (official 129: 128 transitions) are sampled unconditionally (no real
start states), ``trajectories`` of them per generation (official 8,192); each becomes ``length − 1``
transitions (s_t, a_t, r_t, s_{t+1}, d_t), the next state read from the next row and the last row's
action and reward discarded. The trainer generates before update 0 and every ``every`` (10,000)
updates; the **first generation is unguided** (the official generates its first set with no agent
parameters), later ones guided by the current policy. Each generation replaces the previous one
(the synthetic buffer holds one generation); batches are 16 real + 240 synthetic rows.

Deviations from the official code, and why:

* actions are mapped to [−1, 1] by the env's action box before the arctanh (and back after the tanh):
  the official code assumes D4RL's [−1, 1] actions; the map is the identity there and lets
  pendulum's [−2, 2] work;
* the policy's density is the agent's own ``log_prob`` in the env's action units; for TD3+BC's
  N(μ(s), I) that equals the official unit-variance density only where the action box is [−1, 1]
  (on pendulum's [−2, 2] the official, working in [−1, 1], would be N(μ, 4 I) in env units);
* the z-scoring uses the core's `Normalizer` (unbiased std + 1e-5; the official: biased std, a
  zero std replaced by 1); the only visible difference is for a constant channel (no terminals in
  the data), which decodes to its constant here;
* rows after a generated terminal are kept, as the official code keeps them
  (``drop_after_terminal=true`` drops them: the training windows never continue past a terminal, so
  those rows are extrapolations);
* transitions with a non-finite entry are dropped (none expected);


Sizes: the defaults are the official ones, a U-Net of base 1024 (≈178M parameters, see
`mbrl_offline.models.unet`), 10,000 epochs of the windows (≈39M steps for hopper-medium), 256 sampler
steps and 8,192 trajectories per generation (a GPU job). ``budget=quick`` (also from Python:
``build_run(..., budget="quick")``) sets a CPU's: base 32, 5,000 training steps, 32 sampler steps, 512
trajectories (docs/generators.md has their timings on a CPU).

The official λ (``policy_guidance_coeff``) is not public: its default 0 is unguided, and the paper's
values are only in its W&B report. ``guidance.scale`` defaults to 0 here too, so ``generator=pgd``
alone is unguided trajectory diffusion; set it (``generator.guidance.scale=...``) or sweep it
(``mbrl_offline/configs/sweep/pgd.yaml``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import check_field_types, require_in_range, require_positive
from mbrl_offline.data.dataset import dataset_env
from mbrl_offline.data.windows import dataset_windows, gather_windows
from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models.diffusion import (DiffusionModel, DiffusionTrainConfig, EDMConfig, Guidance, KnownEntries,
                                           load_or_fit_diffusion)
from mbrl_offline.pairing import check_policy
from mbrl_offline.registry import register_generator
from mbrl_offline.roles import GeneratorConfig, Policy

ACTION_CLIP = 0.999  # actions are clipped to ±0.999 before the arctanh (official)
ROWS_VERSION = "pgd-rows-1"  # part of the cache key: change it when the rows' encoding changes


# ------------------------------------------------------------------------------------------- configs
@dataclass
class UNetConfig:
    """`mbrl_offline.models.unet.TemporalUNet`'s settings (``generator.unet.*``)."""

    base: int = 1024  # channels of the first level; level i has base * 2^i (paper 1024: ~178M; budget=quick: 32)
    levels: int = 3  # encoder levels (paper 3); windows need at least 2^(levels-1) rows
    groups: int = 8  # GroupNorm groups (paper 8); base must be a multiple

    def __post_init__(self):
        check_field_types(self, "generator.unet")  # types first; nested mappings become configs
        require_positive(self, "base", "levels", "groups", section="generator.unet")
        if self.base % self.groups:
            raise ConfigError(f"generator.unet.base ({self.base}) must be a multiple of generator.unet.groups "
                              f"({self.groups}).")


@dataclass
class PGDGuidanceConfig:
    """Policy guidance of the sampler (``generator.guidance.*``), as the official ``sample_trajectory``."""

    # lambda (official policy_guidance_coeff). The official default is 0, i.e. unguided, and the paper's
    # values are not public (only in its W&B report): 0 here too; set it or sweep it (mbrl_offline/configs/sweep/pgd.yaml).
    scale: float = 0.0
    cosine_coeff: float = 0.3  # lambda_k = scale [(1 - k/N) + cosine_coeff sin(pi (k+1)/N)] (official 0.3)
    normalize: bool = False  # divide the gradient by its norm over one trajectory's actions (official: off)
    denoised: bool = False  # take the gradient at the denoised estimate D(x; sigma) (official: off)

    def __post_init__(self):
        check_field_types(self, "generator.guidance")  # types first; nested mappings become configs
        for name in ("scale", "cosine_coeff"):  # any finite number (a negative scale pushes away from the policy)
            require_in_range(self, name, section="generator.guidance")


def _pgd_edm() -> EDMConfig:
    # EDM's constants as PGD's code; 256 sampler steps (official; budget=quick: 32). euler_from "churned"
    # is EDM's Algorithm 2; "unchurned" is the official sampler's Euler step (from x before the churn).
    return EDMConfig(steps=256, euler_from="churned")


def _pgd_train() -> DiffusionTrainConfig:
    # PGD's recipe: Adam (betas 0.9, 0.999, no weight decay, no clipping), warmup-cosine from 0.1 lr to
    # lr = 2e-3 over the first 10% then to 0, batch 32 windows, EMA 0.995 every 10 steps. Steps: 5,000
    # where train_epochs is null (budget=quick); by default train_epochs (official 10,000) counts instead.
    return DiffusionTrainConfig(steps=5_000, batch_size=32, lr=2e-3, betas=(0.9, 0.999), schedule="warmup_cosine",
                                warmup_fraction=0.1, grad_clip=None, ema_decay=0.995, ema_every=10)


def _pgd_mixing() -> MixingConfig:
    return MixingConfig(rule="counts", real_rows=16)  # official: 16 real + 240 synthetic rows per batch


@dataclass
class PGDGeneratorConfig(GeneratorConfig):
    """``generator=pgd``: policy-guided diffusion of trajectories (see the module docstring)."""

    kind: str = "pgd"
    # Updates between generations (official synth_dataset_lifetime 10,000); 0: generate once, at the
    # start. The first generation (before update 0) is always unguided.
    every: int = 10_000
    window: int = 32  # rows per training window (official trajectory_length 32)
    stride: int = 8  # stride between training windows (official dataset_stride 8)
    unet: UNetConfig = field(default_factory=UNetConfig)  # the denoiser
    edm: EDMConfig = field(default_factory=_pgd_edm)  # EDM's constants and the sampler (steps, euler_from)
    train: DiffusionTrainConfig = field(default_factory=_pgd_train)  # fitting the diffusion model
    # Passes over the training windows (official num_epochs 10,000: ~39M steps on hopper-medium); when
    # set, it replaces train.steps by epochs x (windows // batch size). null (budget=quick): train.steps.
    train_epochs: Optional[int] = 10_000
    seed: int = 0  # torch seed of the fit (part of the cache key)
    guidance: PGDGuidanceConfig = field(default_factory=PGDGuidanceConfig)
    length: int = 129  # rows per generated trajectory: length - 1 transitions (official num_rollout_steps + 1 = 129)
    trajectories: int = 8192  # trajectories per generation (official 32 workers x 256 = 8,192; budget=quick: 512)
    sample_batch: int = 256  # trajectories per sampler call (memory; does not change the samples' law)
    drop_after_terminal: bool = False  # drop the rows after a generated terminal (official: kept)
    mixing: MixingConfig = field(default_factory=_pgd_mixing)  # real and synthetic rows per batch

    def __post_init__(self):
        super().__post_init__()  # kind, schedule and mixing (`mbrl_offline.roles.GeneratorConfig`)
        require_positive(self, "window", "stride", "trajectories", "sample_batch", "train_epochs", section="generator")
        if not isinstance(self.length, int) or isinstance(self.length, bool) or self.length < 2:
            raise ConfigError(f"generator.length must be at least 2 rows (one transition), got {self.length}.")
        for name, rows in (("window", self.window), ("length", self.length)):
            if rows < 2 ** (self.unet.levels - 1):
                raise ConfigError(f"generator.{name} ({rows}) must be at least 2^(unet.levels - 1) = "
                                  f"{2 ** (self.unet.levels - 1)} rows for a {self.unet.levels}-level U-Net.")

    @property
    def buffer_capacity(self) -> int:
        """One generation's transitions: each generation replaces the last, as the official code."""
        return self.trajectories * (self.length - 1)

    def fitted_model(self) -> Optional[str]:
        """The trajectory diffusion model is fitted into the diffusion cache."""
        return "diffusion"


# ------------------------------------------------------------------------------------------- rows
class TrajectoryRows:
    """PGD's rows ``[s, arctanh(clip(a', ±0.999)), r, d]`` (a' the action mapped to [−1, 1] by the env's
    box) and back; ``channels = obs_dim + act_dim + 2``. Normalisation is the diffusion model's."""

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, device: str | torch.device = "cpu"):
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.channels = obs_dim + act_dim + 2
        low = torch.as_tensor(np.asarray(action_low, np.float32), device=device)
        high = torch.as_tensor(np.asarray(action_high, np.float32), device=device)
        self.centre, self.half_width = (high + low) / 2, (high - low) / 2
        self.obs = slice(0, obs_dim)
        self.act = slice(obs_dim, obs_dim + act_dim)
        self.reward, self.done = obs_dim + act_dim, obs_dim + act_dim + 1

    def to(self, device) -> "TrajectoryRows":
        self.centre, self.half_width = self.centre.to(device), self.half_width.to(device)
        return self

    def encode(self, observations: Tensor, actions: Tensor, rewards: Tensor, terminals: Tensor) -> Tensor:
        """Rows ``(..., channels)`` from fields ``(..., obs_dim)``, ``(..., act_dim)``, ``(...)``, ``(...)``."""
        unit = ((actions - self.centre) / self.half_width).clamp(-ACTION_CLIP, ACTION_CLIP)
        return torch.cat([observations, torch.atanh(unit), rewards[..., None], terminals[..., None].to(rewards.dtype)],
                         dim=-1)

    def actions(self, stored: Tensor) -> Tensor:
        """Env-unit actions from the stored (unnormalised arctanh) action channels: tanh, then the box."""
        return self.centre + self.half_width * torch.tanh(stored)

    def decode(self, rows: Tensor) -> dict[str, Tensor]:
        """Fields of unnormalised rows ``(..., channels)``: observations, actions (env units), rewards,
        terminals (bool: done > 0.5)."""
        return {"observations": rows[..., self.obs], "actions": self.actions(rows[..., self.act]),
                "rewards": rows[..., self.reward], "terminals": rows[..., self.done] > 0.5}

    def transitions(self, rows: Tensor, drop_after_terminal: bool = False) -> dict[str, Tensor]:
        """Flat transitions of trajectories ``(B, L, channels)`` (unnormalised): ``(s_t, a_t, r_t,
        s_{t+1}, d_t)`` for t < L − 1 (s_{t+1} from the next row), rows with a non-finite entry dropped,
        and with ``drop_after_terminal`` the rows after each trajectory's first terminal."""
        fields = self.decode(rows[:, :-1])
        fields["next_observations"] = rows[:, 1:, self.obs]
        keep = torch.isfinite(rows[:, :-1]).all(-1) & torch.isfinite(rows[:, 1:, self.obs]).all(-1)
        if drop_after_terminal:
            earlier = torch.cumsum(fields["terminals"].long(), dim=1) - fields["terminals"].long()
            keep &= earlier == 0
        out = {k: v[keep] for k, v in fields.items()}
        out["timeouts"] = torch.zeros_like(out["terminals"])
        return out

    def dataset_rows(self, dataset) -> Tensor:
        """Every row of an `OfflineDataset`, encoded ``(N, channels)`` (float32, on this encoding's device)."""
        device = self.centre.device
        return self.encode(*(torch.as_tensor(getattr(dataset, k), device=device)
                             for k in ("observations", "actions", "rewards", "terminals")))


def training_windows(dataset, rows: TrajectoryRows, window: int, stride: int) -> Tensor:
    """The diffusion model's training data: windows ``(W, window, channels)`` of encoded, unnormalised
    rows (`mbrl_offline.data.windows`); a dataset without any window is refused in one line."""
    starts = dataset_windows(dataset, window, stride, "generator=pgd")
    encoded = rows.dataset_rows(dataset).cpu().numpy()
    return torch.from_numpy(gather_windows(encoded, starts, window))


# ------------------------------------------------------------------------------------------- guidance
def require_log_prob(policy, rows: TrajectoryRows, where: str = "guidance") -> None:
    """Refuse, in one line, a policy without a usable ``log_prob(observations, actions)``: none, or one
    that raises on a probe row (`mbrl_offline.policies.FunctionPolicy`'s has no density)."""
    log_prob = getattr(policy, "log_prob", None)
    problem = None if callable(log_prob) else "has no log_prob"
    if problem is None:
        device = rows.centre.device
        try:
            with torch.no_grad():
                log_prob(torch.zeros(1, rows.obs_dim, device=device), rows.centre[None].clone())
        except (TypeError, NotImplementedError, AttributeError) as error:
            problem = f"has no log-probability ({error})"
    if problem is not None:
        raise ConfigError(f"{where} needs the policy's log-probability, and the {type(policy).__name__} given "
                          f"{problem}; use an agent's policy, or generator.guidance.scale=0 for unguided diffusion.")


def policy_guidance(policy: Policy, rows: TrajectoryRows, normalizer, config: PGDGuidanceConfig,
                    scale: Optional[float] = None) -> Guidance:
    """The `Guidance` of PGD for ``policy``: ``grad(x)`` is ∇_x Σ_t log π(a_t | s_t) of normalised windows
    ``x (B, T, C)`` with s_t = unnorm(x)_obs and a_t = the box of tanh(unnorm(x)_act), nonzero only on
    the action channels (the states enter as constants). ``scale`` replaces ``config.scale``."""
    require_log_prob(policy, rows)
    mean, std = normalizer.mean, normalizer.std
    act = rows.act

    def grad(x: Tensor) -> Tensor:
        x = x.detach()
        observations = (x[..., rows.obs] * std[rows.obs] + mean[rows.obs]).reshape(-1, rows.obs_dim)
        with torch.enable_grad():
            action_channels = x[..., act].clone().requires_grad_(True)
            actions = rows.actions(action_channels * std[act] + mean[act]).reshape(-1, rows.act_dim)
            (g,) = torch.autograd.grad(policy.log_prob(observations, actions).sum(), action_channels)
        out = torch.zeros_like(x)
        out[..., act] = g
        return out

    mask = torch.zeros(rows.channels, device=mean.device)
    mask[act] = 1.0
    return Guidance(grad=grad, scale=config.scale if scale is None else scale, cosine_coeff=config.cosine_coeff,
                    normalize=config.normalize, denoised=config.denoised, mask=mask)


# ------------------------------------------------------------------------------------------- generator
@register_generator
class PGDGenerator:
    """The PGD generator of a run: a fitted trajectory `DiffusionModel` and the settings of a
    `PGDGeneratorConfig` (the schedule and mixing are read by the trainer)."""

    # what it gives, for the docs' tables
    summary = ("policy-guided diffusion: trajectories from a diffusion model, guided by the agent's policy "
               "(`generator.guidance.scale`)")
    config_class = PGDGeneratorConfig
    model: DiffusionModel  # the fitted diffusion model of trajectory windows
    produces = "transitions"
    recurrent_policy = False  # guidance differentiates a feed-forward policy's log pi(a|s)
    provides_dynamics = False

    def __init__(self, model: DiffusionModel, rows: TrajectoryRows, config: PGDGeneratorConfig = PGDGeneratorConfig()):
        self.model, self.rows, self.config = model, rows, config
        self.generations = 0  # generations made so far: the first one is unguided

    @property
    def buffer_capacity(self) -> int:
        return self.config.buffer_capacity

    @property
    def extra_fields(self) -> dict:
        return {}

    @classmethod
    def for_dataset(cls, config: PGDGeneratorConfig, dataset, device: str | torch.device = "cpu",
                    cache_dir: Optional[str | Path] = None, model_path: Optional[str | Path] = None,
                    progress: bool = True) -> "PGDGenerator":
        """The generator for ``dataset``: the diffusion model from ``model_path``, or from the cache
        (fitted on ``dataset``'s windows with ``config`` the first time)."""
        env = dataset_env(dataset, "generator=pgd")  # for its action bounds
        low, high = env.action_bounds()
        rows = TrajectoryRows(dataset.obs_dim, dataset.act_dim, low, high)
        if model_path is not None:
            model = DiffusionModel.load(model_path, map_location=device, edm=config.edm)
            if model.denoiser_kind != "unet" or model.event_shape[-1] != rows.channels:
                raise ConfigError(f"{model_path} is not a PGD trajectory model for this dataset ({rows.channels} "
                                  f"channels, U-Net denoiser).")
        else:
            data = training_windows(dataset, rows, config.window, config.stride)
            fingerprint = f"{dataset.fingerprint()}-{ROWS_VERSION}-w{config.window}-s{config.stride}"
            train = config.train
            if config.train_epochs is not None:  # the official loop: whole passes of len(windows) // batch steps
                per_epoch = max(1, len(data) // train.batch_for(len(data)))
                train = dataclasses.replace(train, steps=config.train_epochs * per_epoch)
            model, _ = load_or_fit_diffusion(data, "unet", _unet_kwargs(config.unet), config.edm, train,
                                             cache_dir, fingerprint, name=f"pgd-{dataset.env_name}", seed=config.seed,
                                             device=device, progress=progress)
        return cls(model.to(torch.device(device)), rows.to(torch.device(device)), config)

    def guidance_for(self, policy: Policy, first: bool = False) -> Optional[Guidance]:
        """The guidance of a generation for ``policy``: None when unguided (λ = 0, or the first one)."""
        cfg = self.config.guidance
        if cfg.scale == 0.0:
            return None
        require_log_prob(policy, self.rows, f"generator.guidance.scale={cfg.scale}")  # the first one checks it too
        return None if first else policy_guidance(policy, self.rows, self.model.normalizer, cfg)

    def sample_trajectories(self, count: int, guidance: Optional[Guidance] = None,
                            rng: Optional[torch.Generator] = None, noise: Optional[Tensor] = None,
                            start_observations: Optional[Tensor] = None) -> Tensor:
        """``count`` trajectories ``(count, length, channels)`` in unnormalised rows, ``sample_batch`` at a
        time; ``noise`` (count, length, channels): the sampler's starting draws (default: from ``rng``).
        ``start_observations`` (count, obs_dim), in the data's units: the first row's state channels are
        held at them while sampling (`start_conditioning`; the official code samples unconditionally)."""
        cfg, device = self.config, self.model.normalizer.mean.device
        shape = (cfg.length, self.rows.channels)
        known = self.start_conditioning(start_observations) if start_observations is not None else None
        if known is not None and len(start_observations) != count:
            raise InputError(f"start_observations holds {len(start_observations)} states for {count} trajectories.")
        parts = []
        for start in range(0, count, cfg.sample_batch):
            n = min(cfg.sample_batch, count - start)
            part_noise = noise[start:start + n] if noise is not None else None
            part_known = known.rows(start, start + n, (count, *shape)) if known is not None else None
            x = self.model.diffusion.sample((n, *shape), rng, noise=part_noise, guidance=guidance, known=part_known)
            parts.append(self.model.normalizer.unnormalize(x))
        return torch.cat(parts) if parts else torch.zeros((0, *shape), device=device)

    def start_conditioning(self, start_observations: Tensor) -> KnownEntries:
        """The `KnownEntries` (normalised space) that hold the first row's state channels of trajectories
        ``(count, length, channels)`` at ``start_observations`` ``(count, obs_dim)`` (data units): how
        Diffuser conditions a trajectory on the current state, by inpainting."""
        normalizer, rows = self.model.normalizer, self.rows
        starts = torch.as_tensor(start_observations, dtype=torch.float32, device=normalizer.mean.device)
        if starts.dim() != 2 or starts.shape[1] != rows.obs_dim:
            raise InputError(f"start_observations must have shape (count, {rows.obs_dim}), got {tuple(starts.shape)}.")
        values = torch.zeros(len(starts), self.config.length, rows.channels, device=starts.device)
        values[:, 0, rows.obs] = (starts - normalizer.mean[rows.obs]) / normalizer.std[rows.obs]
        mask = torch.zeros(self.config.length, rows.channels, dtype=torch.bool, device=starts.device)
        mask[0, rows.obs] = True
        return KnownEntries(mask, values)

    def generate(self, policy: Policy, real: dict[str, Tensor], rng: Optional[torch.Generator] = None
                 ) -> tuple[dict[str, Tensor], dict[str, float]]:
        """One generation: ``trajectories`` sampled trajectories as transitions, guided by ``policy``
        unless this is the first generation or λ = 0. ``real`` is not used (PGD samples unconditionally)."""
        check_policy(self, policy)  # guidance differentiates a feed-forward policy's log pi(a|s)
        first = self.generations == 0
        guidance = self.guidance_for(policy, first)
        trajectories = self.sample_trajectories(self.config.trajectories, guidance, rng)
        batch = self.rows.transitions(trajectories, self.config.drop_after_terminal)
        self.generations += 1
        n = len(batch["rewards"])
        stats = {
            "transitions": float(n),
            "guidance_scale": guidance.scale if guidance is not None else 0.0,
            "reward_mean": batch["rewards"].mean().item() if n else float("nan"),
            "terminal_fraction": batch["terminals"].float().mean().item() if n else float("nan"),
        }
        if guidance is not None and n:  # how likely the current policy finds the generated actions
            with torch.no_grad():
                stats["policy_log_prob_mean"] = policy.log_prob(batch["observations"], batch["actions"]).mean().item()
        return batch, stats

    def state_dict(self) -> dict:
        """The generation count (the first generation is unguided); the model (``model``) the checkpoint
        knows by fingerprint."""
        return {"generations": self.generations}

    def load_state_dict(self, state: dict) -> None:
        self.generations = int(state["generations"])


def _unet_kwargs(config: UNetConfig) -> dict:
    return {"base": config.base, "levels": config.levels, "groups": config.groups}


__all__ = ["PGDGenerator", "PGDGeneratorConfig", "PGDGuidanceConfig", "TrajectoryRows", "UNetConfig",
           "policy_guidance", "require_log_prob", "training_windows"]
