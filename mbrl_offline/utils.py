"""Small helpers shared across the library."""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch


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
    """``torch.save(obj, path)`` through `atomic_path`: the old file or the new one, never a part. A write
    that fails (a full disk, a folder that cannot be written) is one `CheckpointError` line."""
    from mbrl_offline.errors import CheckpointError

    try:
        with atomic_path(path) as tmp:
            torch.save(obj, tmp)
    except OSError as exc:
        raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}; nothing was written (the previous file, "
                              f"if any, is kept). Check the free disk space and the folder's permissions.") from None
    except RuntimeError as exc:  # torch's zip writer reports a failed write as a RuntimeError
        if "write" not in str(exc).lower():
            raise
        raise CheckpointError(f"cannot write {path}: {str(exc).strip().splitlines()[0]}; nothing was written (the "
                              f"previous file, if any, is kept). Check the free disk space.") from None


def progress_bar(**kwargs):
    """A tqdm bar that updates at most twice a second (cheap inside hot loops)."""
    from tqdm.auto import tqdm

    return tqdm(mininterval=0.5, dynamic_ncols=True, **kwargs)


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory for reuse instead of giving it back to the OS; returns
    whether it could (only on Linux with glibc). Process-wide; call it once at the start of CPU training.

    Why: torch on CPU allocates each activation and gradient afresh. By default glibc serves blocks
    above a threshold that adapts up to 32 MiB from the heap, but gives the top of the heap back to
    the OS whenever more than twice that threshold is free there, so the next update's tensors fault
    their pages in again. A RAVL update (10 critics of 3x256, batch 256) took 1,900 page faults and
    4.6 ms of system time; with the heap kept (mmap threshold fixed at 32 MiB, trim threshold 1 GiB)
    0.06 faults, and 49.2 instead of 52.4 ms per update on this project's 2-core CPU. The cost: the
    process keeps its peak heap (up to 1 GiB of free memory) instead of returning it. This is what
    the environment variables MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set at start-up;
    PyTorch's CPU tuning guide suggests another allocator (jemalloc, tcmalloc) for the same reason.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # another C library (musl) or none found
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    # Both at once: setting either one alone turns off the adaptive threshold and leaves the other
    # at its default, which made every large block a fresh mmap (24,000 faults per update).
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


class CUDAGraphed:
    """``fn(inputs)``, a dict of CUDA tensors in and a tensor out, recorded once as a CUDA graph and
    replayed: one launch instead of one per kernel, for steps whose many small kernels leave the GPU
    waiting on the host (an agent update, a dynamics training batch).

    The first ``warmups`` calls run ``fn`` eagerly on a side stream, as recording requires (lazy
    initialisations happen there); they are real calls. The next call records ``fn`` on copies of its
    inputs, and every call from then on copies its inputs into those and replays the graph: the same
    kernels, so the same arithmetic. The returned tensor is the graph's own output, overwritten by the
    next replay. ``fn`` must not wait for the GPU (no ``.item()``, no shapes that depend on values);
    Python numbers it reads, such as a learning rate, are frozen into the recording, so call `reset`
    when one changes or when tensors it uses are replaced (an optimiser's state after
    ``load_state_dict``). Inputs with other keys or shapes are recorded anew.
    """

    def __init__(self, fn, warmups: int = 3):
        self.fn, self.warmups_left = fn, warmups
        self.graph = None

    def reset(self) -> None:
        self.graph = None

    def __call__(self, inputs: dict):
        if self.graph is None and self.warmups_left > 0:
            self.warmups_left -= 1
            device = next(iter(inputs.values())).device
            side, current = torch.cuda.Stream(device), torch.cuda.current_stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                output = self.fn(inputs)
            current.wait_stream(side)
            output.record_stream(current)
            return output
        if self.graph is None or self.inputs.keys() != inputs.keys() or any(
                self.inputs[k].shape != v.shape for k, v in inputs.items()):
            self._record(inputs)
        for key, value in inputs.items():
            self.inputs[key].copy_(value)
        self.graph.replay()
        return self.output

    def _record(self, inputs: dict) -> None:
        self.graph = None  # frees the previous recording's memory first
        self.inputs = {k: v.clone() for k, v in inputs.items()}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.output = self.fn(self.inputs)
        self.graph = graph


@torch.no_grad()
def soft_update(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """Polyak averaging: every parameter of ``target`` moves ``tau`` of the way to ``online``'s."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def anneal_cosine(optimizer: torch.optim.Optimizer, base_lr: float, epoch: int, total_epochs: int) -> None:
    """Set every group's learning rate to ``base_lr (1 + cos(pi epoch / total_epochs)) / 2``: torch's
    ``CosineAnnealingLR`` with ``T_max = total_epochs`` stepped once per epoch, computed from the epoch
    (so a resumed run continues it exactly)."""
    lr = base_lr * 0.5 * (1.0 + math.cos(math.pi * epoch / total_epochs))
    for group in optimizer.param_groups:
        group["lr"] = lr
