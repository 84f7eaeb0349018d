"""Online interaction during training (`mbrl_offline.online`, ``trainer.online``; ``mbrl-finetune ...
online=true``): the agent's steps in the real env go to the real buffer after the offline rows, explored
by sampling or by noise on a deterministic policy, drawn pooled or at an offline ratio; episodes start at
each epoch and are cut at its end; a stopped run resumes exactly; what cannot run online is refused in
one line."""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Interrupt, StopAfterEpoch1

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
                                         "offline_ratio": None, "max_episode_steps": None,
                                         "refit_every": None}


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


def stopped_resumed_and_straight(tmp_path, build):
    """Run ``build(run_dir)``'s trainer (torch seeded with 0) stopped after epoch 1 and resumed in folder
    ``a``, and straight through in ``b``; checks that both wrote the same records (but their speeds) and
    returns the resumed trainer, the straight one and the records."""
    def run(name, callbacks=(), resume=False):
        torch.manual_seed(0)
        trainer = build(tmp_path / name)
        trainer.callbacks = list(callbacks)
        trainer.train(resume=resume)
        return trainer

    with pytest.raises(Interrupt):
        run("a", [StopAfterEpoch1()])
    resumed, straight = run("a", resume=True), run("b")
    drop_speed = lambda records: [{k: v for k, v in r.items() if k != "speed"} for r in records]  # noqa: E731
    records = read_metrics(tmp_path / "b")
    assert drop_speed(read_metrics(tmp_path / "a")) == drop_speed(records)
    return resumed, straight, records


def test_a_stopped_online_run_resumes_exactly(data, tmp_path):
    resumed, straight, _ = stopped_resumed_and_straight(tmp_path, lambda run_dir: build_run(
        "iql", data, small("iql"), "none", config(run_dir, updates=150)))
    for key in resumed.real.data:
        assert torch.equal(resumed.real.data[key], straight.real.data[key]), key
    offline = build_run("iql", data, small("iql"), "none", TrainerConfig(
        epochs=2, updates_per_epoch=150, eval_episodes=1, run_dir=str(tmp_path / "a"), progress=False, tensorboard=False))
    with pytest.raises(CheckpointError, match="was trained with online interaction; resume with the same trainer.online"):
        offline.train(resume=True)


def test_what_cannot_run_online_is_refused_in_one_line(data, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="offline_ratio sets the share of offline rows in a batch of transitions, "
                                          "and neubay learns from tapes of whole episodes"):
        agent, generator, _ = run_configs("neubay", "quick", env="pendulum")
        build_run("neubay", data, agent, "none", config(tmp_path / "n", offline_ratio=0.5))
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


@pytest.mark.extended
def test_an_agent_of_sequences_acts_with_its_state_and_learns_from_the_online_episodes(data, tmp_path):
    """NEUBAY: its episode policy carries the recurrent state (and the previous action) through an online
    episode; each episode joins the buffer of whole real episodes when it ends or is cut; resume is exact."""
    agent, _, _ = run_configs("neubay", "quick", env="pendulum", overrides=[
        "algo.d_model=8", "algo.d_hidden=8", "algo.head_hidden=16", "algo.batch_size=64"])

    resumed, straight, _ = stopped_resumed_and_straight(tmp_path, lambda run_dir: build_run(
        "neubay", data, agent, "none", config(run_dir, epochs=3, updates=150)))
    # the 50 offline episodes of 200 rows, then one online episode of 150 rows per epoch (cut at its end)
    assert list(straight.real_sequences.episode_lengths) == [200] * 50 + [150] * 3
    n = len(data)
    for key, value in straight.real_sequences.data.items():
        assert torch.equal(value[n:n + 450], straight.real.data[key][n:n + 450]), key
        assert torch.equal(value, resumed.real_sequences.data[key]), key
    # the policy stepped the episode with its state: its previous action is the last one taken
    policy = straight.online.policy
    assert type(policy).__name__ == "RecurrentEpisodePolicy" and not policy.deterministic
    assert torch.equal(policy.previous_actions[0].cpu(), straight.real.data["actions"][n + 449].cpu())
    assert all(state.abs().sum() > 0 for state in policy.state)


def test_the_contract_takes_deterministic_policy_as_a_flag_or_a_property():
    from mbrl_offline.algorithms.iql import IQL
    from mbrl_offline.algorithms.td3bc import TD3BC
    from mbrl_offline.registry import check_agent_class

    check_agent_class(TD3BC)
    check_agent_class(IQL)  # a property: the settings decide
    bad = type("Bad", (TD3BC,), {"name": "bad", "deterministic_policy": "yes"})
    with pytest.raises(ConfigError, match="deterministic_policy must be True or False"):
        check_agent_class(bad)


def model_based(refit_every=None):
    """MOPO on a small model, a few short generations."""
    agent, generator, _ = run_configs("mopo", "quick", env="pendulum", overrides=[
        "algo.hidden_size=16", "algo.batch_size=32", "generator.every=50", "generator.rollout.rollouts_per_epoch=100",
        "generator.dynamics.ensemble_size=3", "generator.dynamics.num_elites=2", "generator.dynamics.hidden_size=32",
        "generator.dynamics.max_epochs=3", "generator.dynamics.min_epochs=3"])
    return agent, generator


def test_a_model_based_run_refits_its_model_every_n_env_steps_and_resumes_exactly(data, tmp_path):
    from mbrl_offline.checkpoint import model_fingerprint, read_checkpoint
    from mbrl_offline.finetune import build_finetune

    cache = tmp_path / "cache"

    resumed, straight, records = stopped_resumed_and_straight(tmp_path, lambda run_dir: build_run(
        "mopo", data, *model_based(), config(run_dir, epochs=3, updates=100, refit_every=70), cache_dir=cache))
    # the checkpoint holds the refits (the resumed run continued from the first epoch's, after env step 70)
    state = read_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert state["generator"]["state"]["refit"]["refits"] == 4
    # refits after env steps 70, 140, 210 and 280, each on every real row so far (an epoch records its last)
    assert [r["refit"]["refits"] for r in records] == [1, 2, 4]
    assert [r["refit"]["rows"] for r in records] == [len(data) + 70, len(data) + 140, len(data) + 280]
    assert all(1 <= r["refit"]["epochs"] <= 3 and r["refit"]["holdout_mse"] > 0 for r in records)
    model = straight.generator.dynamics
    for key, value in model.state_dict().items():
        assert torch.equal(value, resumed.generator.dynamics.state_dict()[key]), key
    # the model changed, its statistics are those of the offline and online rows, and the checkpoint still
    # knows the model the run was built with by its fingerprint (the cache's: a resume found it)
    fitted = build_run("mopo", data, *model_based(), config(tmp_path / "c", epochs=1, updates=10),
                       cache_dir=cache).generator.dynamics
    assert not torch.equal(fitted.input_mean, model.input_mean)
    rows = straight.real.data
    inputs = torch.cat([rows["observations"], rows["actions"]], dim=1)[:len(data) + 280]
    assert torch.allclose(model.input_mean, inputs.mean(0), atol=0.05 * float(inputs.std()))
    assert state["generator"]["model"] == model_fingerprint(fitted.state_dict())
    # model=keep fine-tunes with the model as the run ended, refits included
    kept = build_finetune(tmp_path / "b" / "checkpoint.pt", model="keep", cache_dir=cache,
                          trainer_settings={"run_dir": str(tmp_path / "f"), "epochs": 1, "progress": False})
    for key, value in model.state_dict().items():
        assert torch.equal(value, kept.generator.dynamics.state_dict()[key]), key


def test_a_refit_is_refused_where_there_is_no_model_to_refit(data, tmp_path):
    with pytest.raises(ConfigError, match="refit_every=100 refits the generator's model, and this run has no generator"):
        build_run("td3bc", data, small("td3bc"), "none", config(tmp_path / "t", refit_every=100))
    agent, generator, _ = run_configs("iql", "quick", env="pendulum", overrides=["generator=synther"])
    with pytest.raises(ConfigError, match="generator.kind=synther keeps the model it was built with"):
        build_run("iql", data, agent, generator, config(tmp_path / "s", refit_every=100))
    agent, generator = model_based()
    generator = dataclasses.replace(generator, true_dynamics=True)
    with pytest.raises(ConfigError, match="generator.true_dynamics=true rolls out in the simulator"):
        build_run("mopo", data, agent, generator, config(tmp_path / "m", refit_every=100))
    for name in "tsm":
        assert not (tmp_path / name).exists()


def online_fine_tuning_run(root, seed: int = 0, online: bool = True) -> tuple[float, float, list[float]]:
    """The learning case of online fine-tuning: EDAC (SAC-N with its diversity term: its sampled actions
    explore) trained for 500 updates on pendulum-medium at the learning tests' small scale (2 x 128 ... 3 x
    128 critics, gamma 0.95: tests/test_learning.py), then fine-tuned for 12 epochs of 500 updates, online
    with the defaults (one env step per update, offline and online rows pooled) or, with ``online``
    False, on the offline data alone. Returns the data's score, the base agent's and the fine-tuning's
    evaluations (every 2 epochs, 10 episodes). `benchmarks/online_finetune.py` runs it for any seeds."""
    from mbrl_offline.algorithms import EDAC
    from mbrl_offline.finetune import build_finetune
    from mbrl_offline.generators import NoGeneratorConfig

    root = Path(root)
    torch.manual_seed(seed)
    data = load_dataset("pendulum-medium")
    config = dataclasses.replace(EDAC.config_class(), hidden_size=128, gamma=0.95)
    base = build_run("edac", data, config, NoGeneratorConfig(), TrainerConfig(
        epochs=1, updates_per_epoch=500, eval_episodes=10, seed=seed, run_dir=str(root / "base"), progress=False,
        tensorboard=False))
    base.train()
    tuned = build_finetune(root / "base" / "checkpoint.pt", trainer_settings={
        "run_dir": str(root / "tuned"), "epochs": 12, "updates_per_epoch": 500, "eval_every": 2,
        "online": {"enabled": online}})
    tuned.train()
    return (data.summary()["normalized_score_mean"], base.history[-1]["normalized_score"],
            [h["normalized_score"] for h in tuned.history])


@pytest.mark.slow
@pytest.mark.extended
def test_online_fine_tuning_raises_a_weak_offline_agent(tmp_path):
    """`online_fine_tuning_run`, seed 0, online: the mean of the last three evaluations 40 points above the
    base agent and 20 above the data (docs/after-training.md has the seeds, and the same updates
    offline, from `python benchmarks/online_finetune.py`)."""
    data_score, before, scores = online_fine_tuning_run(tmp_path)
    final = sum(scores[-3:]) / 3
    assert final >= max(before + 40, data_score + 20), (f"online fine-tuning ended at {final:.1f} (evaluations "
                                                        f"{[round(s, 1) for s in scores]}); base {before:.1f}, "
                                                        f"data {data_score:.1f}")
    assert read_metrics(tmp_path / "tuned")[-1]["online"]["env_steps"] == 6000


def test_a_refit_of_a_standardised_model_keeps_the_statistics_it_was_built_with(data, tmp_path):
    """RAMBO's recipe (``standardise_observations``): the refit trains the inner model on the rows
    standardised with the offline data's statistics, which the wrapper keeps."""
    from mbrl_offline.generators import build_generator
    from mbrl_offline.generators.rollouts import StandardisedDynamics

    _, generator_config = model_based()
    generator_config = dataclasses.replace(generator_config, standardise_observations=True)
    torch.manual_seed(0)
    generator = build_generator(generator_config, data, "cpu", tmp_path / "cache", None, False)
    wrapper = generator.dynamics
    assert isinstance(wrapper, StandardisedDynamics)
    mean, std = wrapper.obs_mean.clone(), wrapper.obs_std.clone()
    shifted = dataclasses.replace(data, observations=data.observations + 1.0,
                                  next_observations=data.next_observations + 1.0)
    metrics = generator.refit(shifted)
    assert metrics["refits"] == 1 and metrics["rows"] == len(data)
    assert torch.equal(wrapper.obs_mean, mean) and torch.equal(wrapper.obs_std, std)
    # the inner model's input statistics are those of the shifted rows in the kept coordinates
    expected = torch.as_tensor((shifted.observations - mean.numpy()) / std.numpy()).mean(0)
    assert torch.allclose(wrapper.inner.input_mean[:3], expected, atol=0.05)
    assert not torch.allclose(wrapper.inner.input_mean[:3], torch.zeros(3), atol=0.1)
