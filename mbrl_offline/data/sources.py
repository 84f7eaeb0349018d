"""`load_dataset(spec)`: one entry point for every dataset source.

A spec string picks the source:

==========================================  ====================================================
``hopper-medium``, ``bundled:hopper-medium``  a dataset shipped inside the package (`bundled_datasets()`)
``path/to/file.hdf5``, ``d4rl:path``           a D4RL-format HDF5 file (read with h5py)
``mujoco/hopper/medium-v0``, ``minari:<id>``   a Minari dataset id under ``$MINARI_DATASETS_PATH``
``path/to/dataset_folder``                    a Minari dataset folder (the one holding ``data/``)
==========================================  ====================================================

The environment comes from the dataset's own metadata, else from a D4RL file's name
(``hopper_medium-v2.hdf5``), else from the ``env`` argument; it fixes the reference scores and the
expected observation and action sizes, which every loaded dataset is checked against. An ``env``
argument names the env to evaluate in (it wins over a file's name), but one that contradicts the env
the dataset's own metadata names (``env=walker2d`` for a halfcheetah dataset, whose sizes are the same)
is refused in one line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.data.envs import ENVS, get_env_info
from mbrl_offline.errors import ConfigError, DatasetError, DatasetWarning, InputTypeError, type_name

BUNDLED_DIR = Path(__file__).parent / "bundled"
HDF5_SUFFIXES = (".hdf5", ".h5")


def bundled_datasets() -> list[str]:
    """Names of the datasets shipped with the package (D4RL-format HDF5 files in ``data/bundled/``)."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.hdf5"))


def load_dataset(spec: str, env: Optional[str] = None, minari_root: Optional[str | os.PathLike] = None) -> OfflineDataset:
    """Load a dataset by spec (see the module docstring) as a validated `OfflineDataset`."""
    from mbrl_offline.data.minari_io import minari_dataset_dir, read_minari

    if not isinstance(spec, (str, os.PathLike)):
        raise InputTypeError(f"load_dataset needs a dataset's name or file (str or pathlib.Path), got "
                             f"{type_name(spec)}; e.g. load_dataset('hopper-medium'), or build an OfflineDataset "
                             f"from arrays.")
    if env is not None and not isinstance(env, str):
        raise InputTypeError(f"load_dataset's env must be an env's name (one of {', '.join(ENVS)}), got {type_name(env)}.")
    spec = str(spec)
    kind, _, rest = spec.partition(":")
    if kind in ("bundled", "d4rl", "minari") and rest:
        explicit, target = kind, rest
    else:
        explicit, target = None, spec

    if explicit == "bundled" or (explicit is None and target in bundled_datasets()):
        if target not in bundled_datasets():
            raise DatasetError(f"no bundled dataset '{target}'; bundled: {', '.join(bundled_datasets()) or 'none'}.")
        dataset, env = _read_hdf5(BUNDLED_DIR / f"{target}.hdf5", f"bundled:{target}", env)
    elif explicit == "d4rl" or (explicit is None and target.lower().endswith(HDF5_SUFFIXES)):
        dataset, env = _read_hdf5(Path(target).expanduser(), spec, env)
    elif explicit is None and Path(target).is_dir():
        dataset = read_minari(target, source=spec)
    else:
        directory = minari_dataset_dir(target, minari_root)
        if not (directory / "data" / "metadata.json").is_file():
            raise DatasetError(_missing_message(spec, target, directory))
        dataset = read_minari(directory, source=spec)
    return _attach_env(dataset, env)


def _read_hdf5(path: Path, source: str, env: Optional[str]) -> tuple[OfflineDataset, str]:
    """A D4RL-format file, with the env, scores and provenance our exports keep in ``metadata/``."""
    from mbrl_offline.data.d4rl_hdf5 import read_d4rl_hdf5, read_d4rl_metadata

    dataset = read_d4rl_hdf5(path, source=source)
    meta = read_d4rl_metadata(path)
    dataset.env_name = meta.get("env_name")
    dataset.ref_min_score, dataset.ref_max_score = meta.get("ref_min_score"), meta.get("ref_max_score")
    dataset.metadata.update(meta.get("provenance", {}))
    env = env or meta.get("env_name") or _env_from_filename(str(path))
    if env is None:
        raise DatasetError(f"{source}: cannot tell which environment this D4RL file is for; pass env=<name> "
                           f"(one of {', '.join(ENVS)}).")
    return dataset, env


def _attach_env(dataset: OfflineDataset, env: Optional[str]) -> OfflineDataset:
    """Fill in the env and its reference scores, then check the sizes against the env's spaces."""
    name = env or dataset.env_name or dataset.env_id
    if name is None:
        return dataset
    try:
        info = get_env_info(name)
    except ConfigError:
        if env is not None:  # the caller named an env we do not know
            raise
        return dataset  # an env outside the registry (another version, another suite): keep the file's settings
    own = _registry_name(dataset.env_name) or _registry_name(dataset.env_id)  # the env its metadata names
    if env is not None and own is not None and own != info.name:
        raise DatasetError(f"{dataset.source} is a {own} dataset, not a {info.name} one; use env={own}, or a "
                           f"{info.name} dataset.")
    dataset.env_name, dataset.env_id = info.name, info.gym_id
    if dataset.ref_min_score is None or dataset.ref_max_score is None:
        dataset.ref_min_score, dataset.ref_max_score = info.ref_min_score, info.ref_max_score
    dataset.validate(obs_dim=info.obs_dim, act_dim=info.act_dim)
    warn_actions_outside_bounds(dataset, info)
    return dataset


FAR_OUTSIDE = 2.0  # actions further than this many half-widths from the box's centre are "far outside"


def warn_actions_outside_bounds(dataset: OfflineDataset, info) -> None:
    """Warn (one line, `DatasetWarning`) when ``dataset``'s actions go far outside env ``info``'s action
    box: more than `FAR_OUTSIDE` half-widths from its centre (actions of [-3, 3] for a [-1, 1] box), which
    clipping noise never reaches. Such data is in other units or for another env; agents squash their
    actions into the box, so they could never imitate it. The data still loads."""
    import warnings

    try:
        low, high = info.action_bounds()
    except Exception:  # the env cannot be built here (e.g. MuJoCo missing): nothing to compare with
        return
    centre, half = (high + low) / 2.0, (high - low) / 2.0
    reach = np.abs(dataset.actions - centre) / np.where(half > 0, half, np.inf)
    outside = reach > FAR_OUTSIDE
    if not outside.any():
        return
    rows = int(outside.any(axis=1).sum())
    column = int(np.argmax(reach.max(axis=0)))
    value = float(dataset.actions[int(np.argmax(reach[:, column])), column])
    box = f"[{float(low[column]):g}, {float(high[column]):g}]"
    warnings.warn(f"{dataset.source}: {rows} of {len(dataset)} rows have actions far outside {info.name}'s action "
                  f"bounds (action {column} reaches {value:g}, bounds {box}); the data is in other units or for "
                  f"another env: rescale the actions into the bounds, or load it with the env it was made for.",
                  DatasetWarning, stacklevel=4)


def _registry_name(name: Optional[str]) -> Optional[str]:
    """The registry's short name for an env name or Gymnasium id; None if it is not in the registry."""
    try:
        return get_env_info(name).name if name else None
    except ConfigError:
        return None


def _env_from_filename(path: str) -> Optional[str]:
    """The env a D4RL-style file name starts with: ``hopper_medium-v2.hdf5`` -> ``hopper``."""
    stem = Path(path).name.lower().replace("-", "_")
    for name in sorted(ENVS, key=len, reverse=True):  # inverted-pendulum before pendulum
        if stem.startswith(name.replace("-", "_") + "_"):
            return name
    return None


def _missing_message(spec: str, dataset_id: str, directory: Path) -> str:
    hint = ""
    parts = dataset_id.split("/")
    if len(parts) == 3 and parts[1] in ENVS:
        hint = (f" To make it here: `mbrl-collect env={parts[1]} collect.namespace={parts[0]}` "
                f"(python examples/collect.py in a checkout; writes {parts[0]}/{parts[1]}/<level>-v0).")
    bundled = ", ".join(bundled_datasets())
    return (f"dataset '{spec}' not found: no bundled dataset, file or folder of that name, and no Minari "
            f"dataset at {directory}.{hint} Where there is internet, `minari download {dataset_id}` fetches "
            f"Minari's own; set MINARI_DATASETS_PATH if it lives elsewhere. Bundled: {bundled or 'none'}.")
