"""Aggregate statistics of final scores over runs and tasks, with the stratified bootstrap confidence
intervals reviewers ask for.

The definitions are rliable's (Agarwal et al., 2021, "Deep Reinforcement Learning at the Edge of the
Statistical Precipice"; google-research/rliable, ``rliable/metrics.py`` and ``rliable/library.py``):

* the **interquartile mean** (IQM): the mean of the middle 50% of all runs' scores pooled over tasks
  (``aggregate_iqm``: ``scipy.stats.trim_mean(scores, 0.25, axis=None)``, which cuts ``int(0.25 n)``
  scores from each end);
* the **mean**: the mean over tasks of each task's mean over runs (``aggregate_mean``);
* 95% **stratified bootstrap** intervals (``get_interval_estimates``: ``StratifiedBootstrap`` with the
  percentile method): each replicate redraws every task's runs with replacement within that task, and
  the interval is the 2.5th and 97.5th percentiles of the statistic over replicates;
* **performance profiles** (``create_performance_profile`` on the score distribution): for each
  threshold tau, the mean over tasks of the fraction of a task's runs that score above tau, with the
  same intervals;
* the **probability of improvement** P(X > Y) (``probability_of_improvement``): per task, the
  Mann-Whitney U statistic of X's runs against Y's divided by the number of pairs (a tie counts half),
  averaged over the tasks both were run on; its interval redraws X's and Y's runs independently within
  each task (``StratifiedIndependentBootstrap``).

Deviations from rliable, and why:
- rliable takes a runs x tasks matrix, the same number of runs on every task. Logged runs often have
  different numbers of seeds per task (a failed run, a seed added later), so scores here are a list of
  per-task arrays: the IQM pools them all, and every other statistic weighs tasks equally, as rliable
  does; the bootstrap redraws each task's own runs.
- This module is written with NumPy rather than importing rliable: rliable 1.2.0, the newest on PyPI
  (source only), requires ``arch``, ``scipy``, ``absl-py``, ``seaborn`` and ``pandas``, five packages
  this library does not otherwise need, for statistics that are a few lines each.
  `tests/test_statistics.py` checks them on hand-worked cases.

Every function takes a seeded ``numpy.random.Generator`` (or a seed), so a report is reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mbrl_offline.errors import InputError

TaskScores = Sequence[np.ndarray]  # one 1-D array of run scores per task
REPS = 50_000  # rliable's default number of bootstrap replicates
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its confidence interval ``(low, high)``."""
    value: float
    low: float
    high: float

    def text(self, digits: int = 1) -> str:
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _tasks(scores: TaskScores, what: str = "scores") -> list[np.ndarray]:
    tasks = [np.asarray(task, dtype=float).reshape(-1) for task in scores]
    if not tasks or any(task.size == 0 for task in tasks):
        raise InputError(f"{what}: give at least one task with at least one run score per task "
                         f"(got {[task.size for task in tasks]} runs per task).")
    if any(not np.all(np.isfinite(task)) for task in tasks):
        raise InputError(f"{what}: every score must be a finite number (found NaN or infinity).")
    return tasks


def trim_mean(values: np.ndarray, proportion: float = 0.25, axis: int = -1) -> np.ndarray:
    """The mean after cutting ``int(proportion * n)`` values from each end along ``axis``
    (``scipy.stats.trim_mean``'s rule, which rliable's IQM uses)."""
    values = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = values.shape[axis]
    cut = int(proportion * n)
    return np.take(values, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def iqm(scores: TaskScores) -> float:
    """The interquartile mean of all runs' scores pooled over tasks."""
    return float(trim_mean(np.concatenate(_tasks(scores)), 0.25))


def mean(scores: TaskScores) -> float:
    """The mean over tasks of each task's mean score."""
    return float(np.mean([task.mean() for task in _tasks(scores)]))


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _resample(tasks: list[np.ndarray], reps: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per task, ``(reps, n_task)`` redraws of its runs with replacement (one stratum per task)."""
    return [task[rng.integers(0, task.size, size=(reps, task.size))] for task in tasks]


def _interval(point: float, replicates: np.ndarray) -> Estimate:
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return Estimate(point, float(low), float(high))


def iqm_estimate(scores: TaskScores, reps: int = REPS, seed=0) -> Estimate:
    """The IQM with its 95% stratified bootstrap interval."""
    tasks = _tasks(scores)
    replicates = trim_mean(np.concatenate(_resample(tasks, reps, _rng(seed)), axis=1), 0.25, axis=1)
    return _interval(iqm(tasks), replicates)


def mean_estimate(scores: TaskScores, reps: int = REPS, seed=0) -> Estimate:
    """The mean over tasks with its 95% stratified bootstrap interval."""
    tasks = _tasks(scores)
    replicates = np.mean([draws.mean(axis=1) for draws in _resample(tasks, reps, _rng(seed))], axis=0)
    return _interval(mean(tasks), replicates)


def performance_profile(scores: TaskScores, thresholds: np.ndarray, reps: int = 2_000,
                        seed=0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fraction, low, high)`` at each threshold tau: the mean over tasks of the share of runs scoring
    above tau, and its 95% stratified bootstrap interval (rliable's figures use 2,000 replicates)."""
    tasks = _tasks(scores)
    thresholds = np.asarray(thresholds, dtype=float)
    point = np.mean([(task[:, None] > thresholds).mean(axis=0) for task in tasks], axis=0)
    # (reps, thresholds) per task, then the mean over tasks
    replicates = np.mean([(draws[:, :, None] > thresholds).mean(axis=1)
                          for draws in _resample(tasks, reps, _rng(seed))], axis=0)
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return point, low, high


def _pairs_above(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) from the runs ``x (..., n)`` and ``y (..., m)``: the share of pairs where x wins, a tie
    counted half (the Mann-Whitney U statistic over n m)."""
    diff = x[..., :, None] - y[..., None, :]
    return ((diff > 0).sum(axis=(-2, -1)) + 0.5 * (diff == 0).sum(axis=(-2, -1))) / (x.shape[-1] * y.shape[-1])


def probability_of_improvement(x: TaskScores, y: TaskScores, reps: int = 2_000, seed=0) -> Estimate:
    """P(X > Y) averaged over tasks (``x`` and ``y``: the same tasks in the same order), with its 95%
    interval from redrawing X's and Y's runs independently within each task."""
    x_tasks, y_tasks = _tasks(x, "x"), _tasks(y, "y")
    if len(x_tasks) != len(y_tasks):
        raise InputError(f"probability_of_improvement: x and y must hold the same tasks (got {len(x_tasks)} "
                         f"and {len(y_tasks)}).")
    rng = _rng(seed)
    point = float(np.mean([_pairs_above(a, b) for a, b in zip(x_tasks, y_tasks)]))
    x_draws, y_draws = _resample(x_tasks, reps, rng), _resample(y_tasks, reps, rng)
    replicates = np.mean([_pairs_above(a, b) for a, b in zip(x_draws, y_draws)], axis=0)
    return _interval(point, replicates)


def bootstrap_mean(values: Sequence[float], reps: int = REPS, seed=0) -> Estimate:
    """The mean of one task's runs with its 95% bootstrap interval (one stratum)."""
    return mean_estimate([np.asarray(values, dtype=float)], reps, seed)


__all__ = ["CONFIDENCE", "Estimate", "REPS", "bootstrap_mean", "iqm", "iqm_estimate", "mean", "mean_estimate",
           "performance_profile", "probability_of_improvement", "trim_mean"]
