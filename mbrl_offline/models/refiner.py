"""A PDE-Refiner for a dynamics model's one-step predictions.

PDE-Refiner (Lippe, Veeling, Perdikaris, Turner & Brandstetter, "PDE-Refiner: Achieving Accurate
Long Rollouts with Neural PDE Solvers", NeurIPS 2023; the paper's Appendix C pseudocode, and the
official pdearena/pdearena ``pdearena/models/pderefiner.py``) refines a one-step predictor's output
in K denoising steps with exponentially shrinking noise. One network NO(u~, c, k) is trained on the
data's transitions, k drawn uniformly from {0..K}:

* k = 0: input zeros, target u (MSE): the network's own one-step prediction;
* k >= 1: sigma_k = sigma_min^(k/K), input u~ = u + sigma_k eps, target eps (MSE).

At prediction time u^ = NO(0, c, 0) (or, here by default, the dynamics model's own prediction), then
for k = 1..K: u~ = u^ + sigma_k eps; u^ = u~ - sigma_k NO(u~, c, k). The spread of the refined
outputs under different noise draws is proposed as an uncertainty estimate (the paper's abstract).

Here u is a transition's ``[s' - s, r]``, standardised with the training rows' mean and std (the
"normalised target space"), and the condition c is the standardised ``[s, a]``. The refiner has its
own statistics and is fitted on the dataset alone, so it refines any model's predictions of the same
data (it never reads the ensemble's weights) and is cached by the dataset and its own settings.

Choices that are ours, each a setting of `RefinerConfig`:

* ``start="ensemble"`` (the default): step 0 is the dynamics model's own prediction, as the rollout
  draws it, and the network is trained on k = 1..K only; ``start="own"`` is the paper's (k = 0..K,
  step 0 is NO(0, c, 0)).
* ``steps`` K = 3 and ``sigma_min`` = 0.1, so sigma = 0.46, 0.22, 0.1 of a target's std. The
  paper's values (sigma_min 2e-7 for Kuramoto-Sivashinsky; pdearena's defaults K = 4 and 4e-7)
  are tuned for the low-amplitude spatial frequencies of PDE fields; an 11-17-number robot state has
  no spatial spectrum, and at K = 3 and 4e-7 the first step's noise (0.0074 std) would be far below
  a one-step model's error on standardised states. 0.1 was the best of 1e-3, 1e-2 and 0.1 in 200-step
  rollouts on pendulum-medium and hopper-medium, and the only one whose hopper rollouts did not
  diverge (docs/generators.md has the measurements and the command).
* the network: an MLP of ``hidden_layers`` x ``hidden_size`` SiLU units on [u~, c, one-hot(k)]
  (the paper's networks are U-Nets and FNOs over a spatial grid, which a state vector does not have);
  Adam for ``updates`` steps of ``batch_size`` rows, with an exponential moving average of the weights
  (``ema_decay``; pdearena's default 0.995) that is the model kept;
* the row's uncertainty with ``samples`` R >= 2: the root mean square over outputs of the std over
  the R refinements, in the standardised target space (as `mbrl_offline.models.uncertainty.epistemic_rms`
  measures the members' spread); the row's own prediction is the first refinement.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from mbrl_offline.cache import cache_root, load_or_fit
from mbrl_offline.config import (check_field_types, require_above_zero, require_fraction, require_in_range,
                                 require_positive)
from mbrl_offline.errors import CheckpointError, ConfigError, NotFittedError
from mbrl_offline.models.dynamics import transition_arrays
from mbrl_offline.models.fitting import check_fit_rows
from mbrl_offline.torch_files import load_plain, save_plain
from mbrl_offline.utils import adam_kernel, progress_bar

REFINER_STARTS = ("ensemble", "own")


@dataclass
class RefinerConfig:
    enabled: bool = False  # refine each model step's prediction (off: the model's prediction as it is)
    steps: int = 3  # K: refinement steps, sigma_k = sigma_min^(k/K), k = 1..K
    sigma_min: float = 0.1  # the last step's noise std, in units of each target's std; in (0, 1)
    # Step 0: "ensemble" (the dynamics model's own prediction; the network learns k = 1..K) or "own"
    # (the paper's: the network's prediction from zeros at k = 0, which it also learns).
    start: str = "ensemble"
    # R: refinements per row; with R >= 2 their spread is the row's ``refiner`` uncertainty (the row
    # keeps the first). R = 1 refines once and gives no spread.
    samples: int = 1
    hidden_size: int = 200
    hidden_layers: int = 3
    learning_rate: float = 1e-3
    batch_size: int = 256
    updates: int = 20_000  # Adam steps of the fit
    ema_decay: float = 0.995  # the kept weights are this moving average of the trained ones (pdearena: 0.995)
    holdout_ratio: float = 0.1  # rows held out for the fit's reported loss
    seed: int = 0

    def __post_init__(self):
        check_field_types(self, "refiner")
        require_positive(self, "steps", "samples", "hidden_size", "hidden_layers", "batch_size", "updates",
                         section="refiner")
        require_in_range(self, "sigma_min", low=0.0, high=1.0, low_open=True, high_open=True, section="refiner")
        require_above_zero(self, "learning_rate", section="refiner")
        require_in_range(self, "ema_decay", low=0.0, high=1.0, high_open=True, section="refiner")
        require_in_range(self, "holdout_ratio", low=0.0, high=1.0, low_open=True, high_open=True, section="refiner")
        require_in_range(self, "seed", low=0, section="refiner")
        if self.start not in REFINER_STARTS:
            raise ConfigError(f"unknown refiner.start '{self.start}'; choose one of {', '.join(REFINER_STARTS)}.")

    @property
    def gives_spread(self) -> bool:
        """Whether refined rows carry the ``refiner`` uncertainty (on, with two or more refinements)."""
        return self.enabled and self.samples >= 2

    def sigmas(self) -> list[float]:
        """sigma_k = sigma_min^(k/K) for k = 1..K."""
        return [self.sigma_min ** (k / self.steps) for k in range(1, self.steps + 1)]


# What a fit depends on: not ``enabled`` or ``samples``, which only act when the refiner is used.
_USE_ONLY = ("enabled", "samples")


def cache_settings(config: RefinerConfig) -> dict:
    settings = asdict(config)
    for name in _USE_ONLY:
        del settings[name]
    return settings


class DynamicsRefiner(nn.Module):
    """NO(u~, c, k) and its use; see the module docstring.

    ``fit(dataset)`` trains it; ``refine(obs, act, next_obs, rewards)`` refines a model's predicted
    transitions (raw units in and out); ``predict(obs, act)`` is its own refined prediction (step 0
    from zeros, ``start="own"``); ``save``/``load`` keep weights, statistics and config together. Like
    the dynamics model it refuses to predict before it was fitted or loaded (`NotFittedError`).
    """

    def __init__(self, obs_dim: int, act_dim: int, config: RefinerConfig = RefinerConfig()):
        super().__init__()
        self.obs_dim, self.act_dim, self.config = obs_dim, act_dim, config
        out_dim, in_dim = obs_dim + 1, obs_dim + act_dim
        layers, width = [], out_dim + in_dim + config.steps + 1
        for _ in range(config.hidden_layers):
            layers += [nn.Linear(width, config.hidden_size), nn.SiLU()]
            width = config.hidden_size
        layers.append(nn.Linear(width, out_dim))
        self.net = nn.Sequential(*layers)
        self.register_buffer("input_mean", torch.zeros(in_dim))
        self.register_buffer("input_std", torch.ones(in_dim))
        self.register_buffer("target_mean", torch.zeros(out_dim))
        self.register_buffer("target_std", torch.ones(out_dim))
        self.register_buffer("sigma", torch.tensor([0.0] + config.sigmas()))  # sigma[k], sigma[0] unused
        self.register_buffer("fitted", torch.tensor(False))
        self.is_fitted = False
        self.train_log: list[dict] = []

    def _load_from_state_dict(self, state_dict, *args, **kwargs):
        super()._load_from_state_dict(state_dict, *args, **kwargs)
        self.is_fitted = bool(self.fitted)

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError("this DynamicsRefiner was never fitted, so its refinements are noise; call "
                                 "fit(dataset) first, or load a fitted one (DynamicsRefiner.load, load_or_fit_refiner).")

    # ------------------------------------------------------------------------------ the network
    def forward(self, noisy: torch.Tensor, condition: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """NO(u~, c, k) for standardised ``noisy`` ``(B, obs_dim + 1)`` and ``condition`` ``(B, obs_dim +
        act_dim)`` and steps ``k`` ``(B,)``: the predicted noise (k >= 1) or target (k = 0)."""
        step = nn.functional.one_hot(k, self.config.steps + 1).to(noisy.dtype)
        return self.net(torch.cat([noisy, condition, step], dim=-1))

    def condition(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return (torch.cat([obs, act], dim=-1) - self.input_mean) / self.input_std

    def loss(self, condition: torch.Tensor, target: torch.Tensor, k: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The training loss of standardised rows at steps ``k``: MSE to the target at k = 0 (input
        zeros), to the noise at k >= 1 (input target + sigma_k noise); mean over rows and outputs."""
        sigma = self.sigma[k].unsqueeze(-1)
        own = (k == 0).unsqueeze(-1)
        noisy = torch.where(own, torch.zeros_like(target), target + sigma * noise)
        wanted = torch.where(own, target, noise)
        return (self(noisy, condition, k) - wanted).pow(2).mean()

    def _steps(self, rows: int, generator: torch.Generator, device) -> torch.Tensor:
        low = 0 if self.config.start == "own" else 1
        return torch.randint(low, self.config.steps + 1, (rows,), device=device, generator=generator)

    # ------------------------------------------------------------------------------ fitting
    def fit(self, dataset, device: str | torch.device = "cpu", progress: bool = True) -> list[dict]:
        """Train on a dataset's transitions (`transition_arrays`); returns the log: the held-out loss
        (same draws every time) of the averaged weights, every tenth of the updates."""
        cfg, device = self.config, torch.device(device)
        self.to(device)
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        inputs, targets = (torch.as_tensor(a, device=device) for a in transition_arrays(dataset))
        check_fit_rows(len(inputs), cfg.holdout_ratio, None, cfg.batch_size, "the dataset (refiner)")
        order = torch.randperm(len(inputs), device=device, generator=generator)
        n_holdout = max(1, int(round(cfg.holdout_ratio * len(inputs))))
        holdout, train = order[:n_holdout], order[n_holdout:]
        self.input_mean.copy_(inputs[train].mean(0))
        self.input_std.copy_(inputs[train].std(0).clamp_min(1e-6))
        self.target_mean.copy_(targets[train].mean(0))
        self.target_std.copy_(targets[train].std(0).clamp_min(1e-6))
        condition = (inputs - self.input_mean) / self.input_std
        target = (targets - self.target_mean) / self.target_std
        check = torch.Generator(device=device).manual_seed(cfg.seed + 1)  # the held-out draws, fixed
        held_k = self._steps(len(holdout), check, device)
        held_noise = torch.randn(target[holdout].shape, device=device, generator=check)

        average = copy.deepcopy(self.net)
        for p in average.parameters():
            p.requires_grad_(False)
        optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate, **adam_kernel())
        trained = self.net
        self.train_log = []
        bar = progress_bar(iterable=range(cfg.updates), desc="refiner", disable=not progress)
        for update in bar:
            rows = train[torch.randint(0, len(train), (cfg.batch_size,), device=device, generator=generator)]
            k = self._steps(cfg.batch_size, generator, device)
            noise = torch.randn((cfg.batch_size, target.shape[1]), device=device, generator=generator)
            loss = self.loss(condition[rows], target[rows], k, noise)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(average.parameters()), list(trained.parameters()), 1.0 - cfg.ema_decay)
            if (update + 1) % max(1, cfg.updates // 10) == 0 or update + 1 == cfg.updates:
                with torch.no_grad():
                    self.net = average
                    held = self.loss(condition[holdout], target[holdout], held_k, held_noise).item()
                    self.net = trained
                self.train_log.append({"update": update + 1, "train_loss": loss.item(), "holdout_loss": held})
        self.net = average
        for p in self.net.parameters():
            p.requires_grad_(True)
        self.fitted.fill_(True)
        self.is_fitted = True
        return self.train_log

    # ------------------------------------------------------------------------------ use
    @torch.no_grad()
    def _refine_standardised(self, start: torch.Tensor, condition: torch.Tensor,
                             generator: Optional[torch.Generator]) -> torch.Tensor:
        u = start
        for k in range(1, self.config.steps + 1):
            sigma = float(self.sigma[k])
            noisy = u + sigma * torch.randn(u.shape, device=u.device, generator=generator)
            u = noisy - sigma * self(noisy, condition, torch.full((len(u),), k, dtype=torch.long, device=u.device))
        return u

    @torch.no_grad()
    def _own_start(self, condition: torch.Tensor) -> torch.Tensor:
        zeros = condition.new_zeros((len(condition), self.obs_dim + 1))
        return self(zeros, condition, torch.zeros(len(condition), dtype=torch.long, device=condition.device))

    @torch.no_grad()
    def refine(self, obs: torch.Tensor, act: torch.Tensor, next_obs: Optional[torch.Tensor] = None,
               rewards: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None,
               samples: Optional[int] = None) -> dict[str, torch.Tensor]:
        """Refined transitions from ``(obs, act)``: step 0 is the given prediction ``(next_obs, rewards)``
        (raw units; ``start="ensemble"``) or the network's own (``start="own"``, which ignores them);
        ``samples`` (default ``config.samples``) refinements with independent noise.

        Returns ``next_observations`` ``(B, obs_dim)`` and ``rewards`` ``(B,)`` of the first refinement,
        and with two or more ``refiner`` ``(B,)``: the RMS over outputs of the refinements' std, in the
        standardised target space.
        """
        self._require_fitted()
        samples = self.config.samples if samples is None else samples
        condition = self.condition(obs, act)
        if self.config.start == "own":
            start = self._own_start(condition)
        else:
            if next_obs is None or rewards is None:
                raise ValueError("refiner.start='ensemble' refines a model's prediction: pass next_obs and rewards")
            start = (torch.cat([next_obs - obs, rewards.unsqueeze(-1)], dim=-1) - self.target_mean) / self.target_std
        rows = len(obs)
        refined = self._refine_standardised(start.repeat(samples, 1), condition.repeat(samples, 1), generator)
        refined = refined.view(samples, rows, -1)
        raw = refined[0] * self.target_std + self.target_mean
        result = {"next_observations": obs + raw[:, :-1], "rewards": raw[:, -1]}
        if samples >= 2:
            result["refiner"] = refined.var(dim=0, correction=0).mean(dim=-1).sqrt()
        return result

    def predict(self, obs: torch.Tensor, act: torch.Tensor, generator: Optional[torch.Generator] = None
                ) -> dict[str, torch.Tensor]:
        """The refiner's own prediction (the paper's: step 0 from zeros, then K refinements), whatever
        ``start`` it was trained for; only a refiner trained with ``start="own"`` learned step 0."""
        self._require_fitted()
        if self.config.start != "own":
            raise ConfigError("this refiner was trained with refiner.start=ensemble, which never learns step 0; "
                              "fit one with refiner.start=own to predict on its own.")
        return self.refine(obs, act, generator=generator)

    # ------------------------------------------------------------------------------ save/load
    def save(self, path: str | Path) -> Path:
        save_plain({"obs_dim": self.obs_dim, "act_dim": self.act_dim, "config": asdict(self.config),
                    "state_dict": self.state_dict(), "train_log": self.train_log}, path)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "DynamicsRefiner":
        saved = load_plain(path, map_location, "If it is a cached refiner, delete it and it is fitted again; "
                                               "otherwise load only files from a source you trust.")
        if not isinstance(saved, dict) or not {"obs_dim", "act_dim", "config", "state_dict"} <= saved.keys():
            raise CheckpointError(f"{path} is not a saved DynamicsRefiner (DynamicsRefiner.save writes one); pass a "
                                  f"refiner file, or delete a damaged cached one to fit it again.")
        model = cls(saved["obs_dim"], saved["act_dim"], RefinerConfig(**saved["config"]))
        model.load_state_dict(saved["state_dict"])
        model.train_log = saved.get("train_log", [])
        return model.to(map_location)


def default_cache_dir() -> Path:
    """``$MBRL_OFFLINE_CACHE/refiner``, else ``~/.cache/mbrl_offline/refiner``."""
    return cache_root() / "refiner"


def load_or_fit_refiner(dataset, config: RefinerConfig = RefinerConfig(), cache_dir: Optional[str | Path] = None,
                        device: str | torch.device = "cpu", progress: bool = True) -> tuple[DynamicsRefiner, Path]:
    """The refiner trained on ``dataset`` with ``config``: loaded from the cache if it was trained before
    (keyed by the dataset's fingerprint and the settings that change the fit: all but ``enabled`` and
    ``samples``, which are taken from ``config``), else fitted and saved there. Returns it and its file."""

    def fit() -> DynamicsRefiner:
        model = DynamicsRefiner(dataset.obs_dim, dataset.act_dim, config)
        model.fit(dataset, device=device, progress=progress)
        return model

    model, path = load_or_fit("refiner", dataset.env_name or "env", dataset.fingerprint(), cache_settings(config), fit,
                              save=lambda model, path: model.save(path),
                              load=lambda path: DynamicsRefiner.load(path, map_location=device),
                              cache_dir=cache_dir)
    model.config = config  # the use-only settings (enabled, samples) are the caller's
    return model, path


__all__ = ["DynamicsRefiner", "RefinerConfig", "load_or_fit_refiner", "REFINER_STARTS"]
