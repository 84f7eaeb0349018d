"""The results table made by one command (`mbrl_offline.tools.reproduce`, ``mbrl-reproduce``): the grid's runs,
each the train tool's single run in its own folder; run again, it keeps finished runs, resumes stopped ones
exactly and starts the rest; bad settings are refused in one line before any run starts."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mbrl_offline.config import CONFIG_DIR
from mbrl_offline.config_files import compose
from mbrl_offline.errors import ConfigError
from mbrl_offline.reproduce import dataset_env, plan_runs, reproduce_config, split_overrides

TINY = ["trainer.epochs=2", "trainer.updates_per_epoch=10", "trainer.eval_every=1", "trainer.eval_episodes=1",
        "trainer.final_eval_episodes=2", "trainer.checkpoint_every=1", "trainer.progress=false",
        "trainer.tensorboard=false"]
GRID = ["algos=[td3bc]", "datasets=[pendulum-medium]", "also={td3bc: [], iql: [pendulum-random]}", "seeds=[0,1]", "out=res/results.md"]


def reproduce(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mbrl_offline", "reproduce", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_grid_is_every_registered_agent_on_each_dataset_plus_the_extra_pairs():
    from mbrl_offline.algorithms import ALGORITHMS

    grid, settings = split_overrides(["seeds=[3]", "device=cpu", "trainer.epochs=5", "also=null"])
    assert grid == ["seeds=[3]", "also=null"] and settings == ["device=cpu", "trainer.epochs=5"]
    config = reproduce_config(compose(CONFIG_DIR, "reproduce", grid), settings)
    runs = plan_runs(config)
    assert [r.algo for r in runs[::len(config.datasets)]] == sorted(ALGORITHMS)  # by algorithm, then dataset
    assert {(r.algo, r.dataset) for r in runs} == {(a, d) for a in ALGORITHMS for d in config.datasets}
    assert len(runs) == len(ALGORITHMS) * len(config.datasets)  # one seed
    run = next(r for r in runs if r.algo == "ravl" and r.dataset == "pendulum-medium")
    assert run.run_dir == Path("runs/reproduce/cpu/ravl/pendulum-medium/seed3")
    assert run.overrides == ["algo=ravl", "env=pendulum", "env.dataset=pendulum-medium", "budget=cpu", "seed=3",
                             "device=cpu", "trainer.epochs=5"]
    default = plan_runs(reproduce_config(compose(CONFIG_DIR, "reproduce", [])))
    assert len(default) == 3 * (len(ALGORITHMS) + 2 * 3)  # 3 seeds; TD3+BC and IQL on three MuJoCo datasets too
    assert dataset_env("inverted-pendulum-medium") == "inverted-pendulum" and dataset_env("hopper-medium") == "hopper"


@pytest.mark.parametrize("grid, settings, message", [
    (["algos=[td3bc,iqll]"], [], "unknown algo 'iqll' in the grid. Did you mean 'iql'?"),
    (["datasets=[pendulum-mediun]"], [], "datasets: 'pendulum-mediun' is not a bundled dataset. Did you mean"),
    (["also={td3bc: [hopper]}"], [], "also.td3bc: 'hopper' is not a bundled dataset."),
    (["seeds=[0,0]"], [], "seeds = [0, 0]: give distinct whole numbers >= 0"),
    (["seeds=[-1]"], [], "seeds = [-1]: give distinct whole numbers >= 0"),
    (["out=docs/results"], [], "out = docs/results: the results page is markdown"),
    ([], ["seed=4"], "seed=4: the grid sets seed for each run itself; set seeds instead."),
    ([], ["resume=true"], "resume=true: the grid sets resume for each run itself; run the command again"),
])
def test_a_bad_grid_is_one_line(grid, settings, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.").replace("?", r"\?")):
        reproduce_config(compose(CONFIG_DIR, "reproduce", grid), settings)


@pytest.mark.extended
def test_runs_resume_where_they_stopped_and_the_page_is_written(tmp_path):
    # a stopped run: seed 1 of td3bc trained by the train tool for one of its two epochs (a checkpoint after it)
    stopped = tmp_path / "runs/reproduce/cpu/td3bc/pendulum-medium/seed1"
    first = subprocess.run([sys.executable, "-m", "mbrl_offline", "train", "algo=td3bc", "env=pendulum",
                            "env.dataset=pendulum-medium", "budget=cpu", "seed=1", f"trainer.run_dir={stopped}",
                            *TINY, "trainer.epochs=1"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    done = reproduce(tmp_path, *GRID, *TINY)
    assert done.returncode == 0, done.stderr
    assert "4 runs at budget cpu: 0 finished earlier, 1 to resume, 3 to start" in done.stdout
    assert "(td3bc pendulum-medium seed 1 (resumed)):" in done.stdout and "4 of 4 runs finished" in done.stdout
    assert [r["epoch"] for r in metrics(stopped)] == [1, 2]
    # the resumed run is the run that was never stopped (exact resume)
    fresh = reproduce(tmp_path, *GRID[:-1], "seeds=[1]", "also=null", "runs_dir=fresh", "out=fresh/results.md", *TINY)
    assert fresh.returncode == 0, fresh.stderr
    again = metrics(tmp_path / "fresh/cpu/td3bc/pendulum-medium/seed1")
    # (the stopped run's first evaluation was its last then: 2 episodes, not 1)
    assert again[-1]["eval"]["normalized_score"] == metrics(stopped)[-1]["eval"]["normalized_score"]

    page = (tmp_path / "res/results.md").read_text()
    assert "4 of 4 runs finished" in page and "Machine: " in page and "Budget `cpu`" in page
    assert "budget=paper" in page and "far shorter than the papers'" in page
    every_run = page.split("## Every run")[1].split("\n## ")[0]
    rows = [line for line in every_run.splitlines() if line.startswith(("| td3bc | pendulum-medium |",
                                                                         "| iql | pendulum-random |"))]
    assert len(rows) == 4 and all(float(row.split("|")[6]) >= 0 for row in rows)  # each with its wall time
    # and the commit it ran: that of the package the tool's runs imported (run from tmp_path as they were, so an
    # editable install of another checkout is the one read), or "-" for an installed package
    code = json.loads(subprocess.run([sys.executable, "-c", "import json; from mbrl_offline.platform import "
                                      "code_version; print(json.dumps(code_version()))"], cwd=tmp_path,
                                     capture_output=True, text=True, check=True).stdout)
    shown = "-" if code["commit"] is None else code["commit"][:7] + ("+" if code["modified"] else "")
    assert all(row.split("|")[7].strip() == shown for row in rows)
    assert "| 2 x 10 updates, 1-episode evaluations every 1 epochs (the last of 2) |" in page
    assert "## Aggregate over datasets" in page and "![profiles](results-profiles.png)" in page
    assert {p.name for p in (tmp_path / "res").iterdir()} == {
        "results.md", "results-profiles.png", "results-curves-pendulum-medium.png", "results-curves-pendulum-random.png"}

    # run again: everything is kept, nothing retrained
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("checkpoint.pt")}
    kept = reproduce(tmp_path, *GRID, *TINY)
    assert kept.returncode == 0, kept.stderr
    assert "4 runs at budget cpu: 4 finished earlier, 0 to resume, 0 to start" in kept.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("checkpoint.pt")} == before


def test_a_bad_run_setting_or_a_foreign_folder_is_refused_before_any_run_starts(tmp_path):
    bad = reproduce(tmp_path, *GRID, *TINY, "trainer.eval_every=0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("error: run 1 of 4 (td3bc pendulum-medium seed 0): ") and "No run was started." in bad.stderr
    assert list(tmp_path.iterdir()) == []
    # a folder of the grid that holds another run's files (no checkpoint to resume from) is not overwritten
    foreign = tmp_path / "runs/reproduce/cpu/iql/pendulum-random/seed1"
    foreign.mkdir(parents=True)
    (foreign / "run.json").write_text("{}")
    refused = reproduce(tmp_path, *GRID, *TINY)
    assert refused.returncode == 2 and refused.stderr.startswith("error: run 4 of 4 (iql pendulum-random seed 1): ")
    assert "No run was started." in refused.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert (foreign / "run.json").read_text() == "{}"
