"""``generator=synther``: SynthER (Lu, Ball, Teh, Parker-Holder, NeurIPS 2023), an unconditional diffusion
model of single transitions, sampled once to up-sample the data.

The model (`mbrl_offline.models.diffusion`: EDM, SynthER's residual-MLP denoiser, EMA weights) learns
rows ``[s, a, r, s', d]`` of the dataset, each dimension z-scored except the terminal flag d (as
SynthER's ``disable_terminal_norm``); it is fitted once per dataset and settings and cached like the
dynamics models. Before the first update the trainer asks for ``samples`` transitions; they come out
in the buffer's format (`mbrl_offline.buffer.TRANSITION_FIELDS`) with the terminal thresholded at 0.5
and no timeouts. ``every=0`` (the default) generates once, as the paper's offline setting does;
``every > 0`` draws fresh samples from the same model every ``every`` updates.

Mixing: by default synthetic data *replaces* the real data (``mixing.rule=fraction``,
``mixing.real_ratio=0``: every batch is synthetic), which is SynthER's offline setting (its CORL
buffer holds the ``.npz`` of samples only); ``generator.mixing.real_ratio=0.5`` mixes them as its
online setting does, and any `MixingConfig` rule works. The agents' observation normalisation is
computed from the real dataset, as in SynthER's CORL code.

Sizes: the defaults are the paper's, a width-2048 denoiser, 100,000 training steps and 5M samples at
128 Heun steps (a GPU job). ``budget=quick`` (also from Python: ``build_run(..., budget="quick")``) sets
a 2-core CPU's: width 256, 3,000 steps, 20,000 samples at 32 steps (docs/generators.md has the table
and the timings).

Deviations from the official code, and why:

* Training rows are all of the dataset's transitions (the rows the real buffer holds); SynthER reads
  ``d4rl.qlearning_dataset``, which drops the transitions that end in a timeout.
* ``clip_actions`` (default on) clips generated actions to the env's action bounds (the dataset's range
  without an env): SynthER leaves z-scored samples unclipped, which can put actions outside the
  bounds, where a tanh-squashed policy's log-probability is not finite. ``clip_actions=false`` is the
  official behaviour.
* The EMA follows `mbrl_offline.models.diffusion` (torch's ``AveragedModel``, no ``ema_pytorch`` warm-up).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from mbrl_offline.buffer import MixingConfig
from mbrl_offline.config import require_fraction, require_nonnegative, require_positive
from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import ConfigError
from mbrl_offline.models.diffusion import (DiffusionModel, DiffusionTrainConfig, EDMConfig, ResidualMLPConfig,
                                           load_or_fit_diffusion)
from mbrl_offline.registry import register_generator
from mbrl_offline.roles import GeneratorConfig, Policy


@dataclass
class SyntherGeneratorConfig(GeneratorConfig):
    """``generator=synther``: a diffusion model of transitions [s, a, r, s', d], sampled once."""

    kind: str = "synther"
    # Updates between generations; 0 (SynthER offline): sample once, before the first update.
    every: int = 0
    samples: int = 5_000_000  # transitions per generation (paper: 5,000,000; budget=quick: 20,000)
    sample_batch: int = 100_000  # transitions per sampler call (paper: 100,000; bounds the memory)
    terminal_threshold: float = 0.5  # d > threshold is a terminal (SynthER: 0.5)
    clip_actions: bool = True  # clip generated actions to the action bounds (SynthER: no clipping)
    seed: int = 0  # torch seed of the model's init and training (part of the cache key)
    denoiser: ResidualMLPConfig = field(default_factory=ResidualMLPConfig)  # paper: width 2048, 6 blocks
    edm: EDMConfig = field(default_factory=EDMConfig)  # EDM's constants and the sampler (128 Heun steps)
    # SynthER's recipe (AdamW 3e-4, cosine, batch 1024 or 256 below 800k rows, EMA 0.995 every 10 steps,
    # 100,000 steps; budget=quick: 3,000 steps, EMA every step).
    train: DiffusionTrainConfig = field(default_factory=DiffusionTrainConfig)
    # Real and synthetic rows per batch: real_ratio 0, synthetic data replaces the real data (the paper's
    # offline setting); e.g. real_ratio 0.5 mixes them.
    mixing: MixingConfig = field(default_factory=lambda: MixingConfig(rule="fraction", real_ratio=0.0))

    def __post_init__(self):
        super().__post_init__()  # kind, schedule and mixing (`mbrl_offline.roles.GeneratorConfig`)
        require_positive(self, "samples", "sample_batch", section="generator")
        require_fraction(self, "terminal_threshold", section="generator")
        require_nonnegative(self, "seed", section="generator")

    def fitted_model(self) -> Optional[str]:
        """The diffusion model is fitted into the diffusion cache."""
        return "diffusion"


def transition_rows(dataset) -> torch.Tensor:
    """The dataset's transitions as rows ``[s, a, r, s', d]`` (float32, d = 1.0 at a terminal)."""
    return torch.as_tensor(np.concatenate([dataset.observations, dataset.actions, dataset.rewards[:, None],
                                           dataset.next_observations, dataset.terminals[:, None]],
                                          axis=1, dtype=np.float32))


@register_generator
class SyntherGenerator:
    """SynthER's generator: a fitted `DiffusionModel` of transitions and the settings of a
    `SyntherGeneratorConfig` (schedule and mixing are read by the trainer)."""

    # what it gives, for the docs' tables
    summary = "SynthER: transitions sampled once from a diffusion model of the data (by default replacing it)"
    config_class = SyntherGeneratorConfig
    model: DiffusionModel  # the fitted diffusion model of transitions
    produces = "transitions"
    recurrent_policy = True  # sampling does not read the policy at all
    provides_dynamics = False

    def __init__(self, model: DiffusionModel, obs_dim: int, act_dim: int, action_bounds: tuple[np.ndarray, np.ndarray],
                 config: SyntherGeneratorConfig = SyntherGeneratorConfig()):
        self.model, self.obs_dim, self.act_dim, self.config = model, obs_dim, act_dim, config
        self.action_low, self.action_high = (torch.as_tensor(b, dtype=torch.float32) for b in action_bounds)
        width = 2 * obs_dim + act_dim + 2
        if model.event_shape != (width,):
            raise ConfigError(f"the diffusion model makes rows of {model.event_shape}, not transitions of width {width} "
                              f"for obs_dim {obs_dim} and act_dim {act_dim}; use a model fitted on this dataset.")

    @property
    def buffer_capacity(self) -> int:
        return self.config.samples

    @property
    def extra_fields(self) -> dict:
        return {}

    @classmethod
    def for_dataset(cls, config: SyntherGeneratorConfig, dataset, device: str | torch.device = "cpu",
                    cache_dir: Optional[str | Path] = None, model_path: Optional[str | Path] = None,
                    progress: bool = True) -> "SyntherGenerator":
        """The generator for ``dataset``: its diffusion model from ``model_path`` (a `DiffusionModel` file), or
        from the cache (fitted on the dataset's transitions with ``config`` the first time)."""
        rows = transition_rows(dataset)
        if model_path is not None:
            model = DiffusionModel.load(model_path, map_location=device, edm=config.edm)
        else:
            model, _ = load_or_fit_diffusion(rows, "resmlp", asdict(config.denoiser), config.edm, config.train,
                                             cache_dir=cache_dir, fingerprint=f"synther-rows:{dataset.fingerprint()}",
                                             name=f"{dataset.env_name or 'env'}-synther", skip_dims=[rows.shape[1] - 1],
                                             seed=config.seed, device=device, progress=progress)
        if dataset.env_name is not None:
            bounds = get_env_info(dataset.env_name).action_bounds()
        else:
            bounds = (dataset.actions.min(0), dataset.actions.max(0))
        return cls(model.to(torch.device(device)), dataset.obs_dim, dataset.act_dim, bounds, config)

    def split(self, samples: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows ``[s, a, r, s', d]`` as transition fields: the terminal thresholded, actions clipped (if
        ``clip_actions``), no timeouts."""
        o, a = self.obs_dim, self.act_dim
        actions = samples[:, o:o + a]
        if self.config.clip_actions:
            actions = torch.clamp(actions, self.action_low.to(actions.device), self.action_high.to(actions.device))
        terminals = samples[:, -1] > self.config.terminal_threshold
        return {"observations": samples[:, :o], "actions": actions, "rewards": samples[:, o + a],
                "next_observations": samples[:, o + a + 1:o + a + 1 + o], "terminals": terminals,
                "timeouts": torch.zeros_like(terminals)}

    def generate(self, policy: Policy, real: dict[str, torch.Tensor], rng: Optional[torch.Generator] = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """``samples`` new transitions (the policy and the real rows are not used: SynthER is unconditional)."""
        cfg = self.config
        samples = self.model.sample(cfg.samples, rng, batch_size=cfg.sample_batch)
        rows = self.split(samples)
        raw_actions = samples[:, self.obs_dim:self.obs_dim + self.act_dim]
        stats = {"transitions": float(len(samples)),
                 "reward_mean": rows["rewards"].mean().item(),
                 "terminal_fraction": rows["terminals"].float().mean().item(),
                 "clipped_action_fraction": (raw_actions != rows["actions"]).any(-1).float().mean().item()}
        return rows, stats

    def state_dict(self) -> dict:
        """Nothing besides the model (``model``, which the checkpoint knows by fingerprint)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


__all__ = ["SyntherGenerator", "SyntherGeneratorConfig"]
