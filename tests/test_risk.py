"""Risk measures of every evaluation: the value at risk and conditional value at risk of the episode
returns at a risk level alpha (`mbrl_offline.evaluation.risk_measures`), in the trainer's metrics,
the evaluate tool and the report."""
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import ConfigError
from mbrl_offline.evaluation import evaluate_policy, risk_measures
from mbrl_offline.report import find_runs, risk_table, write_report
from mbrl_offline.trainer import TrainerConfig


def quantile_integral(values, alpha, pieces=200_000):
    """(1 / alpha) x the integral of the empirical quantile function over (0, alpha], by a midpoint sum."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    u = (np.arange(pieces) + 0.5) / pieces * alpha
    return x[np.ceil(u * len(x)).astype(int) - 1].mean()


@pytest.mark.parametrize("n, alpha", itertools.product([1, 3, 10, 17], [0.05, 0.1, 0.25, 0.3, 0.5, 0.9]))
def test_var_is_the_alpha_quantile_and_cvar_the_mean_of_the_quantile_function_below_it(n, alpha):
    values = np.random.default_rng(n).normal(100.0, 30.0, n)
    var, cvar = risk_measures(values, alpha)
    x = np.sort(values)
    assert var == x[max(1, int(np.ceil(alpha * n - 1e-9))) - 1]  # inverted CDF: P(X <= VaR) >= alpha, the least such
    assert (values <= var).mean() >= alpha and ((values < var).mean() < alpha)
    assert cvar == pytest.approx(quantile_integral(values, alpha), rel=1e-4, abs=1e-3)
    assert x[0] - 1e-9 <= cvar <= var + 1e-9  # the mean of the tail up to the VaR


def test_cvar_is_the_mean_of_the_worst_share_when_it_is_whole():
    returns = [50.0, 10.0, 40.0, 20.0, 30.0, 90.0, 60.0, 70.0, 80.0, 100.0]
    assert risk_measures(returns, 0.1) == (10.0, 10.0)
    assert risk_measures(returns, 0.3) == (30.0, 20.0)
    assert risk_measures(returns, 0.5) == (50.0, 30.0)


@pytest.mark.parametrize("level", [0.0, 1.0, -0.1, 1.5, float("nan"), "0.1", True])
def test_a_risk_level_outside_zero_to_one_is_refused_in_one_line(level):
    with pytest.raises(ConfigError, match="between 0 and 1"):
        risk_measures([1.0, 2.0], level)
    with pytest.raises(ConfigError, match="trainer.risk_level"):
        TrainerConfig(risk_level=level)


def test_every_evaluation_reports_the_lower_tail_of_its_returns_and_scores():
    env = get_env_info("pendulum")
    rng = np.random.default_rng(0)
    result = evaluate_policy(lambda obs: rng.uniform(-2, 2, (len(obs), 1)).astype(np.float32), env, 5, 0, 0.4)
    returns = np.array(result["returns"])
    assert (result["return_var"], result["return_cvar"]) == risk_measures(returns, 0.4)
    scores = env.normalized_score(returns)
    assert result["normalized_score_var"] == pytest.approx(risk_measures(scores, 0.4)[0])
    assert result["normalized_score_cvar"] == pytest.approx(risk_measures(scores, 0.4)[1])
    assert result["return_cvar"] <= result["return_var"] <= result["return_mean"]


def test_the_report_has_the_final_evaluations_risk_table_and_reads_old_logs(tmp_path):
    for seed, (var, cvar) in enumerate([(10.0, 5.0), (20.0, 15.0)]):
        folder = tmp_path / "runs" / f"iql-{seed}"
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"algorithm": "iql", "env": "pendulum",
                                                     "dataset": "bundled:pendulum-medium", "dataset_score": 39.0,
                                                     "seed": seed, "trainer": {"risk_level": 0.2}}))
        record = {"epoch": 1, "step": 100, "train": {}, "eval": {"normalized_score": 30.0 + seed,
                                                                 "normalized_score_var": var,
                                                                 "normalized_score_cvar": cvar}}
        (folder / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    old = tmp_path / "runs" / "td3bc-0"  # a log from before the risk measures: scores only
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"algorithm": "td3bc", "env": "pendulum",
                                              "dataset": "bundled:pendulum-medium", "dataset_score": 39.0, "seed": 0}))
    (old / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 100, "eval": {"normalized_score": 5.0}}) + "\n")
    runs, _ = find_runs([tmp_path / "runs"])
    rows = risk_table(runs).splitlines()
    assert rows[2:] == ["| pendulum-medium | iql | 2 | 0.2 | 30.5 ± 0.5 | 15.0 ± 5.0 | 10.0 ± 5.0 |"]
    report = write_report([tmp_path / "runs"], tmp_path / "out").read_text()
    assert "## The lower tail of the final evaluation" in report and rows[2] in report and "| td3bc |" in report


def test_the_evaluate_tool_prints_the_risk_measures_and_refuses_a_bad_level(tmp_path):
    from mbrl_offline import load_dataset
    from mbrl_offline.compose import build_run

    run_dir = tmp_path / "run"
    from mbrl_offline.algorithms import get_algorithm
    agent_cls, _ = get_algorithm("td3bc")
    trainer = build_run("td3bc", load_dataset("pendulum-medium"), agent_cls.config_class(), None,
                        TrainerConfig(epochs=1, updates_per_epoch=2, eval_episodes=2, run_dir=str(run_dir),
                                      progress=False, tensorboard=False, risk_level=0.5), "cpu")
    trainer.train()
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"return_var", "return_cvar", "normalized_score_var", "normalized_score_cvar"} <= set(record["eval"])
    assert record["eval"]["return_cvar"] <= record["eval"]["return_var"]
    tool = [sys.executable, "-m", "mbrl_offline.tools.evaluate", f"checkpoint={run_dir / 'checkpoint.pt'}", "episodes=2"]
    done = subprocess.run(tool + ["risk_level=0.5"], capture_output=True, text=True)
    assert done.returncode == 0 and "at risk level 0.5: value at risk" in done.stdout, done.stderr
    refused = subprocess.run(tool + ["risk_level=1.5"], capture_output=True, text=True)
    assert refused.returncode == 2 and "risk_level = 1.5 must be a number strictly between 0 and 1" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
