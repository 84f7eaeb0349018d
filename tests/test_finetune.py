"""Fine-tuning (`mbrl_offline.finetune`, ``mbrl-finetune``): a checkpoint's agent trains further on its data
with new rows appended, or on new data alone, with its generator's model refitted or kept; the run starts
from the checkpoint's weights, records where it came from, resumes exactly, and bad input is one line
with exit status 2 before anything is written."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Interrupt, StopAfterEpoch1

from mbrl_offline import build_run, load_dataset
from mbrl_offline.checkpoint import read_checkpoint
from mbrl_offline.compose import run_configs
from mbrl_offline.errors import CheckpointError, ConfigError
from mbrl_offline.finetune import build_finetune, concatenate
from mbrl_offline.logging import read_metrics
from mbrl_offline.trainer import TrainerConfig

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ["generator.rollout.rollouts_per_epoch=32", "generator.dynamics.hidden_size=16",
              "generator.dynamics.max_epochs=2", "generator.dynamics.min_epochs=0", "generator.every=5",
              "algo.hidden_size=16"]


def trainer_config(run_dir, epochs=1):
    return TrainerConfig(epochs=epochs, updates_per_epoch=5, eval_episodes=1, run_dir=str(run_dir), progress=False,
                         tensorboard=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny MOPO run on pendulum-random (a model-based agent: its generator's model can be refitted or kept)."""
    folder = tmp_path_factory.mktemp("base")
    algo, generator, _ = run_configs("mopo", "quick", env="pendulum", overrides=TINY_MODEL)
    build_run("mopo", load_dataset("pendulum-random"), algo, generator, trainer_config(folder / "run"),
              cache_dir=folder / "cache").train()
    return folder


def test_append_replace_refit_and_keep(trained, tmp_path):
    checkpoint, cache = trained / "run" / "checkpoint.pt", trained / "cache"
    state = read_checkpoint(checkpoint)
    models = {}
    for data, model in [("append", "refit"), ("replace", "refit"), ("replace", "keep")]:
        trainer = build_finetune(checkpoint, "pendulum-medium", data, model, {"run_dir": str(tmp_path / f"{data}-{model}")},
                                 cache_dir=cache)
        # the agent starts from the checkpoint's weights
        for key, value in trainer.agent.state_dict().items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, state["agent"][key]), key
        rows = {"append": 20000, "replace": 10000}[data]
        assert len(trainer.dataset) == rows and len(trainer.real) == rows
        models[data, model] = trainer._generator_model()
        trainer.train()
        info = json.loads((tmp_path / f"{data}-{model}" / "run.json").read_text())
        assert info["finetuned_from"] == {"checkpoint": str(checkpoint), "epoch": 1, "dataset": "pendulum-medium",
                                          "data": data, "model": model, "online": False, "penalty": "keep",
                                          "penalty_off": []}
        assert info["agent"] == json.loads((trained / "run" / "run.json").read_text())["agent"]
    assert info["dataset"] == "bundled:pendulum-medium"
    assert models["replace", "keep"] == state["generator"]["model"] != models["replace", "refit"]
    assert models["append", "refit"] not in (models["replace", "refit"], state["generator"]["model"])


def test_concatenate_keeps_every_episode_whole():
    first, second = load_dataset("pendulum-random"), load_dataset("pendulum-medium")
    joined = concatenate(first, second, "both")
    assert len(joined) == len(first) + len(second) and joined.num_episodes == first.num_episodes + second.num_episodes
    assert torch.equal(torch.as_tensor(joined.observations[len(first):]), torch.as_tensor(second.observations))


def test_a_stopped_finetuning_run_resumes_exactly(trained, tmp_path):
    checkpoint, cache = trained / "run" / "checkpoint.pt", trained / "cache"
    settings = lambda name: {"run_dir": str(tmp_path / name), "epochs": 2}  # noqa: E731
    with pytest.raises(Interrupt):
        build_finetune(checkpoint, "pendulum-medium", trainer_settings=settings("a"), cache_dir=cache,
                       callbacks=[StopAfterEpoch1()]).train()
    build_finetune(checkpoint, "pendulum-medium", trainer_settings=settings("a"), cache_dir=cache).train(resume=True)
    build_finetune(checkpoint, "pendulum-medium", trainer_settings=settings("b"), cache_dir=cache).train()
    drop_speed = lambda records: [{k: v for k, v in r.items() if k != "speed"} for r in records]  # noqa: E731
    assert drop_speed(read_metrics(tmp_path / "a")) == drop_speed(read_metrics(tmp_path / "b"))
    assert [r["epoch"] for r in read_metrics(tmp_path / "a")] == [1, 2]


def finetune(cwd, *settings):
    return subprocess.run([sys.executable, str(ROOT / "examples" / "finetune.py"), "trainer.progress=false",
                           *settings], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "MBRL_OFFLINE_CACHE": str(cwd / "cache")})


def test_the_tool_writes_a_new_run_folder(trained, tmp_path):
    done = finetune(tmp_path, f"checkpoint={trained / 'run' / 'checkpoint.pt'}", "dataset=pendulum-medium",
                    "data=replace", "trainer.epochs=2", f"dynamics_cache={trained / 'cache'}")
    assert done.returncode == 0, done.stderr
    out = trained / "run-finetune"
    assert f"run folder {out}" in done.stdout and "final normalised score" in done.stdout
    assert [r["epoch"] for r in read_metrics(out)] == [1, 2]
    assert json.loads((out / "run.json").read_text())["trainer"]["updates_per_epoch"] == 5  # the checkpoint's
    again = finetune(tmp_path, f"checkpoint={trained / 'run' / 'checkpoint.pt'}", "dataset=pendulum-medium")
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_a_grid_of_fine_tuning_runs_through_hydra_s_launcher(trained, tmp_path):
    """``-m``: every run composed and checked first (two runs into one folder are refused before any starts),
    then each run in its own folder."""
    checkpoint = f"checkpoint={trained / 'run' / 'checkpoint.pt'}"
    cache = f"dynamics_cache={trained / 'cache'}"
    same = finetune(tmp_path, "-m", checkpoint, cache, "trainer.seed=0,1", f"trainer.run_dir={tmp_path / 'one'}")
    assert same.returncode == 2 and "would both write" in same.stderr and not (tmp_path / "one").exists(), same.stderr
    done = finetune(tmp_path, "-m", checkpoint, cache, "trainer.seed=0,1", "penalty=keep,off",
                    f"trainer.run_dir={tmp_path}/ft-${{trainer.seed}}-${{penalty}}")
    assert done.returncode == 0 and "4 of 4 runs finished" in done.stdout, done.stderr
    for seed in (0, 1):
        for penalty in ("keep", "off"):
            info = json.loads((tmp_path / f"ft-{seed}-{penalty}" / "run.json").read_text())
            assert info["seed"] == seed and info["finetuned_from"]["penalty"] == penalty
            assert info["generator"]["rollout"]["penalty_coef"] == (0 if penalty == "off" else 0.5)


@pytest.mark.parametrize("settings, message", [
    (["dataset=hopper-medium"], "dataset=hopper-medium is hopper's data (11 observation and 3 action columns), but "),
    (["dataset=pendulum-medium", "data=merge"], "data=merge: the data rules are append"),
    (["model=freeze"], "model=freeze: the model rules are refit"),
    (["penalty=none"], "penalty=none: the penalty rules are keep"),
    (["data=replace"], "data=replace needs the new data: dataset=<"),
    (["checkpoint=nowhere.pt"], "checkpoint=nowhere.pt: no such file"),
    (["trainer.run_dir=RUN"], "is the checkpoint's own run; fine-tuning writes a new run folder"),
    (["trainer.epochs=0"], "trainer.epochs"),
])
def test_bad_input_is_one_line_before_anything_is_written(trained, tmp_path, settings, message):
    checkpoint = trained / "run" / "checkpoint.pt"
    settings = [s.replace("RUN", str(trained / "run")) for s in settings]
    if not any(s.startswith("checkpoint=") for s in settings):
        settings.append(f"checkpoint={checkpoint}")
    if not any(s.startswith("trainer.run_dir=") for s in settings):
        settings.append(f"trainer.run_dir={tmp_path / 'out'}")
    done = finetune(tmp_path, *settings)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_the_tool_takes_every_trainer_setting():
    """finetune.yaml's trainer node names every TrainerConfig field (null: the checkpoint's), except the
    nested CDSA settings (the checkpoint's) and the tracker (logger=NAME); its online section names every
    OnlineConfig field but enabled (online=true)."""
    import dataclasses

    import yaml

    from mbrl_offline.config import CONFIG_DIR
    from mbrl_offline.online import OnlineConfig

    node = yaml.safe_load((Path(CONFIG_DIR) / "finetune.yaml").read_text())["trainer"]
    assert set(node) == {f.name for f in dataclasses.fields(TrainerConfig)} - {"cdsa", "logger"}
    online = node.pop("online")
    assert set(online) == {f.name for f in dataclasses.fields(OnlineConfig)} - {"enabled"}
    assert all(value is None for value in [*node.values(), *online.values()])


def test_penalty_off_turns_the_agent_s_and_the_generator_s_conservatism_off(trained, tmp_path):
    """MOPO's penalty is its generator's (the tool), CQL's its own (Python); the agent keeps its weights, and a
    resume must turn it off again."""
    done = finetune(tmp_path, f"checkpoint={trained / 'run' / 'checkpoint.pt'}", "penalty=off",
                    f"trainer.run_dir={tmp_path / 'mopo'}", f"dynamics_cache={trained / 'cache'}")
    assert done.returncode == 0, done.stderr
    assert "penalty off: generator.rollout.penalty, generator.rollout.penalty_coef" in done.stdout
    info = json.loads((tmp_path / "mopo" / "run.json").read_text())
    assert info["generator"]["rollout"]["penalty_coef"] == 0 and info["generator"]["rollout"]["penalty"] == "none"
    assert info["finetuned_from"]["penalty"] == "off"
    assert info["agent"] == json.loads((trained / "run" / "run.json").read_text())["agent"]  # MOPO's learner: none

    torch.manual_seed(0)
    algo, _, _ = run_configs("cql", "quick", env="pendulum", overrides=["algo.hidden_size=16", "algo.batch_size=32"])
    assert algo.cql_weight > 0
    build_run("cql", load_dataset("pendulum-random"), algo, "none", trainer_config(tmp_path / "cql")).train()
    state = read_checkpoint(tmp_path / "cql" / "checkpoint.pt")
    settings = {"run_dir": str(tmp_path / "cql-off"), "epochs": 2}
    tuned = build_finetune(tmp_path / "cql" / "checkpoint.pt", trainer_settings=settings, penalty="off")
    assert tuned.agent.config.cql_weight == 0 and not tuned.agent.config.with_lagrange
    assert tuned.origin["finetuned_from"]["penalty_off"] == ["algo.cql_weight"]
    for key, value in tuned.agent.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, state["agent"][key]), key
    tuned.callbacks = [StopAfterEpoch1()]
    with pytest.raises(Interrupt):
        tuned.train()
    kept = build_finetune(tmp_path / "cql" / "checkpoint.pt", trainer_settings=settings)
    with pytest.raises(CheckpointError, match=r"was trained with other algorithm settings \(cql_weight\)"):
        kept.train(resume=True)
    build_finetune(tmp_path / "cql" / "checkpoint.pt", trainer_settings=settings, penalty="off").train(resume=True)


def test_python_refusals_name_the_fix(trained):
    with pytest.raises(ConfigError, match="data=replace needs the new data"):
        build_finetune(trained / "run" / "checkpoint.pt", data="replace")


# ------------------------------------------------------------------------------- sweeps over fine-tuning
def sweep(cwd, *settings):
    return subprocess.run([sys.executable, str(ROOT / "examples" / "sweep.py"), "trainer.progress=false",
                           "trainer.tensorboard=false", "torch_threads=1", *settings],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.extended
def test_a_sweep_over_online_fine_tuning_settings(trained, tmp_path):
    """``mbrl-sweep checkpoint=...``: every trial is a fine-tuning run of the checkpoint with the trial's
    settings (a grid over MOPO's penalty and its model's refit interval), reported like any sweep; the
    study keeps its checkpoint."""
    checkpoint = trained / "run" / "checkpoint.pt"
    common = [f"checkpoint={checkpoint}", "online=true", f"dynamics_cache={trained / 'cache'}", "trainer.epochs=1",
              "trainer.updates_per_epoch=260", "trainer.eval_episodes=1", "sweep.pruner.name=none"]
    done = sweep(tmp_path, *common, "sweep=finetune-mbpo", "sweep.n_trials=6")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "sweeps" / "run-finetune"  # the checkpoint's run folder's name
    assert f"study 'run-finetune' in sweeps/run-finetune: 6 trials" in done.stdout
    from mbrl_offline.tune import load_sweep

    study, _ = load_sweep(folder)
    seen = set()
    for trial in study.get_trials():
        assert trial.state.name == "COMPLETE"
        info = json.loads((folder / trial.user_attrs["trial_dir"] / "seed-0" / "run.json").read_text())
        penalty, refit_every = trial.params["penalty"], trial.params["trainer.online.refit_every"]
        seen.add((penalty, refit_every))
        assert info["finetuned_from"]["checkpoint"] == str(checkpoint) and info["finetuned_from"]["online"]
        assert info["finetuned_from"]["penalty"] == penalty and info["trainer"]["online"]["refit_every"] == refit_every
        assert (info["generator"]["rollout"]["penalty_coef"] == 0) == (penalty == "off")
        refits = [m.get("refit", {}).get("refits") for m in read_metrics(folder / trial.user_attrs["trial_dir"] / "seed-0")]
        assert refits[-1] == (1 if refit_every == 250 else None)  # 260 env steps: one refit at 250, none at 1000
    assert seen == {(p, r) for p in ("keep", "off") for r in (None, 250, 1000)}  # the grid, each point once
    report = subprocess.run([sys.executable, str(ROOT / "examples" / "report.py"), str(folder), "--out", str(tmp_path / "report")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert report.returncode == 0 and "Sweep `run-finetune`" in (tmp_path / "report" / "report.md").read_text(), report.stderr
    # the same study with another checkpoint is refused
    other = tmp_path / "other" / "checkpoint.pt"
    other.parent.mkdir()
    other.write_bytes(checkpoint.read_bytes())
    again = sweep(tmp_path, *[s.replace(str(checkpoint), str(other)) for s in common], "sweep=finetune-mbpo",
                  f"sweep.dir={folder}", "sweep.study_name=run-finetune")
    assert again.returncode == 2 and "was started with another checkpoint" in again.stderr, again.stderr


@pytest.mark.parametrize("settings, message", [
    (["online=true", "sweep=finetune-penalty", "TD3BC"], "penalty=off turns nothing off for this checkpoint's agent"),
    (["sweep=finetune"], "trainer.online.offline_ratio acts only online; add online=true"),
    (["online=true", "sweep=mopo"], "that search space is for training runs"),
    (["online=true", "sweep=finetune-mbpo", "TD3BC"], "refits the generator's model, and this run has no generator"),
    (["online=true", "trainer.epochs=0"], "trainer.epochs"),
    (["online=true", "checkpoint=nowhere.pt"], "checkpoint=nowhere.pt: no such file"),
])
def test_a_fine_tuning_sweep_checks_its_space_before_any_trial(trained, tmp_path, settings, message):
    checkpoint = trained / "run" / "checkpoint.pt"
    if "TD3BC" in settings:  # a model-free agent without a penalty to turn off
        settings.remove("TD3BC")
        torch.manual_seed(0)
        algo, _, _ = run_configs("td3bc", "quick", env="pendulum", overrides=["algo.hidden_size=16"])
        build_run("td3bc", load_dataset("pendulum-random"), algo, "none", trainer_config(tmp_path / "td3bc")).train()
        checkpoint = tmp_path / "td3bc" / "checkpoint.pt"
    if not any(s.startswith("checkpoint=") for s in settings):
        settings.append(f"checkpoint={checkpoint}")
    done = sweep(tmp_path, f"sweep.dir={tmp_path / 'out'}", *settings)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()
    training = sweep(tmp_path, "algo=td3bc", "env=pendulum", "sweep=finetune", f"sweep.dir={tmp_path / 'out'}")
    assert training.returncode == 2 and "that search space is for fine-tuning runs" in training.stderr
