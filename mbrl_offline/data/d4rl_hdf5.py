"""D4RL-format HDF5 files, read and written with h5py (the ``d4rl`` package is not needed).

A D4RL file holds flat arrays: ``observations``, ``actions``, ``rewards``, ``terminals`` and usually
``next_observations`` and ``timeouts`` (D4RL's gym-mujoco v1/v2 files have both).

Reading follows the conventions of the maintained loaders (OfflineRL-Kit, TorchRL): when
``next_observations`` is stored it is used, so the last transition of every timed-out episode is
kept. When it is absent (older files), ``next_observations[i] = observations[i + 1]``, and the rows
whose successor is not in the file are dropped: the last row of each timed-out episode and the
file's final row, as ``d4rl.qlearning_dataset`` does (which also drops a row that both terminates
and times out; we keep it, since a terminal row needs no successor). Terminal rows are kept (their reward
and the terminal flag matter to value learning, which does not bootstrap from them), but their
``observations[i + 1]`` starts the next episode and is not the true successor; the dataset's
``metadata["inferred_next_observations"]`` is then True, so dynamics training can leave those rows out.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.errors import DatasetError
from mbrl_offline.utils import atomic_write_bytes

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")


def read_d4rl_hdf5(path: str | os.PathLike, source: Optional[str] = None) -> OfflineDataset:
    """Load a D4RL-format HDF5 file. Reference scores are left unset (the caller knows the env)."""
    import h5py

    path = Path(path)
    source = source or str(path)
    if not path.is_file():
        raise DatasetError(f"{source}: file not found; check the path, or make a dataset with "
                           "`mbrl-collect env=<env>`.")
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in REQUIRED_KEYS if k not in f]
            if missing:
                raise DatasetError(f"{source}: missing key(s) {missing}; a D4RL file needs {list(REQUIRED_KEYS)} "
                                   f"(it has {sorted(f.keys())}).")
            keys = [k for k in REQUIRED_KEYS + ("next_observations", "timeouts") if k in f]
            for key in keys:
                if not isinstance(f[key], h5py.Dataset):
                    what = "a group" if isinstance(f[key], h5py.Group) else f"a {type(f[key]).__name__}"
                    raise DatasetError(f"{source}: '{key}' is {what} where an array is expected; a D4RL file stores "
                                       f"'{key}' as one array (an HDF5 dataset) of one row per transition: "
                                       f"re-export the file.")
            arrays = {k: f[k][()] for k in keys}
            for key in ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations"):
                if key in arrays and np.asarray(arrays[key]).dtype.kind not in "fiub":
                    raise DatasetError(f"{source}: '{key}' holds {np.asarray(arrays[key]).dtype} values, not numbers.")
            for key in ("rewards", "terminals", "timeouts"):  # one value per transition: (N,), or (N, 1)
                shape = np.shape(arrays.get(key, ()))
                if key in arrays and not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
                    raise DatasetError(f"{source}: '{key}' has shape {shape}; it must be one column, one value per "
                                       f"transition ((N,) or (N, 1)): re-export the file with a single '{key}' column.")
    except DatasetError:
        raise
    except Exception as exc:  # h5py raises OSError, KeyError, ValueError... for damaged files
        raise DatasetError(f"{source}: cannot read the HDF5 file ({type(exc).__name__}: {exc}); it is corrupt or "
                           "truncated: re-download or re-export it.") from exc

    column = lambda values: np.asarray(values).reshape(-1) if np.ndim(values) == 2 else np.asarray(values)
    observations, rewards = np.asarray(arrays["observations"]), column(arrays["rewards"])
    inferred = "next_observations" not in arrays
    dataset = OfflineDataset(
        observations=observations, actions=arrays["actions"], rewards=rewards,
        next_observations=np.concatenate([observations[1:], observations[-1:]]) if inferred else arrays["next_observations"],
        terminals=column(arrays["terminals"]), timeouts=arrays.get("timeouts", np.zeros(len(rewards), bool)),
        source=source, metadata={"inferred_next_observations": True} if inferred else {})
    if not inferred:
        return dataset
    # Without stored successors, a row is usable only if the next row continues its episode (or it
    # terminates, so no successor is needed).
    keep = ~dataset.timeouts | dataset.terminals
    keep[-1] = dataset.terminals[-1]
    return dataset.subset(np.flatnonzero(keep))


def write_d4rl_hdf5(dataset: OfflineDataset, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``dataset`` as a D4RL-format HDF5 file (with next_observations and timeouts), atomically.

    The file is made in memory and its bytes written through `mbrl_offline.utils.atomic_path` (a
    temporary file in the same folder, renamed into place when complete). HDF5 itself never writes
    to the disk: a full disk fails in Python's own write, one `DatasetError` line that leaves no file
    behind and the old one (with ``overwrite``) untouched, instead of HDF5 failing to flush its open
    file again when the interpreter exits (which ended in a segmentation fault).

    Reference scores and provenance go into ``metadata/`` attributes, which other loaders ignore.
    """
    import io
    import json

    import h5py

    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"{path} is a folder; name the .hdf5 file to write, e.g. {path / 'dataset.hdf5'}.")
    if path.exists() and not overwrite:
        raise DatasetError(f"{path} already exists; delete it or pass overwrite=true.")
    memory = io.BytesIO()
    with h5py.File(memory, "w") as f:
        for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
            # shuffle+gzip: about 10% smaller than gzip alone on float observations
            f.create_dataset(key, data=getattr(dataset, key), compression="gzip", compression_opts=4, shuffle=True)
        meta = f.create_group("metadata")
        for key in ("env_id", "env_name", "ref_min_score", "ref_max_score"):
            value = getattr(dataset, key)
            if value is not None:
                meta.attrs[key] = value
        meta.attrs["provenance"] = json.dumps(dataset.metadata, sort_keys=True, default=str)
    atomic_write_bytes(path, memory.getbuffer(), DatasetError)
    return path


def read_d4rl_metadata(path: str | os.PathLike) -> dict:
    """The ``metadata/`` attributes of a file written by `write_d4rl_hdf5` (empty for D4RL's own files)."""
    import json

    import h5py

    with h5py.File(path, "r") as f:
        if "metadata" not in f:
            return {}
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f["metadata"].attrs.items()}
    if "provenance" in attrs:
        attrs["provenance"] = json.loads(attrs["provenance"])
    return attrs
