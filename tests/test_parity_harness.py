"""The parity harnesses' own parts that run without a peer's checkout: the model measurements, the
report (table, ratios, PNG) and the command-line refusals; with ``MBRL_OFFLINE_OFFLINERLKIT`` set, Kit's
side of the COMBO and RAMBO learning runs at a tiny budget. The peers' code itself is run by
``benchmarks/vs_offlinerlkit.py`` and ``vs_official.py --learn`` (docs/parity.md)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import parity  # noqa: E402


def test_model_measures_take_mopos_penalty_over_all_members_and_the_elites_error():
    class Holdout:
        observations = np.zeros((4, 2), np.float32)
        actions = np.zeros((4, 1), np.float32)
        next_observations = np.ones((4, 2), np.float32)  # change 1 in both dims
        rewards = np.full(4, 2.0, np.float32)

    # member 0 predicts the change and reward exactly, member 1 is off by 1 everywhere; member 1's
    # std is 2 in all 3 outputs (norm 2 sqrt 3), member 0's 1 (norm sqrt 3)
    mean = np.stack([np.tile([1.0, 1.0, 2.0], (4, 1)), np.tile([2.0, 2.0, 3.0], (4, 1))])
    logvar = np.stack([np.zeros((4, 3)), np.full((4, 3), np.log(4.0))])
    out = parity.model_measures(lambda o, a: (mean, logvar), lambda o, a: np.full(len(o), 2.0), np.array([0]),
                                Holdout, 0.5, np.array([-1.0]), np.array([1.0]))
    assert out["holdout_mse_elites"] == 0.0 and out["holdout_mse_all"] == 0.5
    for probe in ("data_actions", "random_actions"):
        assert out[probe]["u_mean"] == pytest.approx(2 * 3 ** 0.5)  # the max over all members, not the elites
        assert out[probe]["penalised_reward_mean"] == pytest.approx(2.0 - 0.5 * 2 * 3 ** 0.5)


def fake_run(side, seed, score, u):
    curve = [{"epoch": e, "normalized_score": score + e, "return_mean": 0.0, "rollout_reward_mean": 1.0,
              "q_mean": 10.0 * e, "alpha": 0.5} for e in range(1, 6)]
    probe = {"u_mean": u, "u_std": 0.1, "reward_mean": 1.0, "penalised_reward_mean": 1.0 - u,
             "penalised_reward_std": 0.2}
    return {"side": side, "algo": "mopo", "dataset": "hopper-medium", "seed": seed, "cpu": "test CPU",
            "budget": {"dynamics_max_epochs": 3, "epochs": 5, "updates_per_epoch": 10, "rollouts": 100,
                       "eval_episodes": 2},
            "settings": {"horizon": 5, "penalty_coef": 5.0},
            "model": {"epochs": 3, "holdout_mse_elites": 0.02, "holdout_mse_all": 0.03, "own_holdout_loss": 0.025,
                      "logvar_bounds": {"max_mean": -1.0}, "data_actions": probe, "random_actions": probe},
            "curve": curve}


def test_report_puts_the_sides_beside_each_other_with_their_ratio(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    runs = [fake_run("offlinerlkit", 0, 10.0, 0.4), fake_run("offlinerlkit", 1, 12.0, 0.6),
            fake_run("ours", 0, 11.0, 0.5)]
    for i, run in enumerate(runs):
        (results / f"{i}.json").write_text(json.dumps(run))
    out = tmp_path / "docs" / "parity.md"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_offlinerlkit.py"), "--results", str(results),
                           "--report", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "### MOPO on hopper-medium" in text and "Seeds OfflineRL-Kit: [0, 1], ours: [0]" in text
    assert "| MOPO u, dataset actions: mean | 0.5 ± 0.1 | 0.5 | 1.00 |" in text
    assert "| normalised score, epoch 5 | 16 ± 1 | 16 | 1.00 |" in text
    assert (out.parent / "parity-mopo-hopper-medium.png").stat().st_size > 10_000


@pytest.mark.parametrize("script,args,message", [
    ("vs_offlinerlkit.py", ["--offlinerlkit", "/nonexistent"], "--offlinerlkit must name a checkout of"),
    ("vs_offlinerlkit.py", ["--results", "/nonexistent", "--report", "x.md"], "no results in /nonexistent"),
    ("vs_official.py", ["--learn", "--edge-of-reach", "/nonexistent"], "--edge-of-reach must name a checkout of"),
    ("vs_offlinerlkit.py", ["--sides", "ours", "--ours-dynamics", "logvar_bound=member"],
     "--ours-dynamics takes KEY=VALUE with KEY a DynamicsConfig setting"),
    ("vs_offlinerlkit.py", ["--sides", "ours", "--algo", "cql", "--ours-algo", "lse=per_repeat", "--label", "x"],
     "--ours-algo takes KEY=VALUE with KEY a setting of cql"),
    ("vs_offlinerlkit.py", ["--sides", "ours", "--algo", "cql", "--ours-algo", "lse_mode=per_repeat"],
     "name its results with --label"),
])
def test_harnesses_refuse_bad_input_in_one_line(script, args, message, tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("script, algo", [("vs_offlinerlkit.py", "mobile"), ("vs_official.py", "ravl"),
                                          ("vs_offlinerlkit.py", "cql"), ("vs_offlinerlkit.py", "combo"),
                                          ("vs_offlinerlkit.py", "rambo")])
@pytest.mark.extended
def test_our_side_runs_end_to_end_at_a_tiny_budget(script, algo, tmp_path):
    """Our side of each harness (the library as train.py composes it), on pendulum-medium: a 1-epoch
    model, then 1 agent epoch of 20 updates; the result file holds the model measures and the curve
    (a model-free agent's, CQL's, the curve alone)."""
    learn = ["--learn"] if script == "vs_official.py" else []
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *learn, "--algo", algo, "--sides", "ours",
                           "--dataset", "pendulum-medium", "--seeds", "0", "--dynamics-max-epochs", "1",
                           "--epochs", "1", "--updates-per-epoch", "20", "--rollouts", "100", "--eval-episodes", "1",
                           "--jobs", "1", "--results", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = tmp_path.glob(f"{algo}-pendulum-medium-seed0-ours.json")
    run = json.loads(result.read_text())
    assert len(run["curve"]) == 1 and np.isfinite(run["curve"][0]["q_mean"])
    if algo == "cql":
        assert run["model"] is None and run["settings"]["model_free"] and run["agent_config"]["cql_weight"] == 5.0
        return
    assert run["model"]["epochs"] == 1 and run["dynamics_config"]["max_epochs"] == 1


KIT = os.environ.get("MBRL_OFFLINE_OFFLINERLKIT")  # a checkout of yihaosun1124/OfflineRL-Kit, or unset


@pytest.mark.skipif(not KIT, reason="set MBRL_OFFLINE_OFFLINERLKIT to a checkout of yihaosun1124/OfflineRL-Kit")
@pytest.mark.parametrize("algo", ["combo", "rambo"])
def test_kits_side_learns_at_a_tiny_budget(algo, tmp_path):
    """Kit's side of the learning harness (``run_combo.py``'s / ``run_rambo.py``'s objects under
    ``MBPolicyTrainer``) on hopper-medium: a 1-epoch model, then 2 agent epochs of 20 updates with the
    published schedule scaled to them (a generation every epoch; RAMBO: every 5 updates, and an
    adversarial phase of 20 steps each epoch), measured as ours are: the settings both sides share, a
    finite curve, and RAMBO's model measured in its standardised coordinates."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_offlinerlkit.py"), "--offlinerlkit", KIT,
                           "--algo", algo, "--sides", "offlinerlkit", "--seeds", "0", "--dynamics-max-epochs", "1",
                           "--epochs", "2", "--updates-per-epoch", "20", "--rollouts", "200", "--eval-episodes", "1",
                           "--jobs", "1", "--results", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((tmp_path / f"{algo}-hopper-medium-seed0-offlinerlkit.json").read_text())
    assert run["settings"]["real_ratio"] == 0.5
    assert [c["epoch"] for c in run["curve"]] == [1, 2]
    assert all(np.isfinite([c["q_mean"], c["rollout_reward_mean"], c["normalized_score"]]).all() for c in run["curve"])
    if algo == "combo":
        assert run["settings"]["cql_weight"] == 5.0 and not run["settings"]["standardise_observations"]
    else:
        assert run["settings"]["standardise_observations"] and run["settings"]["adversarial"]["coef"] == 3e-4
        assert run["model"]["holdout_mse_elites"] < 0.1


def test_report_of_a_model_free_algorithm_has_no_model_rows(tmp_path):
    """CQL's and EDAC's runs (no model, no rollouts): the report compares scores, Q and alpha, names
    our variant's changed settings, and draws two panels."""
    results = tmp_path / "results"
    results.mkdir()
    for i, (side, seed, score, ours_algo) in enumerate([("offlinerlkit", 0, 10.0, None), ("ours", 0, 20.0, None),
                                                         ("ours-per-repeat", 0, 10.0, ["lse_mode=per_repeat"])]):
        run = fake_run(side, seed, score, 0.0)
        run.update(algo="cql", model=None, ours_algo=ours_algo,
                   settings={"model_free": True, "auto_alpha": True, "init_alpha": 1.0, "agent": {"cql_weight": 5.0}})
        for c in run["curve"]:
            c["rollout_reward_mean"] = float("nan")
        (results / f"{i}.json").write_text(json.dumps(run))
    out = tmp_path / "parity.md"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "vs_offlinerlkit.py"), "--results", str(results),
                           "--report", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "### CQL on hopper-medium" in text and "on the dataset alone, cql_weight 5.0" in text
    assert "ours-per-repeat: lse_mode=per_repeat" in text
    assert "| normalised score, epoch 5 | 15 | 25 | 15 | 1.67 |" in text
    assert "holdout" not in text and "dynamics" not in text and "rollout" not in text


def test_command_line_values_read_as_the_settings_parser_reads_them():
    """``--ours-algo actor_lr=1e-4``: YAML 1.1 reads 1e-4 as a string; the harness reads a float."""
    assert parity.yaml_value("1e-4") == 1e-4 and parity.yaml_value("10.0") == 10.0
    assert parity.yaml_value("member") == "member" and parity.yaml_value("null") is None
    assert parity.yaml_value("false") is False and parity.yaml_value("5") == 5


@pytest.mark.parametrize("side, kept", [("ours", True), ("offlinerlkit", False)])
def test_the_speed_harness_keeps_freed_memory_for_our_side_only(side, kept, monkeypatch, capsys):
    """Our side is measured as our CPU training runs it (freed memory kept for reuse, as the other
    side-by-side scripts do); Kit's side as its own scripts run it."""
    import argparse

    import mbrl_offline.platform
    import vs_offlinerlkit_speed as speed

    calls = []
    monkeypatch.setattr(mbrl_offline.platform, "keep_freed_memory", lambda: calls.append(True) or True)
    monkeypatch.setattr(speed, "rates", lambda *args: [2.0, 3.0, 4.0])
    monkeypatch.setattr(speed.throughput, "matmul_peak", lambda device: [100.0])
    monkeypatch.setattr(speed.torch, "set_num_threads", lambda n: None)
    speed.child(argparse.Namespace(threads=1, side=side, agent="cql", offlinerlkit=Path("."), updates=1))
    assert calls == ([True] if kept else [])
    assert json.loads(capsys.readouterr().out.split("RESULT ", 1)[1])["rate"] == 3.0
