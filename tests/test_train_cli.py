"""`examples/train.py` and `examples/evaluate.py`: a tiny run end to end, and one error line per mistake."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.config import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
RUN_TINY = ["env=pendulum", "trainer.epochs=2", "trainer.updates_per_epoch=5", "trainer.eval_episodes=1",
            "trainer.progress=false", "torch_threads=1"]
ROLLOUTS_TINY = ["generator.rollout.rollouts_per_epoch=32", "generator.dynamics.hidden_size=16",
                 "generator.dynamics.max_epochs=2", "generator.dynamics.min_epochs=0", "generator.every=5"]
TINY = RUN_TINY + ["algo.num_critics=2", "algo.hidden_size=16"] + ROLLOUTS_TINY


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
        "already holds a run (run.json, metrics.jsonl, checkpoint.pt, tensorboard); pass resume=true to continue it, "
        "overwrite=true to replace it, or choose another run_dir.")
    resumed = run("train.py", *TINY, "trainer.epochs=3", "resume=true", f"device={device}",
                  f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    assert resumed.returncode == 0, resumed.stderr


# A mistake on the command line and the one line it gets (its start).
BAD_OVERRIDES = [
    ("algo=ravel", f"error: unknown algo 'ravel'. Did you mean 'ravl'? Known: {', '.join(sorted(ALGORITHMS))}."),
    ("env=hoper", "error: unknown env 'hoper'. Did you mean 'hopper'? Known: ant, halfcheetah, hopper,"),
    ("algo.etta=1", "error: unknown setting 'algo.etta'. Did you mean 'algo.eta'? Valid: num_critics, eta,"),
    ("trainer.epochs=many", "error: trainer.epochs = 'many' has the wrong type; expected int."),
    ("generator.rollout.horizon=[1", "error: cannot parse the override: no viable alternative at input '[1'"),
    ("budget=slow", "error: unknown budget 'slow'. Known: cpu, paper, quick."),
    ("algo.init=xavier", "error: unknown init 'xavier'; choose one of torch, edac, edac-official, offlinerlkit, corl-cql."),
    ("algo=edac algo.eta=-1", "error: algo.eta must be at least 0, got -1.0."),
    ("algo=edac algo.update_order=rlkit", "error: algo.update_order must be one of corl, official, offlinerlkit, offlinerlkit_sac, got 'rlkit'."),
    ("algo=edac algo.alpha_max=0", "error: algo.alpha_max must be above 0, got 0.0."),
    ("algo=edac preset=edac-hopper-medium env=walker2d", "error: that preset holds the settings published for "
                                                          "hopper-medium, not for env walker2d; use env=hopper"),
    ("generator.mixing.real_ratio=1.5", "error: mixing.real_ratio must be between 0 and 1, got 1.5."),
    ("generator.mixing.rule=half", "error: unknown mixing rule 'half'; choose one of fraction, counts, weights, tape, latest."),
    ("generator.rollout.horizon=0", "error: rollout.horizon must be at least 1, got 0."),
    ("generator.dynamics.num_elites=9", "error: num_elites must be in 1..ensemble_size (7), got 9."),
    ("generator.every=-1", "error: generator.every must be >= 0 (0: generate once), got -1."),
    ("algo.rollout.horizon=3", "error: unknown setting 'algo.rollout.horizon'. The generator's settings are under "
                               "generator.*: write generator.rollout.horizon."),  # they moved out of algo
    ("algo.real_ratio=0.5", "error: unknown setting 'algo.real_ratio'. The generator's settings are under generator.*: "
                            "write generator.mixing.real_ratio."),
    ("generator=rolouts", "error: unknown generator 'rolouts'. Did you mean 'rollouts'?"),
    ("algo=mobile generator=none", "error: mobile's penalty needs the generator's dynamics model, and generator 'none' has "
                                   "none; use generator=rollouts, or leave generator unset for mobile's own."),
    ("algo=td3bc generator.rollout.horizon=3", "error: unknown setting 'generator.rollout.horizon'. This run has no "
                                               "generator (generator=none); name one (e.g. generator=rollouts) to set "
                                               "its settings."),
    ("trainer.eval_every=0", "error: trainer.eval_every must be at least 1, got 0."),
    ("preset=mopo-hopper-medium", "error: that preset holds mopo settings, not ravl's; use algo=mopo or a ravl-"),
    ("preset=mopo-hoper-medium", "error: unknown preset 'mopo-hoper-medium'. Did you mean 'mopo-hopper-medium'?"),
    ("generator.rollout.penalty=mopo", "error: unknown rollout.penalty 'mopo'; choose one of none, aleatoric,"),
    ("generator.rollout.planner=cem", "error: unknown rollout.planner 'cem'; choose one of policy, upmpc."),
    ("algo.gamma=99", "error: algo.gamma must be in (0, 1] (the discount; usually 0.99), got 99.0."),
    ("algo.batch_size=0", "error: algo.batch_size must be at least 1, got 0."),
    ("algo.critic_lr=-3e-4", "error: algo.critic_lr must be above 0, got -0.0003."),
    ("seed=-1", "error: seed must be at least 0, got -1."),
    ("torch_threads=-1", "error: torch_threads must be at least 0 (0 or null: torch's default), got -1."),
    ("device=nonsense", "error: device=nonsense is not a device; write cpu, cuda, cuda:<index> or mps."),
    ("algo=mopo env=pendulum preset=mopo-hopper-medium", "error: that preset holds the settings published for "
                                                         "hopper-medium, not for env pendulum; use env=hopper"),
    # a boolean is true or false: 'no' is never read as true (nor 'yes', 1 or 0 as anything)
    ("overwrite=no", "error: overwrite = 'no' has the wrong type; expected true or false (write overwrite=true or "
                     "overwrite=false)."),
    ("resume=yes", "error: resume = 'yes' has the wrong type; expected true or false"),
    ("keep_freed_memory=1", "error: keep_freed_memory = 1 has the wrong type; expected true or false"),
    ("trainer.progress=0", "error: trainer.progress = 0 has the wrong type; expected true or false"),
    # every unknown setting at once, each with its hint, never a Hydra traceback
    ("trainer.epoch=5 algo.etta=0.5", "error: 2 unknown settings: 'trainer.epoch' (Did you mean 'trainer.epochs'?); "
                                      "'algo.etta' (Did you mean 'algo.eta'?)."),
    ("algo.rollout.horizon=3 algo.rollout.rollouts_per_epoch=5",
     "error: 2 unknown settings: 'algo.rollout.horizon' (The generator's settings are under generator.*: write "
     "generator.rollout.horizon.); 'algo.rollout.rollouts_per_epoch' (The generator's settings are under generator.*: "
     "write generator.rollout.rollouts_per_epoch.)."),
    ("budget=quick generator=rollouts generator.kind=synther trainer.epoch=5",
     "error: 7 unknown settings: 'trainer.epoch' (Did you mean 'trainer.epochs'?); 'generator.samples'; "),  # one of the user's, six of the budget's synther settings
    ("budget=quick generator=rollouts generator.kind=synther",
     "error: 6 unknown settings: 'generator.samples'; 'generator.sample_batch'; 'generator.denoiser.width'; "
     "'generator.edm.steps'; 'generator.train.steps'; 'generator.train.ema_every'. generator.samples, "
     "generator.sample_batch, generator.denoiser.width, generator.edm.steps, generator.train.steps, "
     "generator.train.ema_every are set by budget quick for runs with generator.kind=synther, but this run's config "
     "does not have them: choose the generator with generator=synther, not generator.kind=synther."),
    ("=5", "error: override '=5' names no setting; write setting=value, e.g. seed=5."),
    # the preset, not the user, set what the chosen generator lacks
    ("algo=mopo preset=mopo-hopper-medium generator=synther",
     "error: preset mopo-hopper-medium (mbrl_offline/configs/preset/mopo-hopper-medium.yaml) sets generator.rollout, "
     "which generator synther does not have: its values are for mopo's own generator; leave generator= unset"),
    ("algo=neubay preset=neubay-hopper-medium generator=none",
     "error: preset neubay-hopper-medium (mbrl_offline/configs/preset/neubay-hopper-medium.yaml) sets "
     "generator.mixing, generator.dynamics, which generator none does not have"),
    # a setting another makes ineffective is refused, naming both
    ("algo=neubay generator.every=500", "error: generator.every=500 has no effect while generator.utd=0.05 schedules "
                                        "the generations"),
]


@pytest.mark.parametrize("override, message", BAD_OVERRIDES)
def test_bad_overrides_give_one_error_line(tmp_path, override, message, monkeypatch, capsys):
    """The train tool's ``main`` in this process (a new process per case cost seconds each, most of it imports):
    exit status 2, one line on stderr, nothing on stdout and no run folder."""
    from test_tools_cli import run_in_process

    monkeypatch.setenv("MBRL_OFFLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    status, out, err = run_in_process("train", [*override.split(), f"trainer.run_dir={tmp_path / 'run'}"],
                                      monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith(message) and out == "", err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("override, message", [case for case in BAD_OVERRIDES if case[0] in (
    "algo=ravel", "trainer.epochs=many", "overwrite=no", "trainer.epoch=5 algo.etta=0.5", "=5",
    "algo=neubay generator.every=500", "algo=mobile generator=none")])
def test_bad_overrides_give_one_error_line_from_a_new_process(tmp_path, override, message):
    """Some of `BAD_OVERRIDES` as a user runs them, ``python examples/train.py ...``: what the process itself
    prints (no warning from an import beside the line) and its exit status."""
    result = run("train.py", *override.split(), f"trainer.run_dir={tmp_path / 'run'}", tmp_path=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def finished_run(folder: Path) -> dict:
    """A run folder as a finished run leaves it (run.json, metrics.jsonl, checkpoint.pt, tensorboard/):
    ``{relative path: bytes}`` of every file in it."""
    (folder / "tensorboard").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"algorithm": "td3bc", "dataset": "bundled:pendulum-medium"}))
    (folder / "metrics.jsonl").write_text('{"epoch": 1, "score": 12.5}\n{"epoch": 2, "score": 20.0}\n')
    (folder / "checkpoint.pt").write_bytes(b"weights of two epochs of training")
    (folder / "tensorboard" / "events.out.tfevents.1").write_bytes(b"scalars")
    return snapshot(folder)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("value", ["no", "1", "'False'"])
def test_a_value_that_is_not_true_or_false_never_deletes_a_finished_run(tmp_path, value):
    """``overwrite=no`` used to read 'no' as true: it deleted the run and trained again."""
    folder = tmp_path / "run"
    before = finished_run(folder)
    result = run("train.py", "algo=td3bc", "algo.hidden_size=16", *RUN_TINY, f"overwrite={value}",
                 f"trainer.run_dir={folder}", tmp_path=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: overwrite = ") and "expected true or false (write overwrite=true or " \
        "overwrite=false)." in lines[0]
    assert snapshot(folder) == before


def test_evaluate_reports_a_missing_or_broken_checkpoint(tmp_path):
    missing = run("evaluate.py", f"checkpoint={tmp_path / 'nope.pt'}", tmp_path=tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"error: no checkpoint at {tmp_path / 'nope.pt'}; pass the checkpoint.pt of a run folder.")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    junk = run("evaluate.py", f"checkpoint={tmp_path / 'junk.pt'}", tmp_path=tmp_path)
    assert junk.returncode == 2 and len(junk.stderr.strip().splitlines()) == 1
    assert junk.stderr.startswith(f"error: {tmp_path / 'junk.pt'} is not a readable checkpoint")


SAC_TINY = ["algo.num_critics=2", "algo.hidden_size=16"]


@pytest.mark.parametrize("algo, extra, generator", [
    # the values of preset mopo-hopper-medium (a preset itself is refused on another env than its own)
    ("mopo", SAC_TINY + ROLLOUTS_TINY + ["generator.rollout.horizon=5", "generator.rollout.penalty_coef=5.0"], "rollouts"),
    ("mobile", SAC_TINY + ROLLOUTS_TINY + ["algo.target_floor=null"], "rollouts"),
    ("coplanner", SAC_TINY + ROLLOUTS_TINY + ["generator.rollout.upmpc.candidates=2", "generator.rollout.upmpc.horizon=2"],
     "rollouts"),
    ("ravl", SAC_TINY + ROLLOUTS_TINY + ["generator.true_dynamics=true", "generator.rollout.planner=upmpc"], "rollouts"),
    ("ravl", SAC_TINY + ["generator=none"], "none"),  # RAVL's learner on the dataset alone
    ("td3bc", ["algo.hidden_size=16"], "none"),
    ("iql", ["algo.hidden_size=16", "generator=rollouts"] + ROLLOUTS_TINY, "rollouts"),  # any generator with any agent
    ("td3bc", ["algo.hidden_size=16", "generator=ravl"] + ROLLOUTS_TINY, "rollouts"),  # another algorithm's generator
])
def test_every_algo_trains_and_evaluates_from_the_command_line(tmp_path, algo, extra, generator, device):
    result = run("train.py", f"algo={algo}", *RUN_TINY, *extra, f"device={device}", f"trainer.run_dir={tmp_path / 'run'}",
                 tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"generator {generator};" in result.stdout and "final normalised score" in result.stdout
    run_info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (run_info["generator"] or {"kind": "none"})["kind"] == generator
    evaluated = run("evaluate.py", f"checkpoint={tmp_path / 'run' / 'checkpoint.pt'}", "episodes=1", tmp_path=tmp_path)
    assert evaluated.returncode == 0 and f"{algo} on Pendulum-v1, epoch 2" in evaluated.stdout, evaluated.stderr


def test_budgets_set_each_run_what_fits_it_and_the_command_line_wins():
    """``budget.when``: the quick budget's rollout settings reach runs with a rollout generator only,
    its update count the model-free agents only; an explicit setting beats the budget's."""
    from mbrl_offline.cli import resolve_train_config
    from mbrl_offline.config_files import compose

    def parts(*overrides):
        _, _, generator, trainer, _ = resolve_train_config(compose(CONFIG_DIR, "train", list(overrides)))
        return generator, trainer

    generator, trainer = parts("algo=ravl", "budget=quick")
    assert (generator.every, generator.rollout.rollouts_per_epoch, generator.dynamics.max_epochs) == (250, 5000, 20)
    assert (trainer.epochs, trainer.updates_per_epoch) == (20, 250)
    generator, trainer = parts("algo=td3bc", "budget=quick")
    assert generator.kind == "none" and (trainer.epochs, trainer.updates_per_epoch) == (40, 1000)
    generator, trainer = parts("algo=iql", "generator=rollouts", "budget=quick")
    assert (generator.every, generator.rollout.rollouts_per_epoch, trainer.epochs) == (250, 5000, 40)
    generator, trainer = parts("algo=ravl", "budget=quick", "generator.every=7", "trainer.epochs=3")
    assert (generator.every, trainer.epochs) == (7, 3)
    generator, trainer = parts("algo=td3bc")  # the paper budget: 1M updates for TD3+BC, 3M for RAVL
    assert trainer.epochs * trainer.updates_per_epoch == 1_000_000
    generator, trainer = parts("algo=ravl")
    assert trainer.epochs * trainer.updates_per_epoch == 3_000_000 and generator.every == 1000


def test_a_budget_condition_without_a_value_is_refused_in_one_line():
    from omegaconf import OmegaConf

    from mbrl_offline.config_files import budget_overrides
    from mbrl_offline.errors import ConfigError

    cfg = OmegaConf.create({"algo": {"name": "td3bc"}, "budget": {"when": {"algo.name": {"trainer": {"epochs": 3}}}}})
    with pytest.raises(ConfigError, match=r"budget.when key 'algo.name' must read '<setting>=<value>'"):
        budget_overrides(cfg)
    cfg.budget.when = {"algo.name=td3bc": {"trainer": {"epochs": 3}}, "algo.name=iql": {"trainer": {"epochs": 4}}}
    assert budget_overrides(cfg) == ["trainer.epochs=3"]
