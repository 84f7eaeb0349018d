"""The command-line tools: one clear line and a non-zero exit on bad input, nothing written."""
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from mbrl_offline import write_d4rl_hdf5

ROOT = Path(__file__).resolve().parents[1]


def run(script, *overrides, env=None):
    import os

    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *overrides], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def broken_files(tmp_path, data):
    truncated = write_d4rl_hdf5(data, tmp_path / "hopper_truncated.hdf5")
    truncated.write_bytes(truncated.read_bytes()[:3000])
    nan_row = tmp_path / "hopper_nan.hdf5"
    wrong_dim = tmp_path / "hopper_wide.hdf5"
    for path, change in ((nan_row, "nan"), (wrong_dim, "wide")):
        with h5py.File(path, "w") as f:
            for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
                value = getattr(data, key).copy()
                if change == "nan" and key == "rewards":
                    value[5] = np.nan
                if change == "wide" and key in ("observations", "next_observations"):
                    value = np.pad(value, ((0, 0), (0, 2)))
                f.create_dataset(key, data=value)
    return {"truncated": (truncated, "corrupt or truncated"), "nan": (nan_row, "NaN or Inf values (first at row 5)"),
            "wide": (wrong_dim, "'observations' have dimension 13 but env 'hopper' expects 11")}


@pytest.mark.parametrize("case", ["truncated", "nan", "wide"])
def test_bad_dataset_gives_one_error_line_and_writes_nothing(tmp_path, hopper_data, case):
    path, expected = broken_files(tmp_path, hopper_data)[case]
    out = tmp_path / "export.hdf5"
    result = run("inspect_dataset.py", f"dataset={path}", f"out={out}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}") and expected in lines[0], result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_inspect_and_export_a_good_dataset(tmp_path, hopper_data):
    source = write_d4rl_hdf5(hopper_data, tmp_path / "hopper_good.hdf5")
    result = run("inspect_dataset.py", f"dataset={source}", f"out={tmp_path / 'copy.hdf5'}")
    assert result.returncode == 0, result.stderr
    assert '"transitions": 300' in result.stdout and (tmp_path / "copy.hdf5").exists()


def test_collect_cli_makes_loadable_datasets_and_rejects_unknown_settings(tmp_path):
    env = {"MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    result = run("collect.py", "env=pendulum", "collect.levels=[random]", "collect.dataset_size=300",
                 f"collect.run_dir={tmp_path / 'run'}", "collect.progress=false", env=env)
    assert result.returncode == 0, result.stderr
    assert "random" in result.stdout and (tmp_path / "minari/mbrl/pendulum/random-v0/data/metadata.json").exists()

    bad = run("collect.py", "env=pendulum", "+collect.dataset_sise=300", f"collect.run_dir={tmp_path / 'run2'}", env=env)
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: unknown setting 'collect.dataset_sise'. Did you mean 'collect.dataset_size'? Valid: env, levels,")
    wrong_type = run("collect.py", "env=pendulum", "collect.dataset_size=lots", f"collect.run_dir={tmp_path / 'run3'}", env=env)
    assert wrong_type.returncode == 2
    assert wrong_type.stderr.strip() == "error: collect.dataset_size = 'lots' has the wrong type; expected int or null."


def test_vs_official_without_a_checkout_says_what_to_clone(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_official.py"), "--edge-of-reach",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path} is not a checkout of anyasims/edge-of-reach (no agent_training/agent.py). "
        "Clone it and pass its path with --edge-of-reach."]


def test_vs_synther_without_a_checkout_says_what_to_clone(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_synther.py"), "--synther", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path} is not a checkout of conglu1997/SynthER (no synther/diffusion/elucidated_diffusion.py). "
        "Clone it outside this repository and pass its path with --synther."]


@pytest.mark.extended
def test_diffusion_benchmark_runs_in_its_smoke_mode():
    # tiny models and calls: the script's code paths, not its rates
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "diffusion.py"), "--smoke", "--threads", "1",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| synther") or line.startswith("| pgd")]
    assert len(rows) == 4 and all(line.count("|") == 7 for line in rows)
