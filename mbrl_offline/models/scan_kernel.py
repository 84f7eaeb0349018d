"""The LRU's recurrence as a compiled C loop (`mbrl_offline.models.recurrent.lru_scan` on a CPU).

The recurrence ``h_t = lambda keep_t h_{t-1} + b_t`` costs a few multiply-adds per state, and a tape of
NEUBAY's official size (2048 rows x 128 complex states) is 2 MB. Written with torch's operators, the
parallel scan takes about 75 of them forward and about 90 backward, and each operator has a fixed cost
of a few microseconds, so the scans were about an eighth of NEUBAY's update on a CPU
(docs/performance.md measures it). This module runs the forward recurrence and its adjoint as two plain
C loops, over the rows in order (the sequential recurrence itself, as `lru_scan_reference` computes it),
vectorised over the states by the compiler: one call each way.

The C source is below. It is compiled once per machine with the C compiler that ``torch.compile`` also
needs (``cc``; the ``CC`` environment variable names another), into a cache folder
(``MBRL_OFFLINE_KERNEL_CACHE``, else a folder of the system's temporary directory named for the user),
and loaded with ctypes: it uses no Python or torch headers, so it compiles quickly. Without a
compiler, or where the library cannot be built or loaded, `available` is False and the scans run as
torch operators, after one warning that says why; ``set_enabled(False)`` does the same on purpose (the
tests compare both). The compiler flags are fixed (``-O3``, the machine's baseline instruction set: no
``-march=native``), so a cached library runs on any x86-64 CPU, and the loops have no threads: their
results are the same on every machine and at every thread count.

Float rounding: the forward loop adds ``lambda h_{t-1}`` to ``b_t`` row by row, as the sequential
reference does; the parallel scan of torch operators adds the same terms in another order. The gradient
in lambda (a sum over every row) is summed in float32 over blocks of 64 rows and the blocks' sums in
float64, then rounded to float32.
"""
from __future__ import annotations

import ctypes
import getpass
import hashlib
import os
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Optional

import torch

SOURCE = r"""
/* Complex numbers are (re, im) pairs of floats. For each of `sequences` sequences of `steps` rows of
   `states` complex states, with keep[s][t] in {0, 1} and lam[k] the states' coefficients. */

/* h_t = lam keep_t h_{t-1} + b_t for t = 0..steps-1 from h_{-1} = h0[s], in place: b becomes h. */
void lru_scan_forward(float *b, const float *keep, const float *lam, const float *h0,
                      long sequences, long steps, long states)
{
    for (long s = 0; s < sequences; s++) {
        const float *previous = h0 + 2 * s * states;
        for (long t = 0; t < steps; t++) {
            float *current = b + 2 * (s * steps + t) * states;
            if (keep[s * steps + t] != 0.0f) {
                for (long k = 0; k < states; k++) {
                    const float lr = lam[2 * k], li = lam[2 * k + 1];
                    const float pr = previous[2 * k], pi = previous[2 * k + 1];
                    current[2 * k] += lr * pr - li * pi;
                    current[2 * k + 1] += lr * pi + li * pr;
                }
            }
            previous = current;
        }
    }
}

/* The adjoint, run backwards in place over g (the gradient in each h_t on entry):
   g_t += conj(lam) keep_{t+1} g_{t+1}, and grad_lam[k] += conj(keep_t h_{t-1}) g_t summed over every
   row of every sequence (h_{-1} = h0[s]): in float over blocks of BLOCK rows (`partial`, `states` pairs
   of floats the caller provides), each block's sum then added in double. */
#define BLOCK 64
void lru_scan_backward(float *g, const float *h, const float *keep, const float *lam, const float *h0,
                       float *partial, double *grad_lam, long sequences, long steps, long states)
{
    for (long s = 0; s < sequences; s++) {
        for (long k = 0; k < 2 * states; k++) partial[k] = 0.0f;
        for (long t = steps - 1; t >= 0; t--) {
            float *current = g + 2 * (s * steps + t) * states;
            if (t + 1 < steps && keep[s * steps + t + 1] != 0.0f) {
                const float *next = current + 2 * states;
                for (long k = 0; k < states; k++) {
                    const float lr = lam[2 * k], li = lam[2 * k + 1];
                    const float nr = next[2 * k], ni = next[2 * k + 1];
                    current[2 * k] += lr * nr + li * ni;
                    current[2 * k + 1] += lr * ni - li * nr;
                }
            }
            if (keep[s * steps + t] != 0.0f) {
                const float *previous = t > 0 ? h + 2 * (s * steps + t - 1) * states : h0 + 2 * s * states;
                for (long k = 0; k < states; k++) {
                    const float pr = previous[2 * k], pi = previous[2 * k + 1];
                    const float gr = current[2 * k], gi = current[2 * k + 1];
                    partial[2 * k] += pr * gr + pi * gi;
                    partial[2 * k + 1] += pr * gi - pi * gr;
                }
            }
            if (t % BLOCK == 0) {
                for (long k = 0; k < 2 * states; k++) {
                    grad_lam[k] += partial[k];
                    partial[k] = 0.0f;
                }
            }
        }
    }
}
"""

FLAGS = ("-O3", "-shared", "-fPIC", "-std=c99")
ENV_CACHE = "MBRL_OFFLINE_KERNEL_CACHE"

_library: Optional[ctypes.CDLL] = None
failed: Optional[str] = None  # why the kernel is unavailable in this process (None: not tried, or loaded)
_enabled = True


def set_enabled(enabled: bool) -> None:
    """Run the scans as the C loops (True, where they build) or as torch operators (False), process-wide."""
    global _enabled
    _enabled = bool(enabled)


def _cache_folder() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without one): one folder for all
        user = "user"
    return Path(tempfile.gettempdir()) / f"mbrl_offline_kernels_{user}"


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC", "cc")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\n".join([SOURCE, compiler, version, *FLAGS]).encode()).hexdigest()[:16]
    folder = _cache_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if hasattr(os, "getuid") and folder.stat().st_uid != os.getuid():  # a library from there runs as our code
        raise RuntimeError(f"the kernel cache {folder} belongs to another user; set {ENV_CACHE} to a folder of yours")
    library = folder / f"lru_scan_{key}.so"
    if not library.exists():
        with tempfile.TemporaryDirectory(dir=folder) as work:  # built aside, then renamed: no half-written file
            source, built = Path(work) / "lru_scan.c", Path(work) / "lru_scan.so"
            source.write_text(SOURCE)
            result = subprocess.run([compiler, *FLAGS, str(source), "-o", str(built)], capture_output=True,
                                    text=True, timeout=120)
            if result.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {(result.stderr or result.stdout).strip().splitlines()[:1]}")
            os.replace(built, library)  # atomic: another process building the same file is harmless
    loaded = ctypes.CDLL(str(library))
    pointer, size = ctypes.c_void_p, ctypes.c_long
    loaded.lru_scan_forward.argtypes = [pointer] * 4 + [size] * 3
    loaded.lru_scan_forward.restype = None
    loaded.lru_scan_backward.argtypes = [pointer] * 7 + [size] * 3
    loaded.lru_scan_backward.restype = None
    return loaded


def available() -> bool:
    """Whether the C loops are enabled and built (building them at the first call; on failure, one warning
    and False for the rest of the process)."""
    global _library, failed
    if not _enabled or failed is not None:
        return False
    if _library is None:
        try:
            _library = _build()
        except Exception as error:  # no compiler, a read-only cache folder, a loader error
            text = str(error).strip()
            failed = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]
            warnings.warn(f"the LRU scan's C loops could not be built ({failed}); the scans run as torch operators "
                          "(slower, the same results up to float rounding).")
            return False
    return True


def applies(lam: torch.Tensor, bx: torch.Tensor) -> bool:
    """Whether these tensors can take the C loops: complex64 on a CPU, and the loops available."""
    return lam.device.type == "cpu" and bx.device.type == "cpu" and bx.dtype == torch.complex64 and available()


def _address(tensor: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(tensor.data_ptr())


def forward(bx: torch.Tensor, keep: torch.Tensor, lam: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """The states ``h (S, T, H)`` complex64 of ``h_t = lambda keep_t h_{t-1} + bx_t`` from ``h_{-1} = h0``:
    ``bx (S, T, H)`` complex64, ``keep (S, T)`` float32 0/1, ``lam (H,)`` and ``h0 (S, H)`` complex64."""
    h = bx.resolve_conj().contiguous().clone()  # our own memory: the loop writes the states into it
    keep, lam, h0 = keep.contiguous(), lam.resolve_conj().contiguous(), h0.resolve_conj().contiguous()
    sequences, steps, states = h.shape
    _library.lru_scan_forward(_address(h), _address(keep), _address(lam), _address(h0), sequences, steps, states)
    return h


def backward(grad_h: torch.Tensor, h: torch.Tensor, keep: torch.Tensor, lam: torch.Tensor,
             h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, grad_lam)``: the gradient in each ``bx_t`` ``(S, T, H)`` (the adjoint recurrence) and in lambda
    ``(H,)`` complex64 (torch's convention for complex gradients), from the gradient in the states."""
    g = grad_h.resolve_conj().contiguous().clone()  # our own memory: the loop writes the result into it
    h, keep = h.resolve_conj().contiguous(), keep.contiguous()
    lam, h0 = lam.resolve_conj().contiguous(), h0.resolve_conj().contiguous()
    sequences, steps, states = g.shape
    partial, grad_lam = torch.empty(states, 2), torch.zeros(states, 2, dtype=torch.float64)
    _library.lru_scan_backward(_address(g), _address(h), _address(keep), _address(lam), _address(h0),
                               _address(partial), _address(grad_lam), sequences, steps, states)
    return g, torch.view_as_complex(grad_lam.float())
