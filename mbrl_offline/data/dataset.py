"""`OfflineDataset`: the one in-memory form of every dataset source.

Transitions are stored flat, D4RL-style, with two end-of-episode flags whose difference matters:

* ``terminals[i]``: the environment terminated at transition i (the robot fell). Value targets do
  not bootstrap from ``next_observations[i]``.
* ``timeouts[i]``: the episode was cut at transition i (time limit, or the end of the recorded data)
  without terminating. Targets still bootstrap; only the episode boundary is recorded.

Every transition keeps its own ``next_observations``, so the last transition of a timed-out episode
is kept (``d4rl.qlearning_dataset`` drops it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np

from mbrl_offline.errors import DatasetError, InputTypeError, type_name

FLOAT_KEYS = ("observations", "actions", "rewards", "next_observations")
FLAG_KEYS = ("terminals", "timeouts")


@dataclass
class OfflineDataset:
    observations: np.ndarray  # (N, obs_dim) float32
    actions: np.ndarray  # (N, act_dim) float32
    rewards: np.ndarray  # (N,) float32
    next_observations: np.ndarray  # (N, obs_dim) float32
    terminals: np.ndarray  # (N,) bool: true termination, no bootstrapping
    timeouts: np.ndarray  # (N,) bool: episode cut without termination
    env_name: Optional[str] = None  # short name in the env registry, e.g. "hopper"
    env_id: Optional[str] = None  # Gymnasium id of the evaluation env, e.g. "Hopper-v5"
    ref_min_score: Optional[float] = None  # return of normalised score 0 (random policy)
    ref_max_score: Optional[float] = None  # return of normalised score 100 (expert policy)
    source: str = "<arrays>"  # where the data came from; named in every error message
    metadata: dict[str, Any] = field(default_factory=dict)  # provenance (policy return, steps, seed, ...)

    def __post_init__(self):
        self.observations = _as_float32(self.observations)
        self.actions = _as_float32(self.actions)
        self.rewards = _as_float32(self.rewards)
        self.next_observations = _as_float32(self.next_observations)
        self.terminals = np.asarray(self.terminals).astype(bool, copy=False)
        self.timeouts = np.asarray(self.timeouts).astype(bool, copy=False)
        self.validate()
        if not (self.terminals[-1] or self.timeouts[-1]):  # the end of the data cuts the last episode
            self.timeouts = self.timeouts.copy()
            self.timeouts[-1] = True

    # ----------------------------------------------------------------------------------- checks
    def validate(self, obs_dim: Optional[int] = None, act_dim: Optional[int] = None) -> None:
        """Raise `DatasetError` naming the source and the problem, if the arrays are malformed."""
        where = self.source
        n = len(self.rewards)
        if n == 0:
            raise DatasetError(f"{where}: the dataset is empty (0 transitions).")
        for key in FLOAT_KEYS + FLAG_KEYS:
            if len(getattr(self, key)) != n:
                lengths = ", ".join(f"{k}={len(getattr(self, k))}" for k in FLOAT_KEYS + FLAG_KEYS)
                raise DatasetError(f"{where}: arrays have different lengths ({lengths}); every key "
                                   "needs one row per transition.")
        for key, ndim in (("observations", 2), ("actions", 2), ("rewards", 1), ("next_observations", 2),
                          ("terminals", 1), ("timeouts", 1)):
            if getattr(self, key).ndim != ndim:
                raise DatasetError(f"{where}: '{key}' has shape {getattr(self, key).shape}; expected "
                                   f"{ndim} dimension(s).")
        if self.next_observations.shape[1] != self.observations.shape[1]:
            raise DatasetError(f"{where}: next_observations have {self.next_observations.shape[1]} columns "
                               f"but observations have {self.observations.shape[1]}.")
        for key in FLOAT_KEYS:
            values = getattr(self, key)
            finite = np.isfinite(values) if values.ndim == 1 else np.isfinite(values).all(axis=1)
            if not finite.all():
                row = int(np.argmin(finite))
                raise DatasetError(f"{where}: '{key}' has {int((~finite).sum())} row(s) with NaN or Inf "
                                   f"values (first at row {row}); clean or regenerate the dataset.")
        for key, expected in (("observations", obs_dim), ("actions", act_dim)):
            actual = getattr(self, key).shape[1]
            if expected is not None and actual != expected:
                raise DatasetError(f"{where}: '{key}' have dimension {actual} but env '{self.env_name}' "
                                   f"expects {expected}; the dataset was made for another environment.")

    # ------------------------------------------------------------------------------- structure
    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def obs_dim(self) -> int:
        return self.observations.shape[1]

    @property
    def act_dim(self) -> int:
        return self.actions.shape[1]

    @property
    def episode_ends(self) -> np.ndarray:
        """Bool mask of the last transition of each episode."""
        return self.terminals | self.timeouts

    def episode_slices(self) -> Iterator[slice]:
        start = 0
        for end in np.flatnonzero(self.episode_ends):
            yield slice(start, end + 1)
            start = end + 1

    @property
    def num_episodes(self) -> int:
        return int(self.episode_ends.sum())

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of every episode (float64)."""
        ends = np.flatnonzero(self.episode_ends)
        sums = np.cumsum(self.rewards, dtype=np.float64)[ends]
        return np.diff(sums, prepend=0.0)

    def fingerprint(self) -> str:
        """A hash of the transitions (not of the metadata): equal data gives an equal fingerprint."""
        import hashlib

        digest = hashlib.sha256()
        for key in FLOAT_KEYS + FLAG_KEYS:
            values = np.ascontiguousarray(getattr(self, key))
            digest.update(f"{key}{values.shape}{values.dtype}".encode())
            digest.update(values.tobytes())
        return digest.hexdigest()[:20]

    # ---------------------------------------------------------------------------------- scores
    def normalized_score(self, returns):
        """D4RL's normalised score, 100 * (return - ref_min) / (ref_max - ref_min)."""
        if self.ref_min_score is None or self.ref_max_score is None:
            raise DatasetError(f"{self.source}: no reference scores, so returns cannot be normalised; set "
                               "ref_min_score and ref_max_score (the env registry has them for known envs).")
        return 100.0 * (np.asarray(returns, dtype=np.float64) - self.ref_min_score) / (
            self.ref_max_score - self.ref_min_score)

    def summary(self) -> dict[str, Any]:
        returns = self.episode_returns()
        info: dict[str, Any] = {
            "source": self.source, "env": self.env_id, "transitions": len(self), "episodes": len(returns),
            "obs_dim": self.obs_dim, "act_dim": self.act_dim, "terminals": int(self.terminals.sum()),
            "return_mean": float(returns.mean()), "return_std": float(returns.std()),
        }
        if self.ref_min_score is not None and self.ref_max_score is not None:
            info["normalized_score_mean"] = float(self.normalized_score(returns).mean())
        return info

    def __repr__(self) -> str:
        return (f"OfflineDataset(source={self.source!r}, env={self.env_id!r}, transitions={len(self)}, "
                f"episodes={self.num_episodes}, obs_dim={self.obs_dim}, act_dim={self.act_dim})")

    # ------------------------------------------------------------------------------- combining
    def subset(self, index) -> "OfflineDataset":
        """The rows ``index`` (indices or a bool mask), with this dataset's env, scores and metadata."""
        return OfflineDataset(
            **{k: getattr(self, k)[index] for k in FLOAT_KEYS + FLAG_KEYS}, env_name=self.env_name,
            env_id=self.env_id, ref_min_score=self.ref_min_score, ref_max_score=self.ref_max_score,
            source=self.source, metadata=dict(self.metadata))

    @classmethod
    def concatenate(cls, parts: list["OfflineDataset"], source: str, metadata: Optional[dict] = None):
        """Datasets of one env joined end to end (each part's last row already ends an episode)."""
        first = parts[0]
        return cls(
            **{k: np.concatenate([getattr(p, k) for p in parts]) for k in FLOAT_KEYS + FLAG_KEYS},
            env_name=first.env_name, env_id=first.env_id,
            ref_min_score=first.ref_min_score, ref_max_score=first.ref_max_score, source=source,
            metadata=metadata or {},
        )


def true_successors(dataset) -> np.ndarray:
    """A mask of the rows whose ``next_observations`` are the true successors: every row, except the
    terminal rows of data whose next observations were inferred (``metadata["inferred_next_observations"]``:
    a D4RL file without stored next observations, `mbrl_offline.data.d4rl_hdf5`), where the stored one
    is not the state the action led to. Models of transitions leave those rows out."""
    if getattr(dataset, "metadata", {}).get("inferred_next_observations"):
        return ~np.asarray(dataset.terminals, bool)
    return np.ones(len(dataset.rewards), bool)


def require_dataset(dataset, where: str) -> None:
    """Raise `InputTypeError` naming ``where`` unless ``dataset`` is an `OfflineDataset` (or an object with
    its transition arrays, ``env_name`` and ``fingerprint``): a numpy array or a path handed where a
    dataset belongs gets one clear line instead of an AttributeError from deep inside."""
    needed = (*FLOAT_KEYS, *FLAG_KEYS, "env_name", "fingerprint")
    if isinstance(dataset, OfflineDataset) or all(hasattr(dataset, name) for name in needed):
        return
    raise InputTypeError(f"{where} needs an OfflineDataset, got {type_name(dataset)}; load one with "
                         f"mbrl_offline.load_dataset('hopper-medium') (a name or a file), or build "
                         f"OfflineDataset(observations=..., actions=..., rewards=..., next_observations=..., "
                         f"terminals=..., timeouts=..., env_name='hopper').")


def dataset_env(dataset, where: str):
    """The registry entry (`mbrl_offline.data.envs.EnvInfo`) of ``dataset``'s env: what every agent's
    ``for_dataset``, every generator's and `mbrl_offline.build_run` call first, since the agent's sizes
    and action bounds come from the env. Refused in one line naming ``where``: what is not a dataset
    (`InputTypeError`, `require_dataset`), a dataset that names no env, one whose env is not in the
    registry, and one whose observations or actions are not the env's widths (`DatasetError`)."""
    from mbrl_offline.data.envs import ENVS, get_env_info
    from mbrl_offline.errors import ConfigError

    require_dataset(dataset, where)
    name = dataset.env_name or getattr(dataset, "env_id", None)
    source = getattr(dataset, "source", "the dataset")
    if name is None:
        raise DatasetError(f"{where}: {source} names no env, so the agent's sizes and action bounds are unknown; "
                           f"load it with one (load_dataset(path, env='hopper')) or set dataset.env_name to one "
                           f"of {', '.join(ENVS)}.")
    try:
        info = get_env_info(name)
    except ConfigError as exc:
        raise DatasetError(f"{where}: {source} names env '{name}', which is not in the registry; set "
                           f"dataset.env_name to one of {', '.join(ENVS)}. ({exc})") from None
    if isinstance(dataset, OfflineDataset):
        try:
            dataset.validate(obs_dim=info.obs_dim, act_dim=info.act_dim)
        except DatasetError as exc:
            raise DatasetError(f"{where}: {exc}") from None
    return info


def _as_float32(values) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32))
