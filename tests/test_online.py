"""Online interaction during training (`mbrl_offline.online`, ``trainer.online``; ``mbrl-finetune ...
online=true``): the agent's steps in the real env go to the real buffer after the offline rows, explored
by sampling or by noise on a deterministic policy, drawn pooled or at an offline ratio; episodes start at
each epoch and are cut at its end; a stopped run resumes exactly; what cannot run online is refused in
one line."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.compose import run_configs
from mbrl_offline.errors import CheckpointError, ConfigError
from mbrl_offline.logging import read_metrics
from mbrl_offline.online import MixedRealBuffer, OnlineConfig
from mbrl_offline.trainer import TrainerConfig


def config(run_dir, epochs=2, updates=60, **online):
    return TrainerConfig(epochs=epochs, updates_per_epoch=updates, eval_episodes=1, run_dir=str(run_dir),
                         progress=False, tensorboard=False, online=OnlineConfig(enabled=True, **online))


def small(algo):
    agent, _, _ = run_configs(algo, "quick", env="pendulum", overrides=[
        "algo.hidden_size=16", "algo.batch_size=32"])
    return agent


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-random")


def test_online_rows_follow_the_offline_ones_with_terminals_timeouts_and_records(data, tmp_path):
    torch.manual_seed(0)
    trainer = build_run("td3bc", data, small("td3bc"), "none", config(tmp_path / "run", updates=250, steps_per_update=2))
    n = len(data)
    assert trainer.real.capacity == n + 2 * 2 * 250
    trainer.train()
    assert len(trainer.real) == n + 1000
    for key in ("observations", "actions", "rewards"):  # the offline rows are untouched
        assert torch.equal(trainer.real.data[key][:n], torch.as_tensor(getattr(data, key)))
    online = {k: v[n:].cpu().numpy() for k, v in trainer.real.data.items()}
    # pendulum's episodes end by its 200-step time limit (timeouts, never terminals); each epoch of 500 steps
    # starts a fresh episode and cuts the third at its end (a timeout after 100 steps)
    assert not online["terminals"].any()
    assert np.flatnonzero(online["timeouts"]).tolist() == [199, 399, 499, 699, 899, 999]
    # consecutive rows chain within an episode
    inside = ~online["timeouts"][:-1]
    assert np.allclose(online["next_observations"][:-1][inside], online["observations"][1:][inside])
    records = read_metrics(tmp_path / "run")
    assert [r["online"]["env_steps"] for r in records] == [500, 1000]
    assert [r["online"]["episodes"] for r in records] == [2, 4] and records[0]["online"]["episodes_in_epoch"] == 2
    returns = online["rewards"][:200].sum(), online["rewards"][200:400].sum()
    assert math.isclose(records[0]["online"]["return_mean"], float(np.mean(returns)), rel_tol=1e-5)
    assert records[0]["speed"]["env_steps_per_s"] > 0
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["trainer"]["online"] == {"enabled": True, "steps_per_update": 2, "exploration_noise": 0.1,
                                         "offline_ratio": None, "max_episode_steps": None}


def test_a_deterministic_policy_explores_with_noise_and_a_stochastic_one_samples(data, tmp_path):
    torch.manual_seed(0)
    for algo, deterministic in (("td3bc", True), ("iql", False), ("iql-deterministic", True)):
        settings = small(algo.split("-")[0])
        if algo == "iql-deterministic":
            settings = dataclasses.replace(settings, deterministic_actor=True)
        trainer = build_run(algo.split("-")[0], data, settings, "none",
                            config(tmp_path / algo, epochs=1, exploration_noise=0.3))
        interaction = trainer.online
        assert interaction.deterministic_policy is deterministic
        interaction.start_epoch(0)
        obs = interaction.obs
        mode = trainer.agent.act(obs, deterministic=True)
        actions = np.stack([interaction.action() for _ in range(400)])
        assert np.all(actions >= interaction.low) and np.all(actions <= interaction.high)
        spread = actions.std(axis=0)
        if deterministic:  # the action plus N(0, 0.3 * half range), clipped: pendulum's range is [-2, 2]
            inside = np.abs(actions - mode) < 1.9 - np.abs(mode)
            assert 0.5 < spread[0] < 0.7 and abs(actions.mean(axis=0)[0] - mode[0]) < 0.1 and inside.mean() > 0.9
        else:
            assert spread[0] > 0.01


def test_an_offline_ratio_draws_that_share_from_the_offline_rows(data, tmp_path):
    torch.manual_seed(0)
    trainer = build_run("td3bc", data, small("td3bc"), "none", config(tmp_path / "run", epochs=1, offline_ratio=0.25))
    real = trainer.real
    assert isinstance(real, MixedRealBuffer) and real.offline == len(data)
    rng = torch.Generator().manual_seed(0)
    before = real.sample(400, rng)  # no online rows yet: all offline
    assert len(before["rewards"]) == 400
    trainer.train()
    batch = real.sample(400, rng)
    offline_rows = torch.isin(batch["observations"][:, 0], torch.as_tensor(data.observations[:, 0]))
    assert offline_rows[:100].all() and offline_rows.sum() < 110  # 100 offline rows first, the rest online
    pooled = build_run("td3bc", data, small("td3bc"), "none", config(tmp_path / "pooled", epochs=1))
    assert type(pooled.real).__name__ == "TransitionBuffer"


class Stop(Exception):
    pass


class StopAfterEpoch1:
    def on_eval(self, trainer, epoch, result):
        if epoch == 1:
            raise Stop


def test_a_stopped_online_run_resumes_exactly(data, tmp_path):
    def run(name, callbacks=None, resume=False):
        torch.manual_seed(0)
        trainer = build_run("iql", data, small("iql"), "none", config(tmp_path / name, updates=150))
        trainer.callbacks = list(callbacks or [])
        trainer.train(resume=resume)
        return trainer

    with pytest.raises(Stop):
        run("a", [StopAfterEpoch1()])
    resumed = run("a", resume=True)
    straight = run("b")
    drop_speed = lambda records: [{k: v for k, v in r.items() if k != "speed"} for r in records]  # noqa: E731
    assert drop_speed(read_metrics(tmp_path / "a")) == drop_speed(read_metrics(tmp_path / "b"))
    for key in resumed.real.data:
        assert torch.equal(resumed.real.data[key], straight.real.data[key]), key
    offline = build_run("iql", data, small("iql"), "none", TrainerConfig(
        epochs=2, updates_per_epoch=150, eval_episodes=1, run_dir=str(tmp_path / "a"), progress=False, tensorboard=False))
    with pytest.raises(CheckpointError, match="was trained with online interaction; resume with the same trainer.online"):
        offline.train(resume=True)


def test_what_cannot_run_online_is_refused_in_one_line(data, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="neubay learns from whole episodes, and online interaction supports agents "
                                          "of transitions only"):
        agent, generator, _ = run_configs("neubay", "quick", env="pendulum")
        build_run("neubay", data, agent, "none", config(tmp_path / "n"))
    from mbrl_offline.algorithms.td3bc import TD3BC
    from mbrl_offline.data.envs import EnvInfo
    from mbrl_offline.trainer import Trainer

    def no_simulator(self, **kwargs):
        raise ImportError("MuJoCo is not installed")

    agent = TD3BC.for_dataset(data, small("td3bc"))
    monkeypatch.setattr(EnvInfo, "make", no_simulator)
    with pytest.raises(ConfigError, match=r"needs the pendulum env \(Pendulum-v1\), which cannot be simulated here "
                                          r"\(ImportError: MuJoCo is not installed\); install"):
        Trainer(agent, data, config(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    # decided by the settings: refused before a model is fitted (build_run, build_finetune, Trainer)
    agent, generator, _ = run_configs("mopo", "quick", env="pendulum", overrides=["generator.mixing.rule=weights"])
    monkeypatch.setattr("mbrl_offline.compose.build_generator", lambda *args: pytest.fail("a model was fitted"))
    with pytest.raises(ConfigError, match="offline_ratio sets the share of offline rows .*rule=weights draws"):
        build_run("mopo", data, agent, generator, config(tmp_path / "w", offline_ratio=0.5))
    for bad, message in [({"steps_per_update": 0}, "steps_per_update"), ({"offline_ratio": 1.5}, "offline_ratio"),
                         ({"exploration_noise": -0.1}, "exploration_noise")]:
        with pytest.raises(ConfigError, match=message):
            OnlineConfig(enabled=True, **bad)


def test_the_contract_takes_deterministic_policy_as_a_flag_or_a_property():
    from mbrl_offline.algorithms.iql import IQL
    from mbrl_offline.algorithms.td3bc import TD3BC
    from mbrl_offline.registry import check_agent_class

    check_agent_class(TD3BC)
    check_agent_class(IQL)  # a property: the settings decide
    bad = type("Bad", (TD3BC,), {"name": "bad", "deterministic_policy": "yes"})
    with pytest.raises(ConfigError, match="deterministic_policy must be True or False"):
        check_agent_class(bad)
