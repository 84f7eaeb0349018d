"""The disk cache of fitted models: any model a generator fits on a dataset (dynamics ensembles now,
diffusion models next) is stored once per dataset and settings and loaded by every later run.

A model's file is ``<cache>/<kind>/<name>-<key>.pt``: the key hashes the dataset's fingerprint (its
transitions) and the model's full settings, so a run that changes only agent settings reuses the
model and any change to the data or the model fits a new one. A file lock makes concurrent workers
on one machine (a sweep) fit it once; the save is atomic, so a file is whole or absent.
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional, TypeVar

M = TypeVar("M")


def cache_root() -> Path:
    """``$MBRL_OFFLINE_CACHE``, else ``~/.cache/mbrl_offline``."""
    root = os.environ.get("MBRL_OFFLINE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "mbrl_offline"


def cache_key(fingerprint: str, settings: dict) -> str:
    """16 hex digits of the SHA-256 of the data's fingerprint and the settings."""
    return hashlib.sha256(json.dumps({"data": fingerprint, "config": settings}, sort_keys=True).encode()).hexdigest()[:16]


def load_or_fit(kind: str, name: str, fingerprint: str, settings: dict, fit: Callable[[], M],
                save: Callable[[M, Path], object], load: Callable[[Path], M],
                cache_dir: Optional[str | Path] = None) -> tuple[M, Path]:
    """The cached model of ``kind`` for this data and these settings, or ``fit()``'s, saved there first.

    ``cache_dir`` replaces ``<cache>/<kind>``. Returns the model and its file."""
    path = Path(cache_dir or cache_root() / kind) / f"{name}-{cache_key(fingerprint, settings)}.pt"
    if path.is_file():
        return load(path), path
    with file_lock(path.with_name(path.name + ".lock")):  # sweep workers on one machine fit it once
        if path.is_file():  # another process fitted it while this one waited
            return load(path), path
        model = fit()
        save(model, path)
    return model, path


@contextmanager
def file_lock(path: Path):
    """An exclusive lock on ``path`` between processes (POSIX); no lock where fcntl is missing. A lock
    file that cannot be made (a cache folder that cannot be written) is one `FileWriteError` line."""
    from mbrl_offline.errors import FileWriteError
    from mbrl_offline.utils import write_failure_reason

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError as exc:
        raise FileWriteError(f"cannot write {path}: {write_failure_reason(exc)}; check the model cache folder "
                             f"(MBRL_OFFLINE_CACHE, or dynamics_cache=) and the free disk space.") from None
    try:
        import fcntl
    except ImportError:  # Windows: concurrent workers may both fit the model; the atomic save keeps it whole
        with handle:
            yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
