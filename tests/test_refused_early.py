"""Mistakes refused in one line before any work: every check the settings alone decide runs before a
model is fitted or a file written (`mbrl_offline.compose.check_pair`, used by the command line and
`build_run`, and a generator config's own checks, `mbrl_offline.roles.GeneratorConfig`), and the other inputs that
ended in tracebacks (a tiny dataset, a run folder under /proc, a journal storage below a file, a
damaged checkpoint, a checkpoint of another version) are one library error naming the problem."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.algorithms import TD3BC, TD3BCConfig, load_policy
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.cli import resolve_train_config
from mbrl_offline.config_files import compose
from mbrl_offline.config import CONFIG_DIR, check_writable_dir
from mbrl_offline.errors import CheckpointError, ConfigError, DatasetError
from mbrl_offline.generators import PosteriorConfig, PosteriorGeneratorConfig, RolloutGeneratorConfig
from mbrl_offline.models.dynamics import DynamicsConfig
from mbrl_offline.trainer import Trainer, TrainerConfig
from mbrl_offline.utils import atomic_torch_save

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR
SMALL_DYNAMICS = DynamicsConfig(ensemble_size=2, num_elites=2, hidden_size=8, batch_size=32,
                                max_epochs=1)
POSTERIOR_DYNAMICS = replace(SMALL_DYNAMICS, record_uncertainty=True)  # as the posterior needs


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(400))


def trainer_config(run_dir, **settings) -> TrainerConfig:
    return TrainerConfig(**{**dict(epochs=1, updates_per_epoch=2, eval_episodes=1, progress=False, tensorboard=False,
                                   run_dir=str(run_dir)), **settings})


# (algorithm, a function making the generator config, the command line's overrides, the refusal); a
# generator config's own checks (a mixing setting its rule does not read) refuse it when it is made
SETTINGS_MISTAKES = {
    "tape mixing for a transition agent": (
        "td3bc", lambda: RolloutGeneratorConfig(dynamics=SMALL_DYNAMICS, mixing=MixingConfig(rule="tape")),
        ["algo=td3bc", "generator=rollouts", "generator.mixing.rule=tape"], "draws tapes of episodes"),
    "more real rows than the batch": (
        "ravl", lambda: RolloutGeneratorConfig(dynamics=SMALL_DYNAMICS, mixing=MixingConfig(rule="counts", real_rows=100_000)),
        ["algo=ravl", "generator.mixing.rule=counts", "generator.mixing.real_rows=100000"],
        "mixing.real_rows = 100000 is more than the batch of 256"),
    "posterior rollouts not a multiple of the elites": (
        "neubay", lambda: PosteriorGeneratorConfig(dynamics=POSTERIOR_DYNAMICS, posterior=PosteriorConfig(parallel=7)),
        ["algo=neubay", "generator.posterior.parallel=7"], r"posterior.parallel \(7\) must be a multiple"),
    "a posterior ensemble that records no uncertainty": (
        "neubay", lambda: PosteriorGeneratorConfig(dynamics=replace(POSTERIOR_DYNAMICS, record_uncertainty=False)),
        ["algo=neubay", "generator.dynamics.record_uncertainty=false"], "needs generator.dynamics.record_uncertainty=true"),
    "deterministic posterior actions for NEUBAY": (
        "neubay", lambda: PosteriorGeneratorConfig(dynamics=POSTERIOR_DYNAMICS,
                                           posterior=PosteriorConfig(parallel=4, deterministic_actions=True)),
        ["algo=neubay", "generator.posterior.deterministic_actions=true"], "posterior.deterministic_actions=true needs"),
    "a mixing setting the rule does not read (the fraction's share under the tape rule)": (
        "neubay", lambda: PosteriorGeneratorConfig(dynamics=POSTERIOR_DYNAMICS, mixing=MixingConfig(rule="tape", real_ratio=0.5)),
        ["algo=neubay", "generator.mixing.real_ratio=0.5"],
        r"generator.mixing.real_ratio = 0.5 has no effect with generator.mixing.rule=tape \(only the fraction rule"),
    "a mixing setting the rule does not read (kappa under the fraction rule)": (
        "ravl", lambda: RolloutGeneratorConfig(dynamics=SMALL_DYNAMICS, mixing=MixingConfig(kappa=0.5)),
        ["algo=ravl", "generator.mixing.kappa=0.5"],
        r"generator.mixing.kappa = 0.5 has no effect with generator.mixing.rule=fraction \(only the weights and tape"),
}


@pytest.mark.parametrize("case", SETTINGS_MISTAKES)
def test_a_settings_mistake_is_refused_by_the_command_lines_checks(case, tmp_path):
    """`resolve_train_config` is what train.py runs before it loads data: the mistake is refused there."""
    _, _, overrides, message = SETTINGS_MISTAKES[case]
    cfg = compose(CONFIGS, "train", ["env=pendulum", f"trainer.run_dir={tmp_path / 'run'}", *overrides])
    with pytest.raises(ConfigError, match=message):
        resolve_train_config(cfg)


@pytest.mark.parametrize("case", SETTINGS_MISTAKES)
def test_a_settings_mistake_is_refused_by_build_run_before_a_model_is_fitted(case, data, tmp_path):
    algo, generator, _, message = SETTINGS_MISTAKES[case]
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(ConfigError, match=message):
        build_run(algo, data, generator_config=generator(), trainer_config=trainer_config(tmp_path / "run"),
                  cache_dir=cache).train()
    assert list(cache.iterdir()) == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [
    ["algo=td3bc", "generator=synther", "generator.mixing.rule=weights"],  # SynthER's own real_ratio=0 stays unread
    ["algo=ravl", "generator.mixing.rule=counts", "generator.mixing.real_rows=32"],
    ["algo=neubay", "generator.mixing.kappa=0.5"],
])
def test_mixing_settings_the_rule_reads_or_the_generator_set_are_accepted(overrides, tmp_path):
    cfg = compose(CONFIGS, "train", ["env=pendulum", f"trainer.run_dir={tmp_path / 'run'}", *overrides])
    resolve_train_config(cfg)


def test_an_agent_for_another_env_is_refused_by_trainer_before_anything_is_written(data, tmp_path):
    hopper = load_dataset("hopper-medium").subset(range(10))
    agent = TD3BC.for_dataset(hopper, TD3BCConfig())
    with pytest.raises(ConfigError, match="the agent is for another env"):
        Trainer(agent, data, trainer_config(tmp_path / "run")).train()
    assert not (tmp_path / "run").exists()


def test_a_dataset_too_small_for_the_model_is_refused_naming_the_minimum(data, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError, match="has 3 transitions, too few to fit the dynamics model: .* needs at least 320"):
        build_run("ravl", data.subset(range(3)), trainer_config=trainer_config(tmp_path / "run"), cache_dir=cache)
    assert not cache.exists() and not (tmp_path / "run").exists()


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs a /proc file system")
def test_a_run_folder_under_proc_is_refused_before_any_work(tmp_path):
    cfg = compose(CONFIGS, "train", ["env=pendulum", "algo=td3bc", "generator=none", "trainer.run_dir=/proc/foo"])
    with pytest.raises(ConfigError, match="trainer.run_dir=/proc/foo: cannot make folders in /proc"):
        resolve_train_config(cfg)
    with pytest.raises(ConfigError, match="cannot make folders in /proc"):
        check_writable_dir("/proc/foo/bar", "trainer.run_dir")


def test_a_journal_storage_below_a_regular_file_is_one_line(tmp_path):
    import mbrl_offline.tune as tune

    open_storage = tune.open_storage
    check_storage = getattr(tune, "check_storage", None)
    (tmp_path / "file").write_text("")
    storage = str(tmp_path / "file" / "study.journal")
    with pytest.raises(ConfigError, match="is a file"):
        open_storage(storage, 60, lambda *args: None)
    with pytest.raises(ConfigError, match=f"the folder of sweep.storage={tmp_path / 'file'} is a file"):
        check_storage(storage)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A finished tiny run with a rollout generator: its checkpoint and what builds its trainer again."""
    folder = tmp_path_factory.mktemp("run")
    data = load_dataset("pendulum-medium").subset(range(400))
    generator = RolloutGeneratorConfig(dynamics=SMALL_DYNAMICS, every=2)
    generator = replace(generator, rollout=replace(generator.rollout, rollouts_per_epoch=8))

    def make(run_dir=folder / "run", epochs=1):
        return build_run("td3bc", data, TD3BCConfig(hidden_size=8), generator,
                         trainer_config(run_dir, epochs=epochs), cache_dir=folder / "cache")

    make().train()
    return folder / "run" / "checkpoint.pt", make


def test_resuming_a_checkpoint_without_its_generator_section_is_one_line(checkpoint, tmp_path):
    path, make = checkpoint
    state = torch.load(path, weights_only=True)
    del state["generator"]
    damaged = tmp_path / "run" / "checkpoint.pt"
    atomic_torch_save(state, damaged)
    with pytest.raises(CheckpointError, match=f"{damaged} has no 'generator' section; it is damaged or was edited"):
        make(tmp_path / "run", epochs=2).train(resume=True)


def test_a_checkpoint_of_another_version_names_the_file(checkpoint, tmp_path):
    path, make = checkpoint
    state = torch.load(path, weights_only=True)
    state["agent"]["config"]["actor_dropout"] = 0.1  # a setting of a newer version
    newer = tmp_path / "run" / "checkpoint.pt"
    atomic_torch_save(state, newer)
    for load in (lambda: load_policy(newer), lambda: make(tmp_path / "run", epochs=2).train(resume=True)):
        with pytest.raises(CheckpointError) as error:
            load()
        message = str(error.value)
        assert message.startswith(f"{newer} was written by another version of mbrl_offline") and \
            "algo.actor_dropout" in message and "\n" not in message, message
    assert np.isfinite(load_policy(path)[0].act(np.zeros(3, np.float32), True)).all()  # the intact one still loads


def test_a_run_that_fails_before_its_first_checkpoint_leaves_only_what_was_there(data, tmp_path, monkeypatch):
    """The trainer owns the run folder: what it made before the failure goes (run.json, metrics.jsonl,
    tensorboard/ and the folders), another file in the folder stays; after a checkpoint all is kept to resume."""
    def make(run_dir, **settings):
        return Trainer(TD3BC.for_dataset(data, TD3BCConfig(hidden_size=8)), data,
                       trainer_config(run_dir, tensorboard=True, **settings))

    def fails(*args, **kwargs):
        raise RuntimeError("a bug in epoch 1")

    trainer = make(tmp_path / "new" / "run")
    monkeypatch.setattr(trainer.agent, "update", fails)
    with pytest.raises(RuntimeError, match="a bug in epoch 1"):
        trainer.train()
    assert not (tmp_path / "new").exists()

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    trainer = make(tmp_path / "mine")
    monkeypatch.setattr(trainer.agent, "update", fails)
    with pytest.raises(RuntimeError):
        trainer.train()
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]

    trainer = make(tmp_path / "later", epochs=2)
    real_update, calls = trainer.agent.update, []

    def fails_in_epoch_2(batch):
        calls.append(1)
        if len(calls) > 2:
            fails()
        return real_update(batch)

    monkeypatch.setattr(trainer.agent, "update", fails_in_epoch_2)
    with pytest.raises(RuntimeError):
        trainer.train()
    assert sorted(p.name for p in (tmp_path / "later").iterdir()) == ["checkpoint.pt", "metrics.jsonl", "run.json",
                                                                      "tensorboard"]
