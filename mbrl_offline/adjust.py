"""Test-time action adjustment of any trained agent: CDSA.

CDSA (Liu, Yang & Li, "Conservative Denoising Score-based Algorithm for Offline Reinforcement
Learning", arXiv 2406.07541, v1 of 11 June 2024) leaves a pre-trained offline agent frozen. At test
time it corrects the agent's actions with a denoising score model of the dataset's density, through an
inverse dynamics model, toward denser regions of the data (the abstract; a third-party summary adds the
inverse dynamics model and the value-at-risk measure). No official code is public, and the paper's
method section could not be read here, so every choice below is ours, stated as such and a setting of
`CDSAConfig`:

* **the score model** is the library's EDM diffusion core (`mbrl_offline.models.diffusion`, SynthER's
  residual-MLP denoiser) trained on the dataset's states (``score_on="states"``, the default) or on
  its state-action pairs (``"state_actions"``), in normalised units. Its score at noise level sigma
  is (D(x; sigma) - x) / sigma^2, with D the trained denoiser (EDM's relation, Karras et al. 2022).
* **the adjustment** (``score_on="states"``): from the agent's action a = pi(s), the next state
  s'_hat = f(s, a) (the mean of the dynamics ensemble's elites, `load_or_fit_dynamics` with
  ``dynamics``, `DynamicsConfig`'s defaults unless set), then ``steps`` steps of x <- x + step_size sigma^2 score(x, sigma) = x + step_size
  (D(x; sigma) - x) on the normalised s'_hat, at the one noise level ``sigma``, give s'*. The inverse
  dynamics model I(s, s') (an MLP trained by MSE on the data's transitions) turns it into an action.
* **how it is combined** (``combine``): ``"delta"`` (the default) adds ``weight`` x (I(s, s'*) -
  I(s, s'_hat)) to a, the "auxiliary action component" of the summary, which leaves a unchanged
  where the score does not move s'_hat and cancels the inverse model's own error; ``"blend"`` takes
  (1 - weight) a + weight I(s, s'*); ``"replace"`` takes I(s, s'*). The result is clipped to the
  action bounds.
* with ``score_on="state_actions"`` no dynamics or inverse model is used: the same steps move only
  the action coordinates of the normalised (s, a), and ``delta`` and ``blend`` both take
  a + weight (a* - a).

The models are fitted once per dataset and settings, and cached (`mbrl_offline.cache`). The paper's
claim is about the adjusted agent's score and its risk aversion, measured by value at risk
(`mbrl_offline.evaluation.risk_measures`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from mbrl_offline.cache import load_or_fit
from mbrl_offline.config import check_field_types, require_above_zero, require_in_range, require_positive
from mbrl_offline.data.dataset import true_successors
from mbrl_offline.errors import CheckpointError, ConfigError, InputError, NotFittedError
from mbrl_offline.models.diffusion import DiffusionModel, DiffusionTrainConfig, load_or_fit_diffusion
from mbrl_offline.models.dynamics import DynamicsConfig, load_or_fit_dynamics
from mbrl_offline.torch_files import load_plain, save_plain
from mbrl_offline.utils import adam_kernel

SCORE_ON = ("states", "state_actions")
COMBINE = ("delta", "blend", "replace")
ADJUSTERS = ("none", "cdsa")


@dataclass
class CDSAConfig:
    score_on: str = "states"  # the score model's data: "states" (with the inverse dynamics model) or "state_actions"
    sigma: float = 0.1  # the noise level at which the score is read, in normalised units
    steps: int = 5  # ascent steps x <- x + step_size (D(x; sigma) - x)
    step_size: float = 0.5  # in (0, 1]: the fraction of the way to the denoised point per step
    combine: str = "delta"  # "delta": a + weight (I(s, s'*) - I(s, s'_hat)); "blend"; "replace"
    weight: float = 1.0  # the correction's weight, in [0, 1]
    # the score model: SynthER's residual MLP (width x blocks) trained for score_steps steps
    score_width: int = 256
    score_blocks: int = 3
    score_steps: int = 10_000
    # the inverse dynamics model: an MLP of inverse_layers x inverse_hidden ReLU units
    inverse_hidden: int = 256
    inverse_layers: int = 2
    inverse_updates: int = 10_000
    # the dynamics ensemble that predicts s'_hat (score_on=states): its defaults, or any recipe's settings
    dynamics: DynamicsConfig = field(default_factory=DynamicsConfig)
    seed: int = 0

    def __post_init__(self):
        check_field_types(self, "cdsa")
        require_positive(self, "steps", "score_width", "score_blocks", "score_steps", "inverse_hidden",
                         "inverse_layers", "inverse_updates", section="cdsa")
        require_above_zero(self, "sigma", section="cdsa")
        require_in_range(self, "step_size", low=0.0, high=1.0, low_open=True, section="cdsa")
        require_in_range(self, "weight", low=0.0, high=1.0, section="cdsa")
        require_in_range(self, "seed", low=0, section="cdsa")
        if self.score_on not in SCORE_ON:
            raise ConfigError(f"unknown cdsa.score_on '{self.score_on}'; choose one of {', '.join(SCORE_ON)}.")
        if self.combine not in COMBINE:
            raise ConfigError(f"unknown cdsa.combine '{self.combine}'; choose one of {', '.join(COMBINE)}.")


def check_adjust(adjust, setting: str = "adjust") -> None:
    """`ConfigError` unless ``adjust`` names an adjuster (`ADJUSTERS`)."""
    if adjust not in ADJUSTERS:
        raise ConfigError(f"unknown {setting} '{adjust}'; choose one of {', '.join(ADJUSTERS)}.")


class InverseDynamics(nn.Module):
    """I(s, s') -> a: an MLP on the standardised pair, its output the action scaled to [-1, 1] by the
    action bounds (unscaled in `forward`'s result)."""

    def __init__(self, obs_dim: int, act_dim: int, low, high, hidden: int = 256, layers: int = 2):
        super().__init__()
        self.obs_dim, self.act_dim, self.hidden, self.layers = obs_dim, act_dim, hidden, layers
        blocks, width = [], 2 * obs_dim
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        blocks.append(nn.Linear(width, act_dim))
        self.net = nn.Sequential(*blocks)
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32).reshape(act_dim))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32).reshape(act_dim))
        self.register_buffer("mean", torch.zeros(2 * obs_dim))
        self.register_buffer("std", torch.ones(2 * obs_dim))
        self.register_buffer("fitted", torch.tensor(False))

    def forward(self, obs: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
        scaled = self.net((torch.cat([obs, next_obs], -1) - self.mean) / self.std)
        return self.low + (scaled + 1) * (self.high - self.low) / 2

    def fit(self, dataset, updates: int, seed: int = 0, batch_size: int = 256, lr: float = 1e-3) -> "InverseDynamics":
        device = self.low.device
        keep = true_successors(dataset)
        obs, nxt, act = (torch.as_tensor(np.asarray(getattr(dataset, k), np.float32)[keep], device=device)
                         for k in ("observations", "next_observations", "actions"))
        pairs = torch.cat([obs, nxt], -1)
        self.mean.copy_(pairs.mean(0))
        self.std.copy_(pairs.std(0).clamp_min(1e-6))
        target = 2 * (act - self.low) / (self.high - self.low) - 1
        generator = torch.Generator(device=device).manual_seed(seed)
        optimizer = torch.optim.Adam(self.net.parameters(), lr=lr, **adam_kernel())
        for _ in range(updates):
            rows = torch.randint(0, len(obs), (batch_size,), device=device, generator=generator)
            loss = (self.net((pairs[rows] - self.mean) / self.std) - target[rows]).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self.fitted.fill_(True)
        return self

    def save(self, path) -> Path:
        save_plain({"sizes": [self.obs_dim, self.act_dim, self.hidden, self.layers], "state_dict": self.state_dict()},
                   path)
        return Path(path)

    @classmethod
    def load(cls, path, map_location="cpu") -> "InverseDynamics":
        saved = load_plain(path, map_location, "If it is a cached model, delete it and it is fitted again.")
        if not isinstance(saved, dict) or not {"sizes", "state_dict"} <= saved.keys():
            raise CheckpointError(f"{path} is not a saved InverseDynamics; delete a damaged cached one to fit it again.")
        obs_dim, act_dim, hidden, layers = saved["sizes"]
        model = cls(obs_dim, act_dim, torch.zeros(act_dim), torch.ones(act_dim), hidden, layers)
        model.load_state_dict(saved["state_dict"])
        return model.to(map_location)


class CDSA:
    """The adjuster: `adjust(observations, actions)` moves a batch of the agent's actions (see the module
    docstring). Build it with `for_dataset` (fits or loads its models) or from fitted parts."""

    def __init__(self, config: CDSAConfig, score: DiffusionModel, low, high, dynamics=None,
                 inverse: Optional[InverseDynamics] = None):
        if config.score_on == "states" and (dynamics is None or inverse is None):
            raise ConfigError("cdsa.score_on=states needs a dynamics model and an inverse dynamics model; give both, "
                              "or use CDSA.for_dataset, or set cdsa.score_on=state_actions.")
        if not score.is_fitted:
            raise NotFittedError("the score model was never fitted; use CDSA.for_dataset or fit it first.")
        self.config, self.score, self.dynamics, self.inverse = config, score, dynamics, inverse
        device = next(score.parameters()).device
        self.low = torch.as_tensor(low, dtype=torch.float32, device=device).reshape(-1)
        self.high = torch.as_tensor(high, dtype=torch.float32, device=device).reshape(-1)
        self.obs_dim = score.event_shape[-1] - (len(self.low) if config.score_on == "state_actions" else 0)

    @classmethod
    def for_dataset(cls, config: CDSAConfig, dataset, low, high, device: str | torch.device = "cpu",
                    cache_dir: Optional[str | Path] = None, progress: bool = False) -> "CDSA":
        """Its models for ``dataset`` (and the env's action bounds ``low``, ``high``), each loaded from the
        cache or fitted there the first time: the score model (kind ``diffusion``), and with
        ``score_on="states"`` the inverse dynamics model (kind ``cdsa``) and the dynamics ensemble of
        ``config.dynamics`` (kind ``dynamics``)."""
        device = torch.device(device)
        obs = np.asarray(dataset.observations, np.float32)
        rows = obs if config.score_on == "states" else np.concatenate(
            [obs, np.asarray(dataset.actions, np.float32)], axis=1)
        score, _ = load_or_fit_diffusion(
            torch.as_tensor(rows), "resmlp", {"width": config.score_width, "blocks": config.score_blocks},
            train=DiffusionTrainConfig(steps=config.score_steps), cache_dir=None if cache_dir is None
            else Path(cache_dir) / "diffusion", fingerprint=f"{dataset.fingerprint()}-cdsa-{config.score_on}",
            name=f"{dataset.env_name or 'env'}-cdsa", seed=config.seed, device=device, progress=progress)
        dynamics = inverse = None
        if config.score_on == "states":
            dynamics, _ = load_or_fit_dynamics(dataset, config.dynamics, None if cache_dir is None
                                               else Path(cache_dir) / "dynamics", device, progress)

            def fit() -> InverseDynamics:
                model = InverseDynamics(dataset.obs_dim, dataset.act_dim, low, high, config.inverse_hidden,
                                        config.inverse_layers).to(device)
                return model.fit(dataset, config.inverse_updates, config.seed)

            settings = {"hidden": config.inverse_hidden, "layers": config.inverse_layers,
                        "updates": config.inverse_updates, "seed": config.seed,
                        "low": [float(x) for x in np.reshape(low, -1)], "high": [float(x) for x in np.reshape(high, -1)]}
            inverse, _ = load_or_fit("cdsa", f"{dataset.env_name or 'env'}-inverse", dataset.fingerprint(), settings,
                                     fit, save=lambda model, path: model.save(path),
                                     load=lambda path: InverseDynamics.load(path, device),
                                     cache_dir=None if cache_dir is None else Path(cache_dir) / "cdsa")
        return cls(config, score.to(device), low, high, dynamics, inverse)

    @torch.no_grad()
    def ascend(self, x: torch.Tensor, moving: Optional[slice] = None) -> torch.Tensor:
        """``steps`` steps x <- x + step_size (D(x; sigma) - x) on raw rows ``x`` (normalised inside),
        moving only the columns ``moving`` (all by default)."""
        cfg, model = self.config, self.score
        z = model.normalizer.normalize(x)
        for _ in range(cfg.steps):
            step = cfg.step_size * (model.diffusion.denoise(z, cfg.sigma) - z)
            if moving is not None:
                mask = torch.zeros_like(z)
                mask[:, moving] = 1.0
                step = step * mask
            z = z + step
        return model.normalizer.unnormalize(z)

    @torch.no_grad()
    def adjust(self, observations, actions) -> np.ndarray | torch.Tensor:
        """The adjusted actions for ``observations`` ``(B, obs_dim)`` and the agent's ``actions``
        ``(B, act_dim)`` (numpy in, numpy out; tensors in, tensors out)."""
        as_numpy = isinstance(actions, np.ndarray)
        device = self.low.device
        obs = torch.as_tensor(np.asarray(observations, np.float32) if as_numpy else observations, device=device)
        act = torch.as_tensor(np.asarray(actions, np.float32) if as_numpy else actions, device=device)
        if obs.dim() != 2 or act.dim() != 2 or len(obs) != len(act) or obs.shape[1] != self.obs_dim or \
                act.shape[1] != len(self.low):
            raise InputError(f"CDSA.adjust takes observations (B, {self.obs_dim}) and actions (B, {len(self.low)}); "
                             f"got {tuple(obs.shape)} and {tuple(act.shape)}.")
        cfg = self.config
        if cfg.score_on == "state_actions":
            moved = self.ascend(torch.cat([obs, act], -1), slice(self.obs_dim, None))[:, self.obs_dim:]
            target = act + cfg.weight * (moved - act) if cfg.combine != "replace" else moved
        else:
            mean, _ = self.dynamics.predict(obs, act, elites_only=True)
            predicted = obs + mean.mean(0)[:, :-1]
            moved = self.ascend(predicted)
            inverse_moved = self.inverse(obs, moved)
            if cfg.combine == "delta":
                target = act + cfg.weight * (inverse_moved - self.inverse(obs, predicted))
            elif cfg.combine == "blend":
                target = (1 - cfg.weight) * act + cfg.weight * inverse_moved
            else:
                target = inverse_moved
        target = torch.maximum(torch.minimum(target, self.high), self.low)
        return target.cpu().numpy() if as_numpy else target


class AdjustedEpisodePolicy:
    """An `mbrl_offline.roles.EpisodePolicy` whose actions are ``policy``'s, adjusted by ``adjuster`` (its
    ``adjust(observations, actions)``). A recurrent policy keeps its own state; the env receives the
    adjusted actions."""

    def __init__(self, policy, adjuster):
        self.policy, self.adjuster = policy, adjuster

    def reset(self, episodes: int) -> None:
        self.policy.reset(episodes)

    def __call__(self, observations, rewards, starts, rows):
        return self.adjuster.adjust(observations, self.policy(observations, rewards, starts, rows))


__all__ = ["ADJUSTERS", "AdjustedEpisodePolicy", "CDSA", "CDSAConfig", "InverseDynamics", "check_adjust"]
