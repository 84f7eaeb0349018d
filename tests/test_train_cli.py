"""`examples/train.py` and `examples/evaluate.py`: a tiny run end to end, and one error line per mistake."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["env=pendulum", "algo.num_critics=2", "algo.hidden_size=16", "algo.rollout.rollouts_per_epoch=32",
        "algo.dynamics.hidden_size=16", "algo.dynamics.max_epochs=2", "algo.dynamics.min_epochs=0",
        "trainer.epochs=2", "trainer.updates_per_epoch=5", "trainer.eval_episodes=1", "trainer.progress=false",
        "torch_threads=1"]


def run(script, *overrides, tmp_path):
    env = {**os.environ, "MBRL_OFFLINE_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *overrides], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)


def test_train_then_evaluate(tmp_path, device):
    """Trains on ``device``; evaluation, on the CPU by default, reads the checkpoint wherever it was trained."""
    result = run("train.py", *TINY, f"device={device}", f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "RAVL on bundled:pendulum-medium" in result.stdout and "final normalised score" in result.stdout
    assert (tmp_path / "run" / "checkpoint.pt").exists() and list((tmp_path / "cache" / "dynamics").glob("*.pt"))
    evaluated = run("evaluate.py", f"checkpoint={tmp_path / 'run' / 'checkpoint.pt'}", "episodes=2", tmp_path=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "ravl on Pendulum-v1, epoch 2, 2 episodes: return" in evaluated.stdout

    again = run("train.py", *TINY, f"device={device}", f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    assert again.returncode == 2 and again.stderr.strip().endswith(
        "already holds a run (checkpoint.pt); pass resume=true to continue it, or choose another run_dir.")
    resumed = run("train.py", *TINY, "trainer.epochs=3", "resume=true", f"device={device}",
                  f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    assert resumed.returncode == 0, resumed.stderr


@pytest.mark.parametrize("override, message", [
    ("algo=ravel", "error: unknown algo 'ravel'. Did you mean 'ravl'? Known: coplanner, iql, mobile, mopo, ravl, td3bc."),
    ("env=hoper", "error: unknown env 'hoper'. Did you mean 'hopper'? Known: ant, halfcheetah, hopper,"),
    ("algo.etta=1", "error: unknown setting 'algo.etta'. Did you mean 'algo.eta'? Valid: num_critics, eta,"),
    ("trainer.epochs=many", "error: trainer.epochs = 'many' has the wrong type; expected int."),
    ("algo.rollout.horizon=[1", "error: cannot parse the override: no viable alternative at input '[1'"),
    ("budget=slow", "error: unknown budget 'slow'. Known: paper, quick."),
    ("algo.init=xavier", "error: unknown init 'xavier'; choose one of torch, edac."),
    ("algo.real_ratio=1.5", "error: real_ratio must be between 0 and 1, got 1.5."),
    ("algo.rollout.horizon=0", "error: rollout.horizon must be at least 1, got 0."),
    ("algo.dynamics.num_elites=9", "error: num_elites must be in 1..ensemble_size (7), got 9."),
    ("trainer.eval_every=0", "error: trainer.eval_every must be at least 1, got 0."),
    ("preset=mopo-hopper-medium", "error: that preset holds mopo settings, not ravl's; use algo=mopo or a ravl-"),
    ("preset=mopo-hoper-medium", "error: unknown preset 'mopo-hoper-medium'. Did you mean 'mopo-hopper-medium'?"),
    ("algo.rollout.penalty=mopo", "error: unknown rollout.penalty 'mopo'; choose one of none, aleatoric,"),
    ("algo.rollout.planner=cem", "error: unknown rollout.planner 'cem'; choose one of policy, upmpc."),
])
def test_bad_overrides_give_one_error_line(tmp_path, override, message):
    result = run("train.py", override, f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert not (tmp_path / "run").exists()


def test_evaluate_reports_a_missing_or_broken_checkpoint(tmp_path):
    missing = run("evaluate.py", f"checkpoint={tmp_path / 'nope.pt'}", tmp_path=tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"error: no checkpoint at {tmp_path / 'nope.pt'}; pass the checkpoint.pt of a run folder.")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    junk = run("evaluate.py", f"checkpoint={tmp_path / 'junk.pt'}", tmp_path=tmp_path)
    assert junk.returncode == 2 and len(junk.stderr.strip().splitlines()) == 1
    assert junk.stderr.startswith(f"error: {tmp_path / 'junk.pt'} is not a readable checkpoint")


@pytest.mark.parametrize("algo, extra", [
    ("mopo", ["preset=mopo-hopper-medium"]),  # a published preset on another env: it only sets h and lambda
    ("mobile", ["algo.target_floor=null"]),
    ("coplanner", ["algo.rollout.upmpc.candidates=2", "algo.rollout.upmpc.horizon=2"]),
    ("ravl", ["algo.true_dynamics=true", "algo.rollout.planner=upmpc"]),  # any generator with any agent
])
def test_every_algo_trains_and_evaluates_from_the_command_line(tmp_path, algo, extra, device):
    result = run("train.py", f"algo={algo}", *TINY, *extra, f"device={device}", f"trainer.run_dir={tmp_path / 'run'}",
                 tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "final normalised score" in result.stdout
    evaluated = run("evaluate.py", f"checkpoint={tmp_path / 'run' / 'checkpoint.pt'}", "episodes=1", tmp_path=tmp_path)
    assert evaluated.returncode == 0 and f"{algo} on Pendulum-v1, epoch 2" in evaluated.stdout, evaluated.stderr
