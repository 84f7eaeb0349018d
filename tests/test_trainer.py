"""The shared trainer: exact resume, checkpoints, the divergence guard and logs."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset, platform
from mbrl_offline.algorithms import RAVLConfig, load_policy
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.checkpoint import read_checkpoint
from mbrl_offline.errors import CheckpointError, ConfigError, TrainingDiverged
from mbrl_offline.generators import NoGeneratorConfig, RolloutConfig, RolloutGeneratorConfig
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
    assert info["algorithm"] == "ravl" and info["mkl_avx512"] == platform.status()
    assert info["code"] == platform.code_version()  # the version and, in a git checkout, the commit that ran it


def test_code_version_names_this_checkouts_commit():
    """In a git checkout (an editable install, CI's clone) the commit is HEAD's and ``modified`` says whether
    tracked files differ from it; elsewhere both are None."""
    import subprocess
    from pathlib import Path

    import mbrl_offline

    root = Path(mbrl_offline.__file__).resolve().parent.parent
    code = platform.code_version()
    assert code["version"] == mbrl_offline.__version__
    if not (root / ".git").exists():
        assert code["commit"] is None and code["modified"] is None
        return
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert code["commit"] == head.strip() and len(code["commit"]) == 40
    assert isinstance(code["modified"], bool)


def test_the_final_evaluation_runs_its_own_number_of_episodes(data, tmp_path):
    """trainer.final_eval_episodes: the last epoch's evaluation (the final score) runs more episodes
    than the periodic ones; 0 keeps eval_episodes; a negative count is refused."""
    # no generator: build_run's None would be RAVL's published one, fitting its whole dynamics recipe first
    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=4, generator=NoGeneratorConfig(),
                           eval_episodes=1, final_eval_episodes=3)
    trainer.train()
    assert [len(h["returns"]) for h in trainer.history] == [1, 3]
    records = [r for r in read_metrics(tmp_path / "run") if "eval" in r]
    assert [r["epoch"] for r in records] == [2, 4]
    plain = make_trainer(data, tmp_path / "plain", tmp_path / "cache", epochs=2, generator=NoGeneratorConfig(),
                         eval_episodes=2)
    plain.train()
    assert [len(h["returns"]) for h in plain.history] == [2]
    with pytest.raises(ConfigError, match="trainer.final_eval_episodes"):
        TrainerConfig(final_eval_episodes=-1)


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
    assert {k: v for k, v in migrated.items() if k != "mixing"} == {k: generator[k] for k in migrated if k != "mixing"}
    # later settings: their defaults when the run is read (utd None; RAMBO's standardisation and adversarial training off)
    assert set(generator) - set(migrated) == {"utd", "standardise_observations", "observation_std_eps", "adversarial"}
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


# ------------------------------------------------------------------ sequences: UTD schedule, tapes, episode policies
from sequence_fakes import FakeRecurrent, FakeRecurrentConfig, FakeSequenceGenerator, FakeSequenceGeneratorConfig  # noqa: E402

from mbrl_offline.buffer import SequenceBuffer  # noqa: E402
from mbrl_offline.errors import ConfigError  # noqa: E402
from mbrl_offline.evaluation import evaluate_policy  # noqa: E402
from mbrl_offline.generators import NoGeneratorConfig  # noqa: E402
from mbrl_offline.trainer import Trainer  # noqa: E402


def sequence_trainer(data, run_dir, epochs=3, generator=FakeSequenceGeneratorConfig(), **settings):
    """A trainer of the fake recurrent agent with the fake sequence generator (None: generator=none),
    whose generations are recorded as (update count when called, transitions)."""
    torch.manual_seed(0)
    agent = FakeRecurrent.for_dataset(data, FakeRecurrentConfig())
    fake = FakeSequenceGenerator.for_dataset(generator, data) if generator is not None else None
    trainer = Trainer(agent, data, TrainerConfig(**{**dict(epochs=epochs, updates_per_epoch=10, eval_every=epochs,
                                                           eval_episodes=1, run_dir=str(run_dir), progress=False,
                                                           tensorboard=False), **settings}), fake)
    trainer.generated_at, trainer.tapes = [], []
    if fake is not None:
        generate = fake.generate

        def recorded(policy, real, rng=None):
            trainer.generated_at.append(agent.updates)
            return generate(policy, real, rng)
        fake.generate = recorded
    update = agent.update

    def recording(tape):
        trainer.tapes.append({k: v.clone() for k, v in tape.items()})
        return update(tape)
    agent.update = recording
    return trainer


def utd_steps(first_steps, transitions, utd):
    """The generation steps the UTD schedule gives: 0, then + max(1, ceil(utd * n)) after each."""
    steps = [0]
    for n in transitions[:-1]:
        steps.append(steps[-1] + max(1, math.ceil(utd * n)))
    return steps


@pytest.mark.parametrize("utd", [0.5, 1e-6])  # 1e-6: one update between generations (max(1, ceil(utd n)))
def test_the_utd_schedule_generates_after_ceil_utd_times_the_rows(data, tmp_path, utd):
    generator = FakeSequenceGeneratorConfig(utd=utd)
    trainer = sequence_trainer(data, tmp_path / "run", generator=generator)
    trainer.train()
    log, steps = trainer.generator.log, trainer.generated_at
    assert steps == utd_steps(steps, log, utd) and len(steps) == len(log) >= (3 if utd else 30)
    assert steps[-1] < 30 <= trainer.next_generation == steps[-1] + max(1, math.ceil(utd * log[-1]))
    assert len(set(log)) > 1  # the generations' sizes differ, so the schedule follows them
    assert trainer.agent.total_updates == [30]  # set_total_updates: once, with the run's updates
    assert isinstance(trainer.synthetic, SequenceBuffer)
    assert len(trainer.synthetic) == sum(log) if sum(log) <= 200 else 180 < len(trainer.synthetic) <= 200  # FIFO
    assert trainer.mixing.config.rule == "tape" and trainer.agent.episode_policies == [True]
    tape = trainer.tapes[-1]
    assert tape["observations"].shape == (24, data.obs_dim) and tape["starts"][0]
    assert tape["synthetic"].any() and (~tape["synthetic"]).any()  # real prefixes and imagined rows
    torch.testing.assert_close(tape["weights"][~tape["synthetic"]].sum(), torch.tensor(0.3))
    assert read_checkpoint(tmp_path / "run" / "checkpoint.pt")["next_generation"] == trainer.next_generation


def test_a_sequence_run_resumes_exactly_with_its_generation_schedule(data, tmp_path):
    straight = sequence_trainer(data, tmp_path / "straight", epochs=4, eval_every=2)
    straight.train()
    first = sequence_trainer(data, tmp_path / "resumed", epochs=2, eval_every=2)
    first.train()
    resumed = sequence_trainer(data, tmp_path / "resumed", epochs=4, eval_every=2)
    resumed.train(resume=True)
    assert first.generated_at + resumed.generated_at == straight.generated_at
    assert resumed.next_generation == straight.next_generation
    for a, b in zip(straight.agent.net.parameters(), resumed.agent.net.parameters()):
        assert torch.equal(a, b)
    a, b = straight.synthetic.state_dict(), resumed.synthetic.state_dict()
    assert a["episode_lengths"] == b["episode_lengths"] and all(torch.equal(a["rows"][k], b["rows"][k]) for k in a["rows"])
    assert len(straight.history) == 2
    assert [h["normalized_score"] for h in straight.history] == [h["normalized_score"] for h in resumed.history]


@pytest.mark.parametrize("every, expected", [(7, 21), (0, None)])
def test_a_checkpoint_without_next_generation_derives_it_from_every(data, tmp_path, every, expected):
    """Checkpoints written before the schedule was saved: generations at 0, every, 2 every, ... (after
    20 updates with every 7: 21), or only at 0."""
    generator = FakeSequenceGeneratorConfig(utd=None, every=every)
    trainer = sequence_trainer(data, tmp_path / "run", epochs=2, generator=generator)
    trainer.train()
    assert trainer.generated_at == ([0, 7, 14] if every else [0]) and trainer.next_generation == expected
    path = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=False)
    del state["next_generation"]
    atomic_torch_save(state, path)
    again = sequence_trainer(data, tmp_path / "run", epochs=2, generator=generator)
    again.next_generation = -1
    again.load_checkpoint(path)
    assert again.next_generation == expected


def test_a_sequence_agent_without_a_generator_learns_from_tapes_of_the_dataset(data, tmp_path):
    trainer = sequence_trainer(data, tmp_path / "run", epochs=1, generator=None)
    assert trainer.mixing.config.rule == "tape" and trainer.mixing.config.kappa == 1.0
    assert trainer.real_sequences.num_episodes == data.num_episodes and trainer.synthetic is None
    trainer.train()
    assert len(trainer.tapes) == 10
    for tape in trainer.tapes:
        assert not tape["synthetic"].any() and tape["weights"].sum().item() == pytest.approx(1.0)
        assert tape["starts"][0] and (tape["weights"][tape["final"]] == 0).all()


def test_mismatched_sequences_and_transitions_are_refused(data, tmp_path):
    with pytest.raises(ConfigError, match="generator 'fake-sequences' produces sequences, but ravl learns from transitions"):
        agent = build_run("ravl", data, TINY, NoGeneratorConfig(), TrainerConfig(run_dir=str(tmp_path / "a"),
                                                                                  progress=False)).agent
        Trainer(agent, data, TrainerConfig(run_dir=str(tmp_path / "a")),
                FakeSequenceGenerator.for_dataset(FakeSequenceGeneratorConfig(), data))
    rows_rule = FakeSequenceGeneratorConfig(mixing=MixingConfig(rule="fraction", real_ratio=0.5))
    with pytest.raises(ConfigError, match="fake-recurrent learns from sequences, and mixing.rule=fraction draws rows"):
        sequence_trainer(data, tmp_path / "b", generator=rows_rule)


class CounterPolicy:
    """An episode policy whose state is its step counter per episode: action = a function of it."""

    def __init__(self):
        self.calls = []

    def reset(self, episodes):
        self.count = np.zeros(episodes, dtype=np.int64)

    def __call__(self, observations, rewards, starts, rows):
        self.calls.append((rows.copy(), starts.copy(), rewards.copy()))
        assert (starts == (self.count[rows] == 0)).all()
        actions = self.action(self.count[rows])
        self.count[rows] += 1
        return actions

    @staticmethod
    def action(count):
        return (0.3 * np.sin(count / 3.0)).astype(np.float32)[:, None]


def test_evaluation_carries_the_episode_policys_state_through_each_episode():
    """Episodes of different lengths (InvertedPendulum falls at different steps): each one sees its own
    counter, the previous step's reward and the start flag; replaying the actions gives the same returns."""
    from mbrl_offline.data.envs import get_env_info

    env = get_env_info("inverted-pendulum")
    policy = CounterPolicy()
    result = evaluate_policy(policy, env, episodes=3, seed=5)
    lengths = policy.count.tolist()
    assert len(set(lengths)) > 1 and lengths == [sum(i in rows for rows, _, _ in policy.calls) for i in range(3)]
    assert (policy.calls[0][1]).all() and not any(s.any() for _, s, _ in policy.calls[1:])
    for i in range(3):  # the replay: same actions, same rewards fed back, same return
        e = env.make()
        e.reset(seed=5 + i)
        total, previous = 0.0, 0.0
        for t, (rows, _, rewards) in enumerate(c for c in policy.calls if i in c[0]):
            assert rewards[list(rows).index(i)] == np.float32(previous)
            _, previous, terminated, truncated, _ = e.step(CounterPolicy.action(np.array([t]))[0])
            total += previous
        assert total == result["returns"][i] and (terminated or truncated)


def test_feed_forward_evaluation_is_bit_identical_to_calling_act(data, tmp_path):
    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", generator=NoGeneratorConfig())
    for _ in range(3):
        trainer.agent.update(trainer.mixing.sample(trainer.real, None, 32, trainer.rng))
    seed = int(np.random.SeedSequence([trainer.config.seed, trainer.epoch]).generate_state(1)[0] % 2**31)
    before = evaluate_policy(lambda obs: trainer.agent.act(obs, deterministic=True), trainer.env, 2, seed)
    assert trainer.evaluate(2) == before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_that_python_loses_in_a_weakref_callback_still_stops_the_run(data, tmp_path):
    """Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives; inside a weakref
    callback (SQLAlchemy's, under a sweep's Optuna storage) it is printed as "Exception ignored" and lost,
    and a sweep went on to its end. In `interrupts_kept` (every tool runs in it) the trainer raises it at its
    next update instead: here a SIGINT sent from inside a weakref callback at the first evaluation stops the
    run in the next epoch, and after the block nothing is left pending."""
    import signal
    import weakref

    from mbrl_offline.platform import interrupts_kept, raise_if_interrupted

    class Referent:
        pass

    lost = []

    class CtrlCInACallback:
        def on_eval(self, trainer, epoch, result):
            referent = Referent()
            ref = weakref.ref(referent, lambda _: signal.raise_signal(signal.SIGINT))
            del referent  # the callback runs here; the KeyboardInterrupt raised in it goes nowhere
            lost.append(ref() is None)

    trainer = make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=4, eval_every=1,
                           generator=NoGeneratorConfig())
    trainer.callbacks.append(CtrlCInACallback())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest-xdist's workers may ignore it
    try:
        with interrupts_kept():
            with pytest.raises(KeyboardInterrupt):
                trainer.train()
        raise_if_interrupted()  # nothing pending after the block
    finally:
        signal.signal(signal.SIGINT, previous)
    assert lost == [True] and trainer.epoch == 1  # stopped at the first update of epoch 2
