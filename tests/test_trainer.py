"""The shared trainer: exact resume, checkpoints, the divergence guard and logs."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset, mkl_avx512
from mbrl_offline.algorithms import RAVLConfig, load_policy
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.checkpoint import read_checkpoint
from mbrl_offline.errors import CheckpointError, TrainingDiverged
from mbrl_offline.generators import RolloutConfig, RolloutGeneratorConfig
from mbrl_offline.logging import read_metrics
from mbrl_offline.models.dynamics import DynamicsConfig
from mbrl_offline.trainer import TrainerConfig
from mbrl_offline.utils import atomic_torch_save

TINY = RAVLConfig(num_critics=3, hidden_size=16, hidden_layers=2, batch_size=32)
TINY_ROLLOUTS = RolloutGeneratorConfig(
    every=10, rollout=RolloutConfig(horizon=2, rollouts_per_epoch=64, retain_epochs=2),
    dynamics=DynamicsConfig(ensemble_size=3, num_elites=2, hidden_size=16, hidden_layers=2,
                            weight_decay=(0.0, 0.0, 0.0), max_epochs=2),
    mixing=MixingConfig(real_ratio=0.05))


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(2000))


def make_trainer(data, run_dir, cache, epochs=4, config=TINY, device="cpu", generator=TINY_ROLLOUTS,
                 **trainer_settings):
    settings = dict(epochs=epochs, updates_per_epoch=10, eval_every=2, eval_episodes=1, checkpoint_every=1,
                    run_dir=str(run_dir), progress=False, tensorboard=False)
    return build_run("ravl", data, config, generator, TrainerConfig(**{**settings, **trainer_settings}), device,
                     cache_dir=cache)


def test_resumed_run_equals_an_uninterrupted_one(data, tmp_path, device):
    straight = make_trainer(data, tmp_path / "straight", tmp_path / "cache", device=device)
    straight.train()
    first = make_trainer(data, tmp_path / "resumed", tmp_path / "cache", epochs=2, device=device)  # "stops" here
    first.train()
    resumed = make_trainer(data, tmp_path / "resumed", tmp_path / "cache", epochs=4, device=device)
    summary = resumed.train(resume=True)
    assert summary["epochs"] == 4 and summary["evaluations"] == 2
    for a, b in zip(straight.agent.state_dict()["critic"].values(), resumed.agent.state_dict()["critic"].values()):
        assert torch.equal(a, b)
    for a, b in zip(straight.agent.actor.parameters(), resumed.agent.actor.parameters()):
        assert torch.equal(a, b)
    drop_speed = lambda records: [{k: v for k, v in r.items() if k != "speed"} for r in records]  # noqa: E731
    assert drop_speed(read_metrics(tmp_path / "straight")) == drop_speed(read_metrics(tmp_path / "resumed"))


def test_checkpoint_holds_a_policy_that_evaluates(data, tmp_path, device):
    """A checkpoint written on any device loads onto the CPU (the default) and acts as the trained agent."""
    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2, device=device)
    trainer.train()
    agent, state = load_policy(tmp_path / "run" / "checkpoint.pt")
    obs = torch.randn(5, 3).numpy()
    assert state["epoch"] == 2 and agent.device.type == "cpu" and state["generator_config"]["every"] == 10
    exact = device == "cpu"  # the same arithmetic; CUDA's kernels round differently
    np.testing.assert_allclose(agent.act(obs, deterministic=True), trainer.agent.act(obs, deterministic=True),
                               rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)


def test_a_finished_run_is_not_overwritten_and_resume_checks_settings(data, tmp_path):
    make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=1).train()
    before = (tmp_path / "run" / "checkpoint.pt").read_bytes()
    with pytest.raises(CheckpointError, match="already holds a run.*resume=true"):
        make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=1).train()
    other = RAVLConfig(**{**TINY.__dict__, "eta": 0.5})
    with pytest.raises(CheckpointError, match=r"other algorithm settings \(eta\)"):
        make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2, config=other).train(resume=True)
    with pytest.raises(CheckpointError, match=r"other generator settings \(every\)"):
        make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2,
                     generator=dataclasses.replace(TINY_ROLLOUTS, every=20)).train(resume=True)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        make_trainer(data, tmp_path / "empty", tmp_path / "cache").train(resume=True)
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == before


def test_divergence_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(data, tmp_path, monkeypatch):
    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=5)
    update, calls = trainer.agent.update, {"n": 0}

    def poisoned(batch):
        calls["n"] += 1
        metrics = update(batch)
        if calls["n"] > 25:  # from the third epoch on
            metrics["critic_loss"] = torch.tensor(float("nan"))
        return metrics

    monkeypatch.setattr(trainer.agent, "update", poisoned)
    with pytest.raises(TrainingDiverged, match="diverged in epoch 3: critic_loss = nan; the last good checkpoint"):
        trainer.train()
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["epoch"] == 2


def test_logs_and_callbacks(data, tmp_path):
    seen = []

    class Recorder:
        def on_eval(self, trainer, epoch, result):
            seen.append((epoch, result["normalized_score"]))

    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=3, tensorboard=True)
    trainer.callbacks.append(Recorder())
    trainer.train()
    records = read_metrics(tmp_path / "run")
    assert [r["epoch"] for r in records] == [1, 2, 3] and [e for e, _ in seen] == [2, 3]
    assert {"critic_loss", "q_mean", "alpha", "diversity_loss"} <= set(records[0]["train"])
    assert {"transitions", "mean_length"} <= set(records[0]["rollout"]) and "eval" in records[1]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    json.dumps(records)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["algorithm"] == "ravl" and info["mkl_avx512"] == mkl_avx512.status()


def test_a_checkpoint_of_the_first_format_is_read_with_its_generator_settings(data, tmp_path):
    """Format 1 (before generators were composed by configuration) kept the rollout, dynamics and
    real-ratio settings in the agent's config; reading moves them to the generator's, with the one
    generation per epoch those runs had, so such a run resumes and its policy loads."""
    make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=1).train()
    path = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    generator = state.pop("generator_config")
    state["agent"]["config"].update(rollout=generator["rollout"], dynamics=generator["dynamics"],
                                    true_dynamics=generator["true_dynamics"], real_ratio=generator["mixing"]["real_ratio"])
    state["format"] = 1
    atomic_torch_save(state, path)
    migrated = read_checkpoint(path)["generator_config"]
    assert migrated["mixing"] == {"rule": "fraction", "real_ratio": 0.05, "real_rows": 16}  # later settings: defaults
    assert {k: v for k, v in migrated.items() if k != "mixing"} == {k: v for k, v in generator.items() if k != "mixing"}
    load_policy(path)
    assert make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2).train(resume=True)["epochs"] == 2


def test_a_run_saved_before_settings_were_added_resumes_with_their_defaults(data, tmp_path):
    """Settings added since a checkpoint was written (here kappa, the rollout member rule, the
    dynamics activation and the agent's eta) take their defaults, so the run resumes; a changed
    setting is still refused."""
    make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=1).train()
    path = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    del state["generator_config"]["mixing"]["kappa"], state["generator_config"]["rollout"]["member"]
    del state["generator_config"]["dynamics"]["activation"], state["agent"]["config"]["eta"]
    atomic_torch_save(state, path)
    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2)
    trainer.train(resume=True)
    assert trainer.epoch == 2
    state = torch.load(path, weights_only=False)
    state["generator_config"]["rollout"]["member"] = "rollout"
    atomic_torch_save(state, path)
    with pytest.raises(CheckpointError, match=r"other generator settings \(rollout\)"):
        make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=3).train(resume=True)
