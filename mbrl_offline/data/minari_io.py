"""Reading and writing Minari datasets (any storage format Minari supports: hdf5, arrow).

Writing goes through `EpisodeBuffer` + `minari.create_dataset_from_buffers`, which needs neither JAX
nor an env recorder. Observations and actions are stored as float32, as D4RL stores them, which
halves the files compared with MuJoCo's float64 observations.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.errors import DatasetError, FileWriteError
from mbrl_offline.utils import atomic_path, write_failure_reason

PROVENANCE_KEY = "mbrl_offline"


def minari_root(root: Optional[str | os.PathLike] = None) -> Path:
    """The Minari datasets folder: ``root``, else ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env).expanduser() if env else Path.home() / ".minari" / "datasets"


def minari_dataset_dir(dataset_id: str, root: Optional[str | os.PathLike] = None) -> Path:
    return minari_root(root) / dataset_id


def write_minari(dataset: OfflineDataset, dataset_id: str, root: Optional[str | os.PathLike] = None,
                 description: str = "", algorithm_name: str = "SAC", overwrite: bool = False,
                 data_format: str = "hdf5") -> Path:
    """Write ``dataset`` as Minari dataset ``dataset_id`` under ``root``; returns its folder.

    The dataset is built in a staging folder beside the destination and moved into place only when
    complete, so an interrupted write leaves nothing behind. Reference scores and the dataset's
    provenance (``dataset.metadata``) are stored in Minari's ``metadata.json``.
    """
    import gymnasium as gym
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    root_path = minari_root(root)
    target = root_path / dataset_id
    if target.exists() and not overwrite:
        raise DatasetError(f"Minari dataset '{dataset_id}' already exists at {target}; delete it or pass "
                           "overwrite=true.")
    if dataset.env_id is None:
        raise DatasetError(f"{dataset.source}: a Minari dataset needs the Gymnasium env id (env_id).")
    buffers = []
    for index, span in enumerate(dataset.episode_slices()):
        last = span.stop - 1
        observations = np.concatenate([dataset.observations[span], dataset.next_observations[last:last + 1]])
        buffers.append(EpisodeBuffer(id=index, observations=observations, actions=dataset.actions[span],
                                     rewards=dataset.rewards[span], terminations=dataset.terminals[span],
                                     truncations=dataset.timeouts[span]))
    env_space = gym.make(dataset.env_id).action_space
    observation_space = gym.spaces.Box(-np.inf, np.inf, (dataset.obs_dim,), np.float32)
    action_space = gym.spaces.Box(env_space.low, env_space.high, env_space.shape, np.float32)

    try:
        root_path.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root_path))
    except OSError as exc:
        raise DatasetError(f"cannot write Minari dataset '{dataset_id}' in {root_path}: {write_failure_reason(exc)}; "
                           f"choose a folder you can write to (MINARI_DATASETS_PATH).") from None
    # Minari writes its HDF5 files itself, and HDF5 crashes the interpreter when the disk fills up under
    # it: it builds the dataset in memory (/dev/shm where there is one), and only whole files are copied
    # to the disk, through the library's one writer (`atomic_path`: a full disk is one DatasetError line).
    memory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    built = Path(tempfile.mkdtemp(prefix="mbrl_offline-minari-", dir=memory))
    previous = os.environ.get("MINARI_DATASETS_PATH")
    try:
        os.environ["MINARI_DATASETS_PATH"] = str(built)
        created = minari.create_dataset_from_buffers(
            dataset_id, buffers, env=dataset.env_id, eval_env=dataset.env_id, observation_space=observation_space,
            action_space=action_space, ref_min_score=dataset.ref_min_score,
            ref_max_score=dataset.ref_max_score, algorithm_name=algorithm_name, author="mbrl_offline",
            author_email="mbrl_offline@users.noreply.invalid", code_permalink="mbrl_offline/collect.py",
            description=description, data_format=data_format)
        created.storage.update_metadata({PROVENANCE_KEY: json.dumps(dataset.metadata, sort_keys=True)})
        for source in sorted(p for p in (built / dataset_id).rglob("*") if p.is_file()):
            with atomic_path(staging / dataset_id / source.relative_to(built / dataset_id)) as tmp:
                shutil.copyfile(source, tmp)
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / dataset_id, target)
    except (OSError, RuntimeError, FileWriteError) as exc:  # a full disk, a folder that cannot be written
        reason = exc.reason if isinstance(exc, FileWriteError) else write_failure_reason(exc, root_path)
        if reason is None:
            raise
        raise DatasetError(f"cannot write Minari dataset '{dataset_id}' in {root_path}: {reason}; nothing was "
                           f"written. Check the free disk space, or choose another folder.") from None
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(built, ignore_errors=True)
    return target


def read_minari(dataset_dir: str | os.PathLike, source: Optional[str] = None) -> OfflineDataset:
    """Load the Minari dataset stored in ``dataset_dir`` (the folder holding ``data/``)."""
    import minari

    dataset_dir = Path(dataset_dir)
    source = source or str(dataset_dir)
    data_dir = dataset_dir / "data"
    if not (data_dir / "metadata.json").is_file():
        raise DatasetError(f"{source}: no Minari dataset here ({data_dir / 'metadata.json'} is missing).")
    try:
        ds = minari.MinariDataset(data_dir)
        episodes = list(ds.iterate_episodes())
        metadata: dict[str, Any] = dict(ds.storage.metadata)
    except DatasetError:
        raise
    except Exception as exc:  # h5py/pyarrow raise many types for truncated or corrupt files
        raise DatasetError(f"{source}: cannot read the Minari dataset ({type(exc).__name__}: {exc}); the "
                           "files are corrupt or truncated: recreate or re-download the dataset.") from exc
    if not episodes:
        raise DatasetError(f"{source}: the dataset is empty (0 episodes).")
    arrays: dict[str, list] = {k: [] for k in ("observations", "actions", "rewards", "next_observations",
                                               "terminals", "timeouts")}
    for ep in episodes:
        obs = _flat_array(ep.observations, source, "observations")
        steps = len(ep.rewards)
        if len(obs) != steps + 1:
            raise DatasetError(f"{source}: episode {ep.id} has {len(obs)} observations for {steps} steps; "
                               "Minari episodes need one more observation than steps.")
        arrays["observations"].append(obs[:-1])
        arrays["next_observations"].append(obs[1:])
        arrays["actions"].append(_flat_array(ep.actions, source, "actions"))
        arrays["rewards"].append(np.asarray(ep.rewards, dtype=np.float32).reshape(-1))
        terminals = np.asarray(ep.terminations, dtype=bool).reshape(-1)
        timeouts = np.asarray(ep.truncations, dtype=bool).reshape(-1).copy()
        timeouts[-1] |= not terminals[-1]  # an episode ends at its last step, whatever the file says
        arrays["terminals"].append(terminals)
        arrays["timeouts"].append(timeouts)
    env_id = (metadata.get("env_spec") and json.loads(metadata["env_spec"]).get("id")) or None
    provenance = metadata.get(PROVENANCE_KEY)
    return OfflineDataset(
        **{k: np.concatenate(v) for k, v in arrays.items()},
        env_id=env_id, ref_min_score=metadata.get("ref_min_score"), ref_max_score=metadata.get("ref_max_score"),
        source=source, metadata=json.loads(provenance) if provenance else {},
    )


def _flat_array(values, source: str, key: str) -> np.ndarray:
    if isinstance(values, dict):
        raise DatasetError(f"{source}: '{key}' are a dict space; only flat Box spaces are supported.")
    array = np.asarray(values, dtype=np.float32)
    return array.reshape(len(array), -1)
