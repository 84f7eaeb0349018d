"""``benchmarks/concurrent_runs.py`` at a tiny size on the CPU: each concurrent run is a full run of the
agent (its published generator included) in its own process, and the table has a row per agent and
number of runs. No rates are checked (tests never assert on time)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.extended
def test_concurrent_runs_train_side_by_side_and_print_the_table(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "concurrent_runs.py"), "--agents", "td3bc", "mopo",
                           "--runs", "1", "2", "--epochs", "2", "--updates", "5", "--budget", "quick",
                           "--dynamics-epochs", "1", "--threads", "1", "--dataset", "pendulum-medium"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| td3bc", "| mopo"))]
    assert [(r[0].strip(), int(r[1])) for r in rows] == [("td3bc", 1), ("td3bc", 2), ("mopo", 1), ("mopo", 2)]
    assert all(float(r[3]) > 0 for r in rows) and rows[0][4].strip() == "1.00x"
    assert "budget quick; 2 epochs x 5 updates per run on pendulum-medium; MPS off" in done.stdout
    assert list(tmp_path.iterdir()) == []  # the runs and the model cache lived in temporary folders


def test_bad_options_are_refused():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "concurrent_runs.py"), "--epochs", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--epochs must be at least 2" in done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "concurrent_runs.py"), "--agents", "ravll"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown agents ['ravll']" in done.stderr
