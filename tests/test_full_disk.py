"""Writes to a real full file system: a small tmpfs mounted in a private mount namespace (``unshare -m``,
which needs root or user namespaces; the tests skip, saying why, where it is not available).

Every file the library writes goes through `mbrl_offline.utils.atomic_path`: a failed write is one
``error: cannot write ...`` line (exit status 2 from a tool), no partial or temporary file is left,
an old file is kept, and a run that fails before its first checkpoint leaves no run files behind."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN_TINY = ["env=pendulum", "algo=td3bc", "generator=none", "trainer.epochs=1", "trainer.updates_per_epoch=2",
              "trainer.eval_episodes=1", "trainer.progress=false", "torch_threads=1"]
# Leaves ``leave`` bytes free on the file system of ``folder`` (tmpfs counts whole 4 KiB pages).
FILL = ("import os, sys; folder, leave = sys.argv[1], int(sys.argv[2]); s = os.statvfs(folder); "
        "open(os.path.join(folder, 'fill'), 'wb').write(bytes(max(0, s.f_bavail * s.f_frsize - leave)))")


def _namespace_problem() -> str:
    if shutil.which("unshare") is None:
        return "the unshare command is missing"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot mount a tmpfs in a private mount namespace ({probe.stderr.strip() or probe.returncode})"
    return ""


PROBLEM = _namespace_problem()
pytestmark = pytest.mark.skipif(bool(PROBLEM), reason=f"needs a private mount namespace: {PROBLEM}")


def on_small_disk(tmp_path: Path, command: list[str], size: str = "64k", leave: int | None = None,
                  prepare: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """``command`` (run with this Python) with a fresh tmpfs of ``size`` at ``tmp_path/disk``, filled to leave
    ``leave`` bytes free, after the shell lines ``prepare``; returns the result and the tmpfs's files after it
    (recursively, without the filler)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    fill = f"{shlex.quote(sys.executable)} -c {shlex.quote(FILL)} {disk} {leave} && " if leave is not None else ""
    script = (f"mount -t tmpfs -o size={size} tmpfs {disk} && {prepare}{fill}"
              f"{shlex.join([sys.executable, *command])}; rc=$?; echo '--files--'; "
              f"cd {disk} && find . -mindepth 1 ! -name fill | sort; exit $rc")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MBRL_OFFLINE_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                            text=True, timeout=300, env=env, cwd=tmp_path)
    output, _, listing = result.stdout.partition("--files--\n")
    result.stdout = output
    return result, listing.split()


def assert_one_error_line(result, start: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), result.stderr


def test_a_dataset_export_to_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """HDF5 wrote to the disk itself and, after the failed flush, tried again at exit: a segmentation fault."""
    out = tmp_path / "disk" / "hopper.hdf5"
    result, files = on_small_disk(tmp_path, [str(ROOT / "examples" / "inspect_dataset.py"), "dataset=hopper-medium",
                                             f"out={out}"])
    assert_one_error_line(result, f"error: cannot write {out}: No space left on device; nothing was written.")
    assert files == []


def test_a_training_run_on_a_nearly_full_disk_fails_in_one_line_and_leaves_no_run(tmp_path):
    """run.json and metrics.jsonl fit; the checkpoint does not: nothing of the run is left, so the same command
    can run again once there is space, and a file that was in the folder before stays."""
    run_dir = tmp_path / "disk" / "runs" / "a"
    keep = tmp_path / "disk" / "runs" / "notes.txt"
    result, files = on_small_disk(tmp_path, [str(ROOT / "examples" / "train.py"), *TRAIN_TINY,
                                             "trainer.tensorboard=false", f"trainer.run_dir={run_dir}"],
                                  size="256k", leave=12 * 1024,
                                  prepare=f"mkdir -p {keep.parent} && echo mine > {keep} && ")
    assert_one_error_line(result, f"error: cannot write {run_dir / 'checkpoint.pt'}: No space left on device")
    assert files == ["./runs", "./runs/notes.txt"]


def test_a_full_disk_under_tensorboard_is_one_line_and_leaves_no_run(tmp_path):
    run_dir = tmp_path / "disk" / "run"
    result, files = on_small_disk(tmp_path, [str(ROOT / "examples" / "train.py"), *TRAIN_TINY,
                                             f"trainer.run_dir={run_dir}"], size="256k", leave=6 * 1024)
    assert_one_error_line(result, "error: cannot write ")
    assert "No space left on device" in result.stderr and files == []


WRITES = """
import sys, torch
from pathlib import Path
from mbrl_offline.errors import MbrlOfflineError
from mbrl_offline.utils import atomic_torch_save, atomic_write_bytes, save_figure
disk = Path(sys.argv[1])
atomic_torch_save({"epoch": 1}, disk / "checkpoint.pt")
atomic_write_bytes(disk / "metrics.jsonl", "{}\\n")
before = {p.name: p.read_bytes() for p in disk.iterdir()}
big = (disk / "fill").write_bytes(bytes(max(0, (lambda s: s.f_bavail * s.f_frsize)(__import__("os").statvfs(disk))
                                            - 8192)))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot(range(1000))
for write in (lambda: atomic_torch_save({"weights": torch.zeros(100_000)}, disk / "checkpoint.pt"),
              lambda: atomic_write_bytes(disk / "metrics.jsonl", "x" * 100_000),
              lambda: atomic_write_bytes(disk / "new" / "deep" / "run.json", "x" * 100_000),
              lambda: save_figure(fig, disk / "curves.png", dpi=300)):
    try:
        write()
    except MbrlOfflineError as exc:
        assert "\\n" not in str(exc) and str(exc).startswith("cannot write ") and "No space left on device" in str(exc), exc
        print("refused")
    else:
        print("written")
assert {p.name: p.read_bytes() for p in disk.iterdir() if p.name != "fill"} == before
"""


def test_each_kind_of_write_on_a_full_disk_is_one_error_and_keeps_the_old_file(tmp_path):
    """A checkpoint (torch's zip writer: a RuntimeError), a log, a file in folders still to be made and a figure."""
    result, files = on_small_disk(tmp_path, ["-c", WRITES, str(tmp_path / "disk")], size="128k")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["refused"] * 4
    assert files == ["./checkpoint.pt", "./metrics.jsonl"]


MINARI = """
import sys
from mbrl_offline import load_dataset
from mbrl_offline.data.minari_io import write_minari
from mbrl_offline.errors import DatasetError
try:
    write_minari(load_dataset("pendulum-medium").subset(range(2000)), "mbrl/pendulum/full-v0", root=sys.argv[1])
except DatasetError as exc:
    print(exc)
"""


def test_a_minari_dataset_written_to_a_full_disk_is_one_error_and_leaves_nothing(tmp_path):
    """Minari's own HDF5 writes crashed the interpreter on a full disk; it now builds the dataset in memory."""
    result, files = on_small_disk(tmp_path, ["-c", MINARI, str(tmp_path / "disk")])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (f"cannot write Minari dataset 'mbrl/pendulum/full-v0' in {tmp_path / 'disk'}: No "
                                     f"space left on device; nothing was written. Check the free disk space, or "
                                     f"choose another folder.")
    assert files == []
