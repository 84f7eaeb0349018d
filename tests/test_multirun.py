"""Grids of runs through Hydra's launchers (`mbrl_offline.cli.tool_runs`, ``-m``): the basic, joblib and
submitit-local launchers, each run a full single run, every run checked before the first starts, and a
failed run reported while the others go on."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

QUICK = ["env=pendulum", "budget=quick", "trainer.epochs=1", "trainer.updates_per_epoch=10",
         "trainer.eval_episodes=1", "trainer.progress=false", "trainer.tensorboard=false"]
ENV = {**os.environ, "MBRL_OFFLINE_CACHE": ""}


def tool(cwd: Path, *args: str, name: str = "train") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mbrl_offline", name, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def final_score(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "eval" in r][-1]["eval"]["normalized_score"]


def test_a_two_by_two_grid_with_the_basic_launcher_equals_its_single_runs(tmp_path):
    done = tool(tmp_path, "-m", "seed=0,1", "algo=td3bc,iql", *QUICK)
    assert done.returncode == 0, done.stderr
    assert "4 of 4 runs finished" in done.stdout and "run 4 of 4 (seed=1 algo=iql):" in done.stdout
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert folders == ["iql-pendulum-seed0", "iql-pendulum-seed1", "td3bc-pendulum-seed0", "td3bc-pendulum-seed1"]
    for folder in folders:
        assert {"run.json", "metrics.jsonl", "checkpoint.pt"} <= {p.name for p in (tmp_path / "runs" / folder).iterdir()}
    assert len(list((tmp_path / "multirun" / "train").iterdir())) == 1  # Hydra's own multirun folder
    # a run of the grid is the single run of the same settings
    single = tool(tmp_path, "seed=1", "algo=iql", "trainer.run_dir=single", *QUICK)
    assert single.returncode == 0, single.stderr
    assert final_score(tmp_path / "single") == final_score(tmp_path / "runs" / "iql-pendulum-seed1")
    # the grid again: every run folder holds a finished run, refused before any run starts
    again = tool(tmp_path, "-m", "seed=0,1", "algo=td3bc,iql", *QUICK)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert again.stderr.startswith("error: run 1 of 4 (seed=0 algo=td3bc): ") and "No run was started." in again.stderr
    assert len(list((tmp_path / "multirun" / "train").iterdir())) == 1


@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                                      ["hydra/launcher=submitit_local"]])
def test_a_grid_runs_side_by_side_through_joblib_and_submitit(tmp_path, launcher):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher" if "joblib" in launcher[0]
                        else "hydra_plugins.hydra_submitit_launcher")
    done = tool(tmp_path, "-m", "seed=0,1", "algo=td3bc,iql", *QUICK, *launcher)
    assert done.returncode == 0, done.stderr
    assert "4 of 4 runs finished" in done.stdout
    for algo in ("td3bc", "iql"):
        for seed in (0, 1):
            run = tmp_path / "runs" / f"{algo}-pendulum-seed{seed}"
            info = json.loads((run / "run.json").read_text())
            assert info["algorithm"] == algo and info["seed"] == seed and (run / "checkpoint.pt").is_file()


def test_one_bad_value_is_refused_before_any_run_starts(tmp_path):
    done = tool(tmp_path, "-m", "seed=0,1,-1", "algo=td3bc", *QUICK)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: run 3 of 3 (seed=-1): ") and "No run was started." in done.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "multirun").exists()


def test_two_runs_writing_one_folder_are_refused(tmp_path):
    done = tool(tmp_path, "-m", "algo.alpha=1,2", "algo=td3bc", *QUICK)
    assert done.returncode == 2, done.stderr
    assert ("error: runs 1 (algo.alpha=1) and 2 (algo.alpha=2) would both write runs/td3bc-pendulum-seed0; put the "
            "swept settings in the folder's name, e.g. trainer.run_dir='runs/${algo.alpha}'") in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path):
    done = tool(tmp_path, "-m", "trainer.divergence_q=1e-12,1e6", "trainer.run_dir=runs/q${trainer.divergence_q}",
                "algo=td3bc", *QUICK)
    assert done.returncode == 1, done.stderr
    assert "1 of 2 runs finished" in done.stdout
    assert "error: 1 of 2 runs failed: run 1 (trainer.divergence_q=1e-12)" in done.stderr
    assert "error: run 1 of 2 (trainer.divergence_q=1e-12): training diverged" in done.stderr
    assert (tmp_path / "runs" / "q1000000.0" / "checkpoint.pt").is_file()
    assert not (tmp_path / "runs" / "q1e-12").exists()  # a run that failed before its first checkpoint leaves nothing


def test_launcher_settings_need_a_grid_and_a_known_launcher(tmp_path):
    single = tool(tmp_path, "algo=td3bc", "hydra/launcher=joblib", *QUICK)
    assert single.returncode == 2 and "add -m" in single.stderr, single.stderr
    unknown = tool(tmp_path, "-m", "seed=0,1", "algo=td3bc", "hydra/launcher=nope", *QUICK)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "unknown hydra/launcher 'nope'. Known: basic" in unknown.stderr
    report = tool(tmp_path, "-m", "runs", name="report")
    assert report.returncode == 2 and "-m" in report.stderr
    assert not (tmp_path / "runs").exists()


def test_a_grid_of_evaluations(tmp_path):
    trained = tool(tmp_path, "algo=td3bc", "trainer.run_dir=run", *QUICK)
    assert trained.returncode == 0, trained.stderr
    done = tool(tmp_path, "-m", "checkpoint=run/checkpoint.pt", "seed=0,1", "episodes=1", name="evaluate")
    assert done.returncode == 0, done.stderr
    assert "2 of 2 runs finished" in done.stdout and done.stdout.count("td3bc on Pendulum-v1, epoch 1, 1 episodes") == 2
    bad = tool(tmp_path, "-m", "checkpoint=run/checkpoint.pt", "episodes=1,0", name="evaluate")
    assert bad.returncode == 2 and bad.stderr.startswith("error: run 2 of 2 (episodes=0): "), bad.stderr


def test_runs_side_by_side_share_the_cores(monkeypatch):
    from mbrl_offline.cli import side_by_side

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert side_by_side([], 30) == 1 and side_by_side(["hydra/launcher=basic"], 30) == 1
    assert side_by_side(["hydra/launcher=joblib", "hydra.launcher.n_jobs=4"], 30) == 4
    assert side_by_side(["hydra/launcher=joblib", "hydra.launcher.n_jobs=-1"], 30) == 16
    assert side_by_side(["hydra/launcher=joblib", "hydra.launcher.n_jobs=-1"], 3) == 3
    assert side_by_side(["hydra/launcher=submitit_local"], 5) == 5


@pytest.fixture
def mps_installed(tmp_path, monkeypatch):
    """A PATH holding a stand-in for CUDA MPS's control program, and MPS's pipe folder empty (no daemon)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-cuda-mps-control").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipes"))
    return tmp_path / "pipes"


def test_a_cuda_grid_side_by_side_is_told_about_mps_where_no_daemon_answers(mps_installed, monkeypatch):
    from mbrl_offline.platform import mps_advice

    joblib = ["cuda", "cuda"], 2, "joblib"
    assert "CUDA's MPS" in mps_advice(*joblib) and "nvidia-cuda-mps-control -d" in mps_advice(*joblib)
    assert mps_advice(["cuda:1"] * 4, 4, "submitit_local") is not None
    assert mps_advice(["cpu", "cpu"], 2, "joblib") is None  # no GPU
    assert mps_advice(["cuda", "cuda"], 1, "joblib") is None  # one run at a time: nothing shares the GPU
    assert mps_advice(["cuda", "cuda"], 2, "submitit_slurm") is None  # the runs go to other machines
    assert mps_advice(["cuda", "cuda"], 2, None) is None  # the basic launcher: one after another
    mps_installed.mkdir()
    assert mps_advice(*joblib) is not None  # the folder alone: no daemon's pipes in it
    (mps_installed / "control").write_text("")
    assert mps_advice(*joblib) is None  # a daemon answers: the runs already share the GPU through it
    monkeypatch.setenv("PATH", str(mps_installed))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(mps_installed / "none"))
    assert mps_advice(*joblib) is None  # MPS is not installed here


def test_the_grid_prints_the_mps_hint_before_its_runs(mps_installed, monkeypatch, capsys):
    from omegaconf import OmegaConf

    from mbrl_offline import cli

    launched = []
    monkeypatch.setattr(cli, "launch", lambda tool, task, runs, overrides: launched.append(capsys.readouterr().out)
                        or [{"run": i, "error": None} for i in range(runs)])
    configs = [OmegaConf.create({"device": "cuda", "seed": s}) for s in (0, 1)]
    cli.launch_runs("train", print, configs, ["seed=0", "seed=1"], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], False)
    assert launched and launched[0].startswith("hint: 2 runs at a time share the GPU by time-slicing; CUDA's MPS")
    cli.launch_runs("train", print, [OmegaConf.create({"device": "cpu"})] * 2, ["seed=0", "seed=1"],
                    ["hydra/launcher=joblib"], False)
    assert "hint" not in launched[1]
