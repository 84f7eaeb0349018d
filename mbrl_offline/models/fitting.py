"""Fitting a member-batched ensemble: the holdout split, each member's rows per epoch, early stopping
on the holdout error with per-member snapshots, and elite selection.

These are the parts of `GaussianEnsembleDynamics.fit` that do not depend on what the members model,
kept apart so that any ensemble whose members train as one batched computation (a dynamics
ensemble of 7 members for MBPO-style rollouts, 128 for NEUBAY's posterior) fits the same way. The
model brings its loss and gradients (a training step over ``(members, batch)`` row indices) and its
holdout error per member; `fit_ensemble` runs the epochs.

The rules, with the settings that choose them (fields of `mbrl_offline.models.dynamics.DynamicsConfig`):

* holdout: ``round(holdout_ratio * rows)`` rows drawn at random, at most ``max_holdout``;
* batches: ``rows // batch_size`` per epoch, or ``ceil(rows / batch_size)`` with ``drop_last=False``;
* each member's rows per epoch (``bootstrap``): a fresh resample with replacement ("every_epoch"),
  one resample drawn before training and reshuffled each epoch ("once"), or a shuffle of all rows ("none");
* early stopping: a member improves when its holdout MSE drops by more than ``improvement_threshold``
  (relative; or absolute with ``improvement="absolute"``) below its best; its parameters are then snapshot; training stops after ``patience``
  epochs in which no member improved, but not before ``min_epochs`` (before then, running out of
  patience lowers the learning rate once, by 0.3, as RAVL's code does);
* the model ends with each member's best snapshot, and the elites are the ``num_elites`` members with
  the lowest best holdout MSE.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Optional, Protocol

import torch

from mbrl_offline.utils import progress_bar


class FittableEnsemble(Protocol):
    """What `fit_ensemble` needs of a model."""

    def holdout_mse(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (members,)
        ...

    def copy_members(self, state: dict, members: torch.Tensor) -> None:  # members: bool mask
        ...

    def state_dict(self) -> dict:
        ...


def _holdout_rows(rows: int, holdout_ratio: float, max_holdout: Optional[int]) -> int:
    n_holdout = int(round(rows * holdout_ratio))
    return min(n_holdout, max_holdout) if max_holdout is not None else n_holdout


def min_fit_rows(holdout_ratio: float, max_holdout: Optional[int], batch_size: int) -> Optional[int]:
    """The fewest transitions `split_holdout` accepts: one held-out row and a training batch of
    ``batch_size`` rows after the holdout; None where no number is enough (nothing is held out)."""
    if holdout_ratio <= 0 or (max_holdout is not None and max_holdout < 1):
        return None
    rows = batch_size + 1
    while _holdout_rows(rows, holdout_ratio, max_holdout) < 1 or rows - _holdout_rows(rows, holdout_ratio,
                                                                                        max_holdout) < batch_size:
        rows += 1
    return rows


def check_dynamics_rows(dataset, dynamics) -> None:
    """`check_fit_rows` for fitting a dynamics ensemble with settings ``dynamics`` (a `DynamicsConfig`)
    on ``dataset``'s transitions."""
    check_fit_rows(len(dataset), dynamics.holdout_ratio, dynamics.max_holdout, dynamics.batch_size,
                   f"the dataset ({dataset.source})")


def check_fit_rows(rows: int, holdout_ratio: float, max_holdout: Optional[int], batch_size: int,
                   what: str = "the data") -> None:
    """Refuse, in one `DatasetError` line that names the minimum (`min_fit_rows`), too few rows to fit a
    model on with these settings. `mbrl_offline.build_run` calls it before anything is fitted or written."""
    from mbrl_offline.errors import DatasetError

    needed = min_fit_rows(holdout_ratio, max_holdout, batch_size)
    if needed is None:
        raise DatasetError(f"dynamics.holdout_ratio = {holdout_ratio} (max_holdout {max_holdout}) holds out no rows, "
                           f"so the model's early stopping has nothing to measure; set it above 0 (e.g. 0.2).")
    if rows < needed:
        raise DatasetError(f"{what} has {rows} transitions, too few to fit the dynamics model: with holdout_ratio "
                           f"{holdout_ratio} and batch_size {batch_size} it needs at least {needed}; use a larger "
                           f"dataset (or a smaller generator.dynamics.batch_size).")


def split_holdout(rows: int, holdout_ratio: float, max_holdout: Optional[int], batch_size: int,
                  generator: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices ``(train, holdout)``: ``round(holdout_ratio * rows)`` held out at random, at most
    ``max_holdout``; too few rows for one training batch are refused (`check_fit_rows`)."""
    check_fit_rows(rows, holdout_ratio, max_holdout, batch_size)
    order = torch.randperm(rows, generator=generator, device=device)
    n_holdout = _holdout_rows(rows, holdout_ratio, max_holdout)
    return order[n_holdout:], order[:n_holdout]


class MemberRows:
    """Each member's training rows for an epoch, ``(members, rows)`` indices, by the ``bootstrap`` rule."""

    def __init__(self, bootstrap: str, members: int, rows: int, generator: torch.Generator, device: torch.device):
        self.bootstrap, self.members, self.rows, self.generator, self.device = bootstrap, members, rows, generator, device
        if bootstrap == "once":  # OfflineRL-Kit: one resample per member, reshuffled every epoch
            self.resample = torch.randint(0, rows, (members, rows), generator=generator, device=device)

    def epoch(self) -> torch.Tensor:
        shape, generator, device = (self.members, self.rows), self.generator, self.device
        if self.bootstrap == "every_epoch":
            return torch.randint(0, self.rows, shape, generator=generator, device=device)
        index = torch.argsort(torch.rand(shape, generator=generator, device=device), dim=1)
        return torch.gather(self.resample, 1, index) if self.bootstrap == "once" else index


IMPROVEMENTS = ("relative", "absolute")


class EarlyStopping:
    """Per-member best holdout error and snapshot, and the stopping rule (see the module docstring).

    ``improvement``: a member improves when ``(best - error) / best`` ("relative", the dynamics
    ensembles' rule) or ``best - error`` ("absolute": NEUBAY's bandit reward ensemble, on the holdout
    NLL, which can be negative) exceeds ``improvement_threshold``."""

    def __init__(self, model: FittableEnsemble, initial_mse: torch.Tensor, improvement_threshold: float,
                 patience: int, min_epochs: int, improvement: str = "relative"):
        if improvement not in IMPROVEMENTS:
            raise ValueError(f"unknown improvement rule '{improvement}'; choose one of {', '.join(IMPROVEMENTS)}")
        self.model, self.threshold, self.patience, self.min_epochs = model, improvement_threshold, patience, min_epochs
        self.improvement = improvement
        self.best_mse = initial_mse
        self.best_state = copy.deepcopy(model.state_dict())
        self.epochs_since_improvement, self.lr_dropped = 0, False

    def step(self, epoch: int, mse: torch.Tensor) -> str:
        """Record an epoch's holdout MSE per member: "continue", "stop", or "lower_lr" (patience ran out
        before ``min_epochs``, the first time)."""
        drop = self.best_mse - mse
        improved = (drop if self.improvement == "absolute" else drop / self.best_mse) > self.threshold
        if improved.any():
            self.model.copy_members(self.best_state, improved)
            self.best_mse = torch.where(improved, mse, self.best_mse)
            self.epochs_since_improvement = 0
        else:
            self.epochs_since_improvement += 1
        if self.epochs_since_improvement < self.patience:
            return "continue"
        if epoch >= self.min_epochs:
            return "stop"
        self.epochs_since_improvement = 0
        if self.lr_dropped:
            return "continue"
        self.lr_dropped = True
        return "lower_lr"


def select_elites(best_mse: torch.Tensor, num_elites: int) -> torch.Tensor:
    """The ``num_elites`` members with the lowest holdout MSE, in increasing index order."""
    return torch.argsort(best_mse)[:num_elites].sort().values


def fit_ensemble(model: FittableEnsemble, train: tuple[torch.Tensor, torch.Tensor],
                 holdout: tuple[torch.Tensor, torch.Tensor], config, train_batch: Callable[[torch.Tensor], torch.Tensor],
                 optimizer: torch.optim.Optimizer, generator: torch.Generator, progress: bool = True,
                 desc: str = "dynamics", on_lower_lr: Optional[Callable[[], None]] = None,
                 keep_last: tuple[str, ...] = ()) -> tuple[list[dict], torch.Tensor]:
    """Train ``model`` epoch by epoch until early stopping; returns the epoch log and each member's
    best holdout MSE, with the model holding each member's best snapshot.

    ``train_batch(rows)`` takes ``(members, batch_size)`` indices into the training rows (member i
    trains on rows ``rows[i]``), takes one optimiser step and returns the batch's loss (a tensor: the
    epoch sums it on the device, no sync per batch). ``config`` has ``batch_size``, ``bootstrap``,
    ``ensemble_size``, ``max_epochs``, ``min_epochs``, ``patience`` and ``improvement_threshold``, and
    may have ``improvement`` ("relative" when absent, see `EarlyStopping`) and ``drop_last`` (True when
    absent: an epoch's final partial batch is dropped; False: it is trained, ``ceil(rows / batch_size)``
    batches).
    ``keep_last`` names state entries that belong to no member (shared parameters): they keep their
    last values instead of a snapshot's. ``on_lower_lr`` is called after the learning rate is lowered.
    """
    train_x, train_y = train
    holdout_x, holdout_y = holdout
    device = train_x.device
    rows = MemberRows(config.bootstrap, config.ensemble_size, len(train_x), generator, device)
    stopping = EarlyStopping(model, model.holdout_mse(holdout_x, holdout_y), config.improvement_threshold,
                             config.patience, config.min_epochs, getattr(config, "improvement", "relative"))
    log: list[dict] = []
    bar = progress_bar(total=config.max_epochs, desc=desc, disable=not progress)
    if getattr(config, "drop_last", True):
        batches = len(train_x) // config.batch_size  # a final partial batch is dropped (a fresh shuffle follows)
        trained_rows = batches * config.batch_size
    else:
        batches = -(-len(train_x) // config.batch_size)  # the final partial batch trains too (NEUBAY)
        trained_rows = len(train_x)
    for epoch in range(1, config.max_epochs + 1):
        model.train()
        index = rows.epoch()
        epoch_loss = torch.zeros((), device=device)
        start = time.perf_counter()
        for b in range(batches):
            epoch_loss += train_batch(index[:, b * config.batch_size:(b + 1) * config.batch_size])
        epoch_loss = epoch_loss.item()  # waits for the device, so the time below is the batches'
        batch_seconds = time.perf_counter() - start
        model.eval()
        mse = model.holdout_mse(holdout_x, holdout_y)
        decision = stopping.step(epoch, mse)
        log.append({"epoch": epoch, "train_loss": epoch_loss / batches,
                    "samples_per_s": trained_rows / batch_seconds,
                    "holdout_mse": mse.tolist(), "best_holdout_mse": stopping.best_mse.tolist()})
        bar.update(1)
        bar.set_postfix(loss=f"{epoch_loss / batches:.3f}", holdout=f"{stopping.best_mse.mean().item():.4f}")
        if decision == "stop":
            break
        if decision == "lower_lr":  # RAVL: patience ran out before min_epochs: lower the rate once
            for group in optimizer.param_groups:
                group["lr"] *= 0.3
            if on_lower_lr is not None:
                on_lower_lr()
    bar.close()
    optimizer.zero_grad(set_to_none=True)
    state = model.state_dict()
    best_state = stopping.best_state
    for name in keep_last:  # not part of any member's snapshot: the last values
        best_state[name] = state[name].detach()
    model.load_state_dict(best_state)
    return log, stopping.best_mse
