"""Reports (mbrl_offline/report.py, examples/report.py): score tables, curves and sweep summaries from logs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mbrl_offline.report import ReportError, dataset_label, find_runs, score_table, write_report
from mbrl_offline.tune import PrunerConfig, SamplerConfig, SweepConfig, run_sweep

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def fake_run(folder: Path, algorithm: str, seed: int, scores: list[float], dataset="bundled:pendulum-medium",
             updates_per_epoch=100):
    """A run folder as `Trainer` writes it: run.json and one metrics.jsonl record per epoch."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"algorithm": algorithm, "env": "pendulum", "dataset": dataset,
                                                 "dataset_score": 39.0, "seed": seed}))
    with open(folder / "metrics.jsonl", "w") as f:
        for epoch, score in enumerate(scores, start=1):
            record = {"epoch": epoch, "step": epoch * updates_per_epoch, "train": {"critic_loss": 1.0},
                      "eval": {"normalized_score": score, "return_mean": score}}
            f.write(json.dumps(record) + "\n")
    return folder


def test_table_reports_final_and_last_ten_over_seeds(tmp_path):
    fake_run(tmp_path / "ravl-0", "ravl", 0, [0.0] * 5 + [40.0] * 10)
    fake_run(tmp_path / "ravl-1", "ravl", 1, [0.0] * 5 + [60.0] * 9 + [80.0])
    fake_run(tmp_path / "mopo-0", "mopo", 0, [10.0, 20.0, 30.0])
    runs, sweeps = find_runs([tmp_path])
    assert len(runs) == 3 and not sweeps
    rows = score_table(runs).splitlines()
    # ravl: finals 40 and 80 -> 60 ± 20; last ten 40 and (9 x 60 + 80) / 10 = 62 -> 51 ± 11; never the best (80)
    # the interval of the mean of two finals, 40 and 80: each redraw's mean is 40, 60 or 80 (1/4, 1/2, 1/4)
    assert rows[2] == "| pendulum-medium | mopo | 39.0 | 1 | 30.0 | - | 20.0 | 300 |"
    assert rows[3] == "| pendulum-medium | ravl | 39.0 | 2 | 60.0 ± 20.0 | [40.0, 80.0] | 51.0 ± 11.0 | 1,500 |"


def test_report_writes_markdown_and_curves(tmp_path):
    for seed in range(3):
        fake_run(tmp_path / "runs" / f"ravl-{seed}", "ravl", seed, [30.0 + seed, 50.0, 60.0 + seed])
        fake_run(tmp_path / "runs" / f"hop-{seed}", "ravl", seed, [1.0, 2.0], dataset="/data/hopper_medium-v2.hdf5")
    report = write_report([tmp_path / "runs"], tmp_path / "out", command="python examples/report.py runs")
    text = report.read_text()
    assert "Made by `python examples/report.py runs`." in text
    assert "| hopper_medium-v2 | ravl | 39.0 | 3 |" in text and "| pendulum-medium | ravl | 39.0 | 3 |" in text
    for name in ("curves-pendulum-medium.png", "curves-hopper_medium-v2.png"):
        assert f"]({name})" in text and (tmp_path / "out" / name).read_bytes()[:8] == PNG


def test_dataset_labels():
    assert dataset_label("bundled:hopper-medium") == "hopper-medium"
    assert dataset_label("/x/hopper_medium-v2.hdf5") == "hopper_medium-v2"
    assert dataset_label("mujoco/hopper/medium-v0") == "mujoco/hopper/medium-v0"


def test_sweep_report(tmp_path):
    scores = iter([20.0, 70.0, 45.0, 10.0])

    def run_trial(params, seed, run_dir, callbacks):
        score = next(scores)
        fake_run(run_dir, "ravl", seed, [score / 2, score])
        trainer = type("T", (), {"config": type("C", (), {"epochs": 2, "seed": seed}), "history": []})
        for epoch, value in ((1, score / 2), (2, score)):
            trainer.history.append({"epoch": epoch, "normalized_score": value})
            for callback in callbacks:
                callback.on_eval(trainer, epoch, {"normalized_score": value, "returns": [0.0] * 3})
        return {"final_score": score, "last10_score": score}

    config = SweepConfig(n_trials=4, dir=str(tmp_path / "sweep"), study_name="s", seeds=(0,),
                         sampler=SamplerConfig(name="random"), pruner=PrunerConfig(name="none"),
                         space={"algo": {"eta": {"type": "float", "low": 0.1, "high": 10.0, "log": True},
                                         "num_critics": {"type": "categorical", "choices": [10, 50]}}})
    run_sweep(config, run_trial, log=lambda _: None)
    text = write_report([tmp_path / "sweep"], tmp_path / "out").read_text()
    assert "## Sweep `s`" in text and "Trials: 4 complete." in text
    assert "Online evaluation used by the tuning: 24 episodes in the real env" in text  # 4 trials x 2 evals x 3
    best = [line for line in text.splitlines() if line.startswith("| 1 | 70.00 |")]
    assert best and text.index("| 1 | 70.00 |") < text.index("| 2 | 45.00 |") < text.index("| 0 | 20.00 |")
    assert "| `algo.eta` |" in text and "![sweep0-pendulum-medium](sweep0-pendulum-medium.png)" in text
    assert (tmp_path / "out" / "sweep0-pendulum-medium.png").read_bytes()[:8] == PNG
    assert "| pendulum-medium |" not in text  # the trials' runs are not mixed into the score table


def test_report_command_on_real_runs_and_bad_paths(tmp_path):
    env = {**os.environ, "MBRL_OFFLINE_CACHE": str(tmp_path / "cache")}
    tiny = ["env=pendulum", "algo.num_critics=2", "algo.hidden_size=16", "generator.rollout.rollouts_per_epoch=32",
            "generator.dynamics.hidden_size=16", "generator.dynamics.max_epochs=2", "generator.dynamics.min_epochs=0", "generator.every=5",
            "trainer.epochs=3", "trainer.updates_per_epoch=5", "trainer.eval_episodes=1", "trainer.progress=false",
            "torch_threads=1"]
    for seed in (0, 1):
        train = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), *tiny, f"seed={seed}",
                                f"trainer.run_dir={tmp_path / 'runs' / f'ravl-{seed}'}"],
                               capture_output=True, text=True, env=env, timeout=300)
        assert train.returncode == 0, train.stderr
    report = subprocess.run([sys.executable, str(ROOT / "examples" / "report.py"), str(tmp_path / "runs"), "--out",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "wrote" in report.stdout, report.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| pendulum-medium | ravl | 39.0 | 2 |" in text and "| 15 |" in text  # 3 epochs x 5 updates
    assert (tmp_path / "out" / "curves-pendulum-medium.png").read_bytes()[:8] == PNG

    missing = subprocess.run([sys.executable, str(ROOT / "examples" / "report.py"), str(tmp_path / "nothing")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"error: {tmp_path / 'nothing'} does not exist; pass run folders (with metrics.jsonl) or folders holding them.")
    (tmp_path / "runs" / "ravl-1" / "metrics.jsonl").write_text('{"epoch": 1, "st')
    with pytest.raises(ReportError, match=r"ravl-1/metrics.jsonl line 1 is not valid JSON \(truncated\?\)"):
        find_runs([tmp_path / "runs"])
    with pytest.raises(ReportError, match="no runs found under"):
        find_runs([tmp_path / "cache"])
