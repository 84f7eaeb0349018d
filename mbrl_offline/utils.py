"""Small helpers shared across the library."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    A crash or an exception leaves the old file (or nothing) in place, never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def progress_bar(**kwargs):
    """A tqdm bar that updates at most twice a second (cheap inside hot loops)."""
    from tqdm.auto import tqdm

    return tqdm(mininterval=0.5, dynamic_ncols=True, **kwargs)
