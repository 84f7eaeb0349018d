"""Fixed-length windows of consecutive rows of an `OfflineDataset`, inside its episodes: the training
data of sequence models (policy-guided diffusion's trajectory windows, `mbrl_offline.generators.pgd`).

`window_starts` chooses the windows as policy-guided diffusion's official code does
(EmptyJackson/policy-guided-diffusion, ``environments/dataset.py::_assemble_dataset``):

* a window of ``length`` rows may start at row s when none of its rows but the last ends an episode
  (``terminals | timeouts``): windows never cross an episode end;
* of those valid starts, every ``stride``-th (counted along the list of valid starts, as the official
  ``valid_start_idxs[::stride]``) is taken, plus every valid window that starts an episode and every
  valid window whose last row is a terminal (so episode starts and terminations are all seen);
* windows whose last row is a timeout are removed (the time limit is not part of the dynamics), also
  when that row is a terminal too (the removal comes last in the official code as well).

The one difference from the official code: it drops the dataset's very last row (its s' comes from
the next row), so its last episode has no end flag; here that row is kept and flagged a timeout by
`OfflineDataset`, so the window ending on it is removed. Episode boundaries are the dataset's own
(`OfflineDataset.episode_ends`), as `mbrl_offline.buffer.SequenceBuffer` uses them.
"""
from __future__ import annotations

import numpy as np

from mbrl_offline.errors import ConfigError


def window_starts(terminals: np.ndarray, timeouts: np.ndarray, length: int, stride: int) -> np.ndarray:
    """Sorted start rows (int64) of the windows of ``length`` rows (see the module docstring)."""
    terminals, timeouts = np.asarray(terminals, bool), np.asarray(timeouts, bool)
    n = len(terminals)
    if length < 1 or stride < 1:
        raise ConfigError(f"windows need length >= 1 and stride >= 1, got length {length}, stride {stride}.")
    if n < length:
        return np.zeros(0, dtype=np.int64)
    ends = (terminals | timeouts).astype(np.int64)
    before = np.concatenate([[0], np.cumsum(ends)])  # before[i]: episode ends among rows 0 .. i-1
    candidates = np.arange(n - length + 1)
    valid = before[candidates + length - 1] - before[candidates] == 0  # no end among the first length-1 rows
    valid_starts = candidates[valid]
    chosen = set(valid_starts[::stride].tolist())
    episode_starts = np.concatenate([[0], np.flatnonzero(ends) + 1])
    ending_terminal = np.flatnonzero(terminals) - (length - 1)
    valid_set = set(valid_starts.tolist())
    chosen |= valid_set & set(episode_starts.tolist())
    chosen |= valid_set & set(ending_terminal.tolist())
    chosen -= set((np.flatnonzero(timeouts) - (length - 1)).tolist())
    return np.array(sorted(chosen), dtype=np.int64)


def dataset_windows(dataset, length: int, stride: int, where: str = "windows") -> np.ndarray:
    """`window_starts` of ``dataset`` (an `OfflineDataset`); raises `ConfigError` in one line when the
    dataset has none (every episode shorter than ``length`` rows, or ending in a timeout right after)."""
    starts = window_starts(dataset.terminals, dataset.timeouts, length, stride)
    if len(starts) == 0:
        ends = np.flatnonzero(dataset.episode_ends)
        longest = int(np.diff(np.concatenate([[-1], ends])).max()) if len(ends) else len(dataset)
        raise ConfigError(f"{where}: {dataset.source} has no window of {length} rows inside one episode (its longest "
                          f"episode has {longest} rows); use a dataset with longer episodes or shorter windows.")
    return starts


def gather_windows(rows: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """``rows[s : s + length]`` for each start: shape ``(len(starts), length, *rows.shape[1:])``."""
    return rows[np.asarray(starts)[:, None] + np.arange(length)]


__all__ = ["dataset_windows", "gather_windows", "window_starts"]
