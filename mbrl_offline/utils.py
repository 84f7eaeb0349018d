"""Small helpers shared across the library."""
from __future__ import annotations

import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch


# Markers of a failed write in the RuntimeErrors of libraries that write files themselves: torch's zip
# writer ("[enforce fail at inline_container.cc:...] ... file write failed", "unexpected pos") and HDF5.
_WRITE_FAILURE_MARKERS = ("enforce fail", "write failed", "unexpected pos", "unable to flush", "unable to write",
                          "no space left", "disk quota")


def write_failure_reason(exc: BaseException, folder: str | os.PathLike | None = None) -> str | None:
    """Why a write failed, in a few words, for an `OSError` (``No space left on device``) or a library's
    RuntimeError that reports a failed write (`_WRITE_FAILURE_MARKERS`); None for any other exception.
    When the file system of ``folder`` has no free space left, that is the reason given."""
    if isinstance(exc, OSError):
        text = str(exc).strip()
        reason = exc.strerror or (text.splitlines()[0] if text else type(exc).__name__)
    elif isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _WRITE_FAILURE_MARKERS):
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    else:
        return None
    if folder is not None and "No space left" not in reason:
        try:
            stats = os.statvfs(folder)
            if stats.f_bavail == 0:
                reason = f"{os.strerror(28)} ({reason})"
        except (OSError, AttributeError):  # no statvfs (Windows) or the folder is gone
            pass
    return reason


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and the folders above it that do not exist yet, the outermost last."""
    missing = []
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


@contextmanager
def atomic_path(path: str | os.PathLike, error: type | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename. Every file
    the library writes goes through here (`atomic_write_bytes`, `atomic_torch_save`, `save_figure`).

    The temporary file is flushed to the disk (fsync) before the rename, so a disk that fills up shows
    here and not later. A write that fails (an `OSError` such as a full disk, or a library's
    RuntimeError that reports a failed write, `write_failure_reason`) removes the temporary file and
    the folders made for it, keeps the old file (or nothing) and raises ``error`` (default
    `FileWriteError`) in one line that names ``path`` and the reason. Other exceptions pass unchanged,
    also after the temporary file is removed.
    """
    from mbrl_offline.errors import FileWriteError

    path = Path(path)
    error = error or FileWriteError
    created = missing_folders(path.parent)
    existed = path.exists()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # a full disk that the writes did not report yet shows here
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        for folder in created:  # innermost first; a folder something else filled meanwhile stays
            try:
                folder.rmdir()
            except OSError:
                break
        reason = write_failure_reason(exc, path.parent if path.parent.exists() else None)
        if reason is None:
            raise
        if isinstance(exc, (FileExistsError, NotADirectoryError)):  # a file where a folder must be
            blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
            reason = f"{blocking} is a file, not a folder" if blocking is not None else reason
        kept = " (the previous file is kept)" if existed else ""
        failure = error(f"cannot write {path}: {reason}; nothing was written{kept}. Check the free disk space and "
                        f"the folder's permissions, or choose another location.")
        failure.path, failure.reason = path, reason
        raise failure from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes | memoryview | str, error: type | None = None) -> None:
    """Write ``data`` (text is written as UTF-8) to ``path`` through `atomic_path`."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_path(path, error) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)


def atomic_torch_save(obj, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through `atomic_path`: the old file or the new one, never a part. A write
    that fails (a full disk, a folder that cannot be written) is one `CheckpointError` line."""
    from mbrl_offline.errors import CheckpointError

    with atomic_path(path, CheckpointError) as tmp:
        torch.save(obj, tmp)


def save_figure(fig, path: str | os.PathLike, error: type | None = None, **savefig_kwargs) -> Path:
    """A matplotlib figure as a file, drawn in memory and written through `atomic_path` (a full disk is
    one ``error`` line and leaves no partial image); the format follows ``path``'s suffix."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig_kwargs)
    atomic_write_bytes(path, buffer.getbuffer(), error)
    return Path(path)


def progress_bar(**kwargs):
    """A tqdm bar that updates at most twice a second (cheap inside hot loops)."""
    from tqdm.auto import tqdm

    return tqdm(mininterval=0.5, dynamic_ncols=True, **kwargs)


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


@contextmanager
def frozen(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``module``'s parameters taken out of autograd while the block runs (``requires_grad`` False, restored
    after it, also on an error). What the block computes still carries gradients to its other inputs:
    an actor's loss through a critic needs the gradient in the actions, not in the critic's weights, and
    a graph built without them computes no weight gradient in its backward (a compiled one would)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield module
    finally:
        for p in params:
            p.requires_grad_(True)


@torch.no_grad()
def soft_update(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """Polyak averaging: every parameter of ``target`` moves ``tau`` of the way to ``online``'s."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def adam_kernel(fused: bool = False) -> dict:
    """The keyword that picks how torch's Adam and AdamW run their step: ``fused=True`` (one fused kernel
    per parameter; the same maths, rounded differently) where ``fused``, else ``foreach=True``. On the CPU
    the foreach path applies the per-tensor loop's operators to each tensor in turn (torch's
    ``_foreach_*`` ops have no CPU kernels of their own), so its parameters equal the default loop's bit
    for bit (tests/test_utils.py), with one Python call per operator instead of one per operator and
    tensor; on CUDA it is torch's default."""
    return {"fused": True} if fused else {"foreach": True}


def cosine_decay(step: float, total: float, floor: float = 0.0) -> float:
    """The library's one cosine learning-rate schedule: the factor of the base rate after ``step`` of
    ``total`` steps, ``(1 - floor) (1 + cos(pi min(step, total) / total)) / 2 + floor``, from 1 at step 0
    to ``floor`` at ``total`` and after. With ``floor`` 0 it is torch's ``CosineAnnealingLR`` (``eta_min``
    0) in closed form; with a ``floor`` it is optax's ``cosine_decay_schedule(alpha=floor)``. Computed
    from the step, so a resumed run continues it exactly.

    Its users: `anneal_cosine` (the SAC learners' and IQL's actor, per epoch), the diffusion models'
    ``cosine`` and ``warmup_cosine`` schedules (`mbrl_offline.models.diffusion`, per step) and NEUBAY's
    per-group schedules (per update, over the fraction of the run done: ``step`` = min(n, N) / N of
    ``total`` = 1)."""
    return (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total)) + floor


def anneal_cosine(optimizer: torch.optim.Optimizer, base_lr: float, epoch: int, total_epochs: int) -> None:
    """Set every group's learning rate to ``base_lr (1 + cos(pi epoch / total_epochs)) / 2``
    (`cosine_decay`): torch's ``CosineAnnealingLR`` with ``T_max = total_epochs`` stepped once per epoch."""
    lr = base_lr * cosine_decay(epoch, total_epochs)
    for group in optimizer.param_groups:
        group["lr"] = lr


@torch.no_grad()
def clean_and_clip(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The library's one NaN-safe gradient clipper, for one group of gradients, in place: NaN entries set
    to 0 (infinities kept, as ``optax.zero_nans``), then all scaled by ``max_norm / norm`` where their global
    norm is at least ``max_norm`` (``optax.clip_by_global_norm``: no epsilon). Returns the norm before
    clipping (after the NaNs went), without a device sync. NEUBAY clips each of its parameter groups with
    it, as does the bandit illustration's agent (`mbrl_offline.experiments.bandit`)."""
    for grad in grads:
        torch.nan_to_num_(grad, nan=0.0, posinf=math.inf, neginf=-math.inf)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    factor = torch.where(norm < max_norm, torch.ones_like(norm), max_norm / norm)
    torch._foreach_mul_(grads, factor)
    return norm
