"""Settings of the process, not of the library: they act on every computation of the process, so they run
only when asked for. The command-line tools ask for them (`mbrl_offline.cli.cli_main` calls
`apply_environment` before torch loads; the train and sweep tools call `keep_freed_memory` for a CPU run
with ``keep_freed_memory=true``), and so do the benchmarks; ``import mbrl_offline`` changes nothing.

**MKL's AVX-512 code on AMD CPUs** (opt-in: ``MBRL_OFFLINE_MKL_AVX512=1``, then `apply_environment`).
PyTorch's x86 wheels do their fp32 matmuls with Intel's MKL. MKL picks its code by CPU vendor: on an
AMD CPU it runs AVX2 code even where the CPU has AVX-512 (AMD's Zen 4 and Zen 5), so torch's products
run slower than the CPU allows, while the oneDNN library bundled in the same torch wheel runs AVX-512
code on the same CPU. MKL asks one function, ``mkl_serv_intel_cpu_true``, whether the CPU is Intel's. A
shared library loaded into the process before torch that defines a function of that name returning 1
is found before MKL's own (the dynamic linker resolves a name in load order), and MKL then picks its
code by the CPU's instruction sets, as it does on Intel CPUs. This is the ``LD_PRELOAD`` workaround
that users of MKL on AMD CPUs have long used, done from Python: the library is six bytes of x86-64 code
in an ELF file written here into memory (``memfd_create``), so no compiler or file on disk is needed.
Results differ from MKL's AVX2 code only by fp32 rounding; the measured speed-ups are in
docs/performance.md.

Off by default, because it changes a process-wide choice inside MKL that Intel does not document
(every matmul of the process, not only this library's), and because a run's numbers then depend on
how the process was started: the same run from Python and from the command line must give the same
metrics (``tests/test_budgets.py``). It takes effect only when the library is loaded before torch, as
MKL is linked when torch loads: ``MBRL_OFFLINE_MKL_AVX512=1 mbrl-train ...`` (or ``python
examples/train.py ...``) does that, as the tools import torch only after `apply_environment`; in a
script of your own, call ``mbrl_offline.platform.apply_environment()`` before ``import torch``
(``import mbrl_offline`` does not load torch). It does nothing, and says why in `status`, on CPUs other
than AMD ones with AVX-512 (MKL already runs AVX-512 code on Intel CPUs), outside x86-64 Linux, or
when torch was imported first.

**glibc's malloc keeping freed memory** (`keep_freed_memory`), for CPU training: see its docstring.

**CUDA's Multi-Process Service** (`mps_advice`): a grid whose runs share one GPU on this machine is told,
in one line before it starts, when MPS is installed but no daemon answers (docs/gpu.md has the figures
and the commands). The library never starts or stops the daemon: it serves every process of the user
on that GPU, so that is the user's choice.

This module imports nothing of the package or torch at the top: it runs before torch is loaded,
and its test loads it alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import signal
import struct
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ENV_VAR = "MBRL_OFFLINE_MKL_AVX512"
SYMBOL = "mkl_serv_intel_cpu_true"
ON = "MKL runs its AVX-512 code on this AMD CPU"
# the AVX-512 subsets of Intel's first AVX-512 server CPUs, which MKL's AVX-512 code assumes
REQUIRED_FLAGS = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")

_off_reason: str | None = None  # why the unlock is off, once `apply_environment` or `unlock` ran; None: on
_asked = False  # whether `apply_environment` or `unlock` ran in this process
_library = None  # the loaded CDLL, kept so that it stays loaded


def status() -> str:
    """What `unlock` did in this process, as one line for logs: ``on (...)`` or ``off (why)``."""
    return f"on ({ON})" if is_on() else f"off ({_reason_off()})"


def _reason_off() -> str:
    if _asked:
        return str(_off_reason)
    requested = os.environ.get(ENV_VAR, "").strip()
    if requested == "1":
        return (f"{ENV_VAR}=1, but nothing in this process asked for it: call "
                "mbrl_offline.platform.apply_environment() before torch loads, as the command-line tools do")
    return _environment_problem() or f"{ENV_VAR} is not 1"


def is_on() -> bool:
    return _asked and _off_reason is None


def advice() -> str | None:
    """One line for a CPU training run's log: that the unlock is on, why ``=1`` did nothing, or that
    it would help here; None where there is nothing to say."""
    requested = os.environ.get(ENV_VAR, "").strip()
    if is_on():
        return f"matmuls: {ON} ({ENV_VAR}=1)"
    if requested == "1":
        return f"matmuls: {ENV_VAR}=1 did nothing: {_reason_off()}"
    if would_help() and not requested:
        return (f"hint: torch's MKL runs AVX2 code on this AMD CPU, which has AVX-512; {ENV_VAR}=1 lets it run "
                "its AVX-512 code (1.6x the RAVL updates/s on a Zen 5 CPU; docs/performance.md)")
    return None


def would_help() -> bool:
    """Whether this CPU is one where MKL runs AVX2 code although the CPU has AVX-512 (an AMD one)."""
    return _cpu_reason() is None


def apply_environment() -> str:
    """`unlock` when ``MBRL_OFFLINE_MKL_AVX512=1``; returns `status`. Call it before torch loads: the
    command-line tools do (`mbrl_offline.cli.cli_main`), and so do the benchmarks.

    Another value leaves it off, with the reason in `status`: a speed setting should not stop a
    script. The command-line tools stop on it with one error line (`check_environment`) first."""
    global _off_reason, _asked
    problem = _environment_problem()
    if problem:
        _off_reason, _asked = problem, True
        return status()
    if os.environ.get(ENV_VAR, "").strip() == "1":
        return unlock()
    if not _asked:
        _off_reason, _asked = f"{ENV_VAR} is not 1", True
    return status()


def check_environment() -> None:
    """Raise `ConfigError` if ``MBRL_OFFLINE_MKL_AVX512`` holds a value other than 1, 0 or nothing."""
    from mbrl_offline.errors import ConfigError  # here: this module loads alone, before the package

    problem = _environment_problem()
    if problem:
        raise ConfigError(problem)


def _environment_problem() -> str | None:
    value = os.environ.get(ENV_VAR, "").strip()
    if value in ("", "0", "1"):
        return None
    return (f"{ENV_VAR}={value!r} is not understood: set it to 1 (let MKL run its AVX-512 code on AMD CPUs), "
            "or to 0 or nothing (torch's default)")


def unlock() -> str:
    """Load the one-function library that makes MKL pick its code by instruction set; returns `status`."""
    global _off_reason, _library, _asked
    _asked = True
    if _library is not None:
        return status()
    reason = _cpu_reason()
    if reason is None and "torch" in sys.modules:
        reason = ("torch was imported before mbrl_offline.platform.apply_environment() ran, and MKL's own "
                  "function was found first; call it before torch loads")
    if reason is None:
        try:
            _library = _load(elf_shared_library(SYMBOL))
        except OSError as exc:
            reason = f"the library could not be loaded: {exc}"
    _off_reason = reason
    return status()


def cpu_name() -> str:
    """The CPU's model, family and model number from /proc/cpuinfo (Linux), for the record (the results page,
    the benchmarks' headers)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in lines if ":" in line)}
    return f"{fields.get('model name', '?')}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def code_version() -> dict:
    """The library's version, and where it runs from a git checkout (an editable install), the checkout's
    commit and whether tracked files differ from it, for the record (``run.json``, the results page):
    ``{"version": "0.1.0", "commit": "e87aba6...", "modified": False}``; commit and modified are None for an
    installed package or when git is not available."""
    import subprocess

    from mbrl_offline import __version__

    root = Path(__file__).resolve().parent.parent
    commit = modified = None
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10)
            changes = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                     capture_output=True, text=True, timeout=10)
            if head.returncode == 0 and changes.returncode == 0:
                commit, modified = head.stdout.strip(), bool(changes.stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"version": __version__, "commit": commit, "modified": modified}


def _cpu_reason(cpuinfo: str | None = None) -> str | None:
    """None if this CPU (or the given /proc/cpuinfo text) is an AMD one with AVX-512 on x86-64 Linux,
    else why the unlock does not apply."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return f"only for x86-64 Linux, not {sys.platform} {platform.machine()}"
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError as exc:
        return f"/proc/cpuinfo could not be read: {exc}"
    first_cpu = cpuinfo.split("\n\n")[0]
    fields = dict(line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)
    fields = {key.strip(): value.split() for key, value in fields.items()}
    vendor = (fields.get("vendor_id") or ["unknown"])[0]
    if vendor != "AuthenticAMD":
        return f"not needed on a {vendor} CPU: MKL picks its code by instruction set there"
    missing = [flag for flag in REQUIRED_FLAGS if flag not in fields.get("flags", [])]
    if missing:
        return f"this AMD CPU lacks {', '.join(missing)}, so MKL's AVX2 code is the right one"
    return None


def _load(image: bytes) -> ctypes.CDLL:
    fd = os.memfd_create("mbrl_offline_mkl_avx512", os.MFD_CLOEXEC)
    try:
        os.write(fd, image)
        # RTLD_GLOBAL: later libraries (torch's) find the function here, before MKL's own
        return ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_GLOBAL)
    finally:
        os.close(fd)  # the loaded mapping outlives the descriptor


def elf_shared_library(name: str) -> bytes:
    """An x86-64 ELF shared library that exports one function, ``int name(void)``, returning 1.

    The least the dynamic linker needs: two loadable segments (code and tables read-only, the dynamic
    section writable, as glibc adjusts its addresses in place), a dynamic section pointing at a
    one-bucket SysV hash table, the symbol and string tables, and a non-executable stack (without
    that note glibc 2.41 and later refuse to load it). No section headers: the loader does not read them.
    """
    code = bytes([0xB8, 0x01, 0x00, 0x00, 0x00, 0xC3])  # mov eax, 1; ret
    strtab = b"\0" + name.encode() + b"\0"
    program_headers = 4
    hash_at = 64 + 56 * program_headers  # after the ELF header and the program headers
    hash_table = struct.pack("<5I", 1, 2, 1, 0, 0)  # 1 bucket, 2 symbols: bucket -> 1, chains end
    symbols_at = hash_at + len(hash_table)
    strings_at = symbols_at + 2 * 24
    code_at = (strings_at + len(strtab) + 15) & ~15
    code_end = code_at + len(code)
    global_function, defined_in_a_section = (1 << 4) | 2, 1  # STB_GLOBAL, STT_FUNC; any index but 0
    symbols = bytes(24) + struct.pack("<IBBHQQ", 1, global_function, 0, defined_in_a_section, code_at, len(code))
    dynamic_at = 0x1000  # its own page, writable
    dt_hash, dt_strtab, dt_symtab, dt_strsz, dt_syment, dt_null = 4, 5, 6, 10, 11, 0
    dynamic = struct.pack("<12Q", dt_hash, hash_at, dt_strtab, strings_at, dt_symtab, symbols_at,
                          dt_strsz, len(strtab), dt_syment, 24, dt_null, 0)
    et_dyn, em_x86_64 = 3, 62
    header = struct.pack("<4s5B7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0,  # 64-bit, little-endian, v1
                         et_dyn, em_x86_64, 1, 0, 64, 0, 0, 64, 56, program_headers, 64, 0, 0)
    pt_load, pt_dynamic, pt_gnu_stack = 1, 2, 0x6474E551
    read, write, execute = 4, 2, 1

    def segment(kind, flags, offset, size, align):
        return struct.pack("<IIQQQQQQ", kind, flags, offset, offset, offset, size, size, align)

    headers = (segment(pt_load, read | execute, 0, code_end, 0x1000)
               + segment(pt_load, read | write, dynamic_at, len(dynamic), 0x1000)
               + segment(pt_dynamic, read | write, dynamic_at, len(dynamic), 8)
               + segment(pt_gnu_stack, read | write, 0, 0, 16))
    image = bytearray(dynamic_at + len(dynamic))
    for offset, part in [(0, header), (64, headers), (hash_at, hash_table), (symbols_at, symbols),
                         (strings_at, strtab), (code_at, code), (dynamic_at, dynamic)]:
        image[offset:offset + len(part)] = part
    return bytes(image)


MPS_CONTROL = "nvidia-cuda-mps-control"  # CUDA MPS's control program, installed with NVIDIA's driver
MPS_DEFAULT_PIPES = "/tmp/nvidia-mps"  # where MPS keeps its pipes when CUDA_MPS_PIPE_DIRECTORY is unset
LOCAL_LAUNCHERS = ("joblib", "submitit_local")  # Hydra launchers whose runs run side by side on this machine


def mps_running() -> bool:
    """Whether a CUDA MPS control daemon serves this process's CUDA work: the folder of its pipes
    (``CUDA_MPS_PIPE_DIRECTORY``, by default /tmp/nvidia-mps) exists and holds them."""
    folder = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPES)
    return folder.is_dir() and any(folder.iterdir())


def mps_advice(devices: list, at_once: int, launcher: str | None) -> str | None:
    """One line for a grid of runs on ``devices`` (each run's ``device`` setting), ``at_once`` of them at a
    time through Hydra's ``launcher``: that MPS would let runs on one GPU work together, where the runs
    share a CUDA GPU on this machine, MPS is installed (`MPS_CONTROL` on PATH) and no daemon answers
    (`mps_running`); else None. Measured on an H200 (docs/gpu.md): 16 graphed RAVL runs made 1.00x one
    run's updates/s by time-slicing and 3.92x under MPS."""
    import shutil

    if at_once < 2 or launcher not in LOCAL_LAUNCHERS or not any(str(d).startswith("cuda") for d in devices):
        return None
    if shutil.which(MPS_CONTROL) is None or mps_running():
        return None
    return (f"hint: {at_once} runs at a time share the GPU by time-slicing; CUDA's MPS lets their kernels run "
            f"together (start it with `{MPS_CONTROL} -d` before the grid, stop it with `echo quit | {MPS_CONTROL}`): "
            "on an H200, 16 RAVL runs made 3.9x one run's updates/s with it and 1.0x without (docs/gpu.md)")


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory for reuse instead of giving it back to the OS; returns
    whether it could (only on Linux with glibc). Process-wide; call it once at the start of CPU training.

    Why: torch on CPU allocates each activation and gradient afresh, and a block whose memory came
    fresh from the OS faults its pages in on first touch, page by page.
    glibc gives memory back in two ways, and this turns both off (docs/performance.md measures both):

    * it gives the top of its heap back to the OS whenever more than twice its (adaptive) threshold
      is free there, so the next update's tensors fault their pages in again (a RAVL update, 10
      critics of 3x256 at batch 256, did at every update); with the heap kept (trim threshold 1 GiB)
      they reuse its memory;
    * it serves every block above its mmap threshold (at most 32 MiB) with a fresh ``mmap``,
      returned to the OS when freed. Rollouts (50,000 starts: 51 MB activations) and dynamics
      training's evaluation passes allocate many such blocks, and their page faults were a large
      share of a rollout call's time. Here every block comes from the heap (``M_MMAP_MAX`` 0), and a
      freed one is reused.

    The cost: the process keeps its peak heap (up to 1 GiB of free memory) instead of returning it.
    This is what the environment variables MALLOC_MMAP_MAX_ and MALLOC_TRIM_THRESHOLD_ set at
    start-up; PyTorch's CPU tuning guide suggests another allocator (jemalloc, tcmalloc) for the same
    reason. A request the heap cannot grow for still gets its own mapping (glibc falls back to
    ``mmap`` then).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # another C library (musl) or none found
        return False
    m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4  # from glibc's malloc.h
    # The threshold too: setting the trim threshold alone turns off the adaptive mmap threshold and
    # leaves it at its default (128 KiB), which made every large block a fresh mmap (and its pages
    # fresh faults at every update) where mmap is allowed.
    return (bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))
            and bool(mallopt(m_mmap_max, 0)))


# Set by `interrupts_kept`'s SIGINT handler at every Ctrl-C it raises (whether or not Python's KeyboardInterrupt
# is then lost); cleared when `raise_if_interrupted` raises and when the block ends.
_pending_interrupt = False
_kept = False  # inside `interrupts_kept`
# How many `interrupts_deferred` blocks the main thread is in; while above 0, a Ctrl-C sets `_deferred_interrupt`
# and is raised when the outermost block ends.
_deferred_depth = 0
_deferred_interrupt = False


def _interrupt(signum, frame):
    global _pending_interrupt
    if _kept and _deferred_depth == 0:
        _pending_interrupt = True
    interrupt_unless_deferred()


def interrupt_unless_deferred() -> None:
    """KeyboardInterrupt now, or, inside an `interrupts_deferred` block, where the outermost block ends. For the
    handlers of signals that stop the process as Ctrl-C does (the sweeps' SIGTERM, `mbrl_offline.tune`)."""
    global _deferred_interrupt
    if _deferred_depth > 0:
        _deferred_interrupt = True
        return
    raise KeyboardInterrupt


@contextmanager
def interrupts_kept() -> Iterator[None]:
    """Ctrl-C that stops the tool however late it lands. Python raises KeyboardInterrupt wherever the main
    thread is when SIGINT arrives; raised inside a weakref callback or a ``__del__`` (SQLAlchemy's, under
    Optuna's storage, runs at any garbage collection) it is printed as "Exception ignored" and lost, and a
    sweep went on to its end and exited 0. Within this block a SIGINT also sets a flag, and
    `raise_if_interrupted` (the trainer calls it after every update) raises once more where the first was
    lost. The tools run in it (`mbrl_offline.cli.cli_main`; this module loads no torch, so the tools can
    import it first); only in the main thread, and only where SIGINT has Python's own handler (not where
    it is ignored)."""
    global _pending_interrupt, _kept
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    previous = signal.signal(signal.SIGINT, _interrupt)
    _pending_interrupt, _kept = False, True
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _pending_interrupt, _kept = False, False


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C that lands in this block is raised as KeyboardInterrupt where the block ends, not inside it.
    For code that a KeyboardInterrupt at an arbitrary line leaves broken: the sweeps run every call into
    Optuna's storage in it (`mbrl_offline.tune`). Interrupted at some lines of its commit or of its session's
    close, SQLAlchemy kept the connection checked out and its SQLite transaction open: the next write
    waited for the database lock (60 s), the next calls raised IllegalStateChangeError, and after a few
    such interrupts the pool ran out and a call waited for ever (tests/test_tune.py drives a Ctrl-C to
    lines all through a storage call). Blocks nest; the outermost raises. It acts in the main thread (the
    only one that Python interrupts): on SIGINT where it has Python's own handler or `interrupts_kept`'s (a
    SIGINT that is ignored, or handled by the application, is left to it), and on the signals whose handlers
    call `interrupt_unless_deferred`."""
    global _deferred_depth, _deferred_interrupt
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    install = handler is signal.default_int_handler  # outside `interrupts_kept`: its handler, for the block
    outer = _deferred_depth
    if outer == 0:
        _deferred_interrupt = False
    # Written so that a Ctrl-C on any line here leaves the depth right: the handler, when left installed by
    # one, raises as Python's own does.
    try:
        if install:
            signal.signal(signal.SIGINT, _interrupt)
        _deferred_depth = outer + 1
        yield
    finally:
        try:
            _deferred_depth = outer
            if outer == 0 and _deferred_interrupt:  # also over the block's own error: the Ctrl-C wins
                _deferred_interrupt = False
                raise KeyboardInterrupt
        finally:
            if install:
                signal.signal(signal.SIGINT, handler)


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if a Ctrl-C arrived in `interrupts_kept` since the block began or since this last
    raised. Code that catches a KeyboardInterrupt and goes on training inside the block gets it once more here."""
    global _pending_interrupt
    if _pending_interrupt:
        _pending_interrupt = False
        raise KeyboardInterrupt
