"""The contract every registered agent and generator meets, run over the registries: an agent added to
``ALGORITHMS`` (or a generator to ``GENERATORS``) is covered the day it is registered.

Per agent, each with its published generator (shrunk to test sizes) and with ``generator=none`` where
the agent allows it: the roles' members (`mbrl_offline.roles`), the shapes and bounds of ``act`` and of
the policy's samples, a log-probability differentiable in the actions, finite scalar metrics from
``update``, a state round trip, exact resume after an interrupted run, per-row loss weights honoured
(the ``weights`` mixing rule), and a bad setting refused with one line.
"""
import copy
import dataclasses

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.algorithms import ALGORITHMS, load_policy
from mbrl_offline.compose import check_pair
from mbrl_offline.config import config_to_dataclass
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import GENERATORS, NoGeneratorConfig
from mbrl_offline.models.dynamics import DynamicsConfig
from mbrl_offline.roles import Agent, Generator, Mixing, Policy
from mbrl_offline.trainer import TrainerConfig

TINY_DYNAMICS = DynamicsConfig(ensemble_size=3, num_elites=2, hidden_size=16, hidden_layers=2,
                               weight_decay=(0.0, 0.0, 0.0), min_epochs=0, max_epochs=2)


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(1500))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dynamics")


def tiny(name: str, generator: str = "published", mixing=None):
    """The agent's config and generator at test sizes (``generator``: published or none; ``mixing``
    replaces the generator's mixing rule)."""
    agent_cls, config_cls = ALGORITHMS[name]
    config = dataclasses.replace(config_cls(), hidden_size=16, batch_size=32)
    if generator == "none":
        return config, NoGeneratorConfig()
    published = agent_cls.published_generator()
    if published.kind == "none":
        return config, published
    return config, dataclasses.replace(published, every=10, dynamics=TINY_DYNAMICS,
                                       rollout=dataclasses.replace(published.rollout, rollouts_per_epoch=40,
                                                                   retain_epochs=2),
                                       mixing=mixing or published.mixing)


def trainer_for(name, data, cache, run_dir, generator="published", epochs=2, callbacks=(), mixing=None):
    config, generator_config = tiny(name, generator, mixing)
    settings = TrainerConfig(epochs=epochs, updates_per_epoch=10, eval_every=1, eval_episodes=1, checkpoint_every=1,
                             run_dir=str(run_dir), progress=False, tensorboard=False)
    return build_run(name, data, config, generator_config, settings, cache_dir=cache, callbacks=list(callbacks))


CASES = [(name, generator) for name, (agent_cls, _) in sorted(ALGORITHMS.items())
         for generator in ("published", "none") if not (generator == "none" and agent_cls.needs_dynamics)]


@pytest.mark.parametrize("name, generator", CASES)
def test_agent_meets_the_roles(name, generator, data, cache, tmp_path):
    trainer = trainer_for(name, data, cache, tmp_path / "run", generator)
    agent = trainer.agent
    assert isinstance(agent, Agent) and isinstance(agent.policy, Policy) and isinstance(trainer.mixing, Mixing)
    assert agent.name == name and agent.consumes == "transitions"
    if trainer.generator is not None:
        assert isinstance(trainer.generator, Generator)

    low, high = (np.asarray(b) for b in trainer.env.action_bounds())
    one = agent.act(data.observations[0], deterministic=True)
    batch = agent.act(data.observations[:7], deterministic=False)
    assert one.shape == (data.act_dim,) and batch.shape == (7, data.act_dim)
    assert (batch >= low - 1e-6).all() and (batch <= high + 1e-6).all()

    obs = torch.as_tensor(data.observations[:7])
    assert agent.policy.initial_state(7) is None or agent.policy.recurrent
    actions, _ = agent.policy.sample(obs, agent.policy.initial_state(7))
    assert actions.shape == (7, data.act_dim) and torch.isfinite(actions).all()
    given = torch.as_tensor(data.actions[:7]).clone().requires_grad_(True)
    log_prob = agent.policy.log_prob(obs, given)
    assert log_prob.shape == (7,) and torch.isfinite(log_prob).all()
    (gradient,) = torch.autograd.grad(log_prob.sum(), given)
    assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0  # guidance can follow it

    trainer.train()
    if trainer.generator is not None:
        assert len(trainer.synthetic) > 0  # the trainer ran the generator on its schedule
    copy, state = load_policy(tmp_path / "run" / "checkpoint.pt")  # the state round trip, through a checkpoint
    assert type(copy) is type(agent) and state["epoch"] == 2
    assert np.array_equal(copy.act(data.observations[:7], deterministic=True),
                          agent.act(data.observations[:7], deterministic=True))

    metrics = agent.update(trainer.mixing.sample(trainer.real, trainer.synthetic, agent.config.batch_size, trainer.rng))
    assert metrics and all(v.dim() == 0 and torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_an_interrupted_run_resumes_exactly(name, data, cache, tmp_path):
    class Interrupt(Exception):
        pass

    class StopAfterEpoch1:  # the run is killed after epoch 1's checkpoint (schedules need the real total)
        def on_eval(self, trainer, epoch, result):
            if epoch == 1:
                raise Interrupt

    straight = trainer_for(name, data, cache, tmp_path / "straight")
    straight.train()
    with pytest.raises(Interrupt):
        trainer_for(name, data, cache, tmp_path / "resumed", callbacks=[StopAfterEpoch1()]).train()
    resumed = trainer_for(name, data, cache, tmp_path / "resumed")
    resumed.train(resume=True)
    for key, value in straight.agent.state_dict().items():
        if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):  # module weights
            for a, b in zip(value.values(), resumed.agent.state_dict()[key].values()):
                assert torch.equal(a, b), f"{name}: {key} differs after resuming"
    assert [h["normalized_score"] for h in straight.history] == [h["normalized_score"] for h in resumed.history]


def learned_tensors(agent) -> list[torch.Tensor]:
    """Every module weight and loose parameter (log alpha, IQL's log-std) in the agent's state, then the
    gradients of its last steps (Adam's early steps hardly depend on a gradient's size; these do)."""
    out = []
    for value in agent.state_dict().values():
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            out.extend(value.values())
    for value in vars(agent).values():
        params = (list(value.parameters()) if isinstance(value, torch.nn.Module)
                  else [value] if isinstance(value, torch.Tensor) and value.requires_grad else [])
        out.extend(p.grad for p in params if p.grad is not None)
    return out


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_agent_honours_per_row_loss_weights(name, data, cache, tmp_path):
    """From the same state and seed: weights of 1/B train as no weights do; rows of weight 0 change
    nothing, whatever they hold; and a run under the weights rule trains with finite metrics."""
    trainer = trainer_for(name, data, cache, tmp_path / "run", epochs=1,
                          mixing=MixingConfig(rule="weights", kappa=0.3))
    agent, rows = trainer.agent, trainer.agent.config.batch_size
    batch = trainer.real.sample(rows, torch.Generator().manual_seed(0))
    batch["synthetic"] = torch.arange(rows) % 2 == 1  # MOBILE penalises these rows' targets

    def updated(batch):
        copied = copy.deepcopy(agent)
        torch.manual_seed(1)
        for _ in range(2):  # TD3+BC's actor steps on every second update
            copied.update(batch)
        return learned_tensors(copied)

    def same(a, b):
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-7), f"{name}: {(x - y).abs().max()}"

    plain = updated(batch)
    assert any(not torch.equal(x, y) for x, y in zip(plain, learned_tensors(agent)))  # the update did something
    same(updated({**batch, "weights": torch.full((rows,), 1.0 / rows)}), plain)

    weights = torch.rand(rows, generator=torch.Generator().manual_seed(2))
    ignored = torch.arange(rows) % 3 == 0
    weights[ignored] = 0.0
    weighted = {**batch, "weights": weights / weights.sum()}
    other = dict(weighted)
    noise = torch.Generator().manual_seed(3)
    for key in ("observations", "actions", "rewards", "next_observations"):
        value = batch[key].clone()
        value[ignored] = torch.randn(value[ignored].shape, generator=noise) * 3
        other[key] = value
    if "actions" in other:  # actions stay inside the env's bounds
        low, high = (torch.as_tensor(np.asarray(b), dtype=torch.float32) for b in trainer.env.action_bounds())
        other["actions"] = torch.maximum(torch.minimum(other["actions"], high), low)
    assert not torch.equal(other["observations"], batch["observations"])
    result = updated(weighted)
    same(updated(other), result)
    assert any(not torch.allclose(x, y) for x, y in zip(result, plain))  # the weights changed the update

    trainer.train()  # the weights rule through the trainer
    assert all(np.isfinite(v) for v in trainer.history[-1].values() if isinstance(v, float))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_bad_settings_are_refused_in_one_line(name):
    _, config_cls = ALGORITHMS[name]
    for settings, message in (({"batch_size": 0}, "algo.batch_size must be at least 1, got 0."),
                              ({"hidden_size": 0}, "algo.hidden_size must be at least 1, got 0."),
                              ({"batch_size": "many"}, "algo.batch_size = 'many' has the wrong type; expected int."),
                              ({"no_such_setting": 1}, "unknown setting 'algo.no_such_setting'")):
        with pytest.raises(ConfigError) as error:
            config_to_dataclass(config_cls, settings, "algo")
        assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_every_generator_kind_is_registered_with_a_config_and_a_kind():
    for kind, (config_cls, generator_cls) in GENERATORS.items():
        assert config_cls().kind == kind
        assert generator_cls is None or generator_cls.produces in ("transitions", "sequences")


def test_an_impossible_pair_is_refused_in_one_line(monkeypatch):
    """A sequence generator (NEUBAY's kind, registered here for the test) with a transition agent."""

    @dataclasses.dataclass
    class SequencesConfig:
        kind: str = "sequences"

    class Sequences:
        produces = "sequences"

    monkeypatch.setitem(GENERATORS, "sequences", (SequencesConfig, Sequences))
    agent_cls, _ = ALGORITHMS["iql"]
    with pytest.raises(ConfigError) as error:
        check_pair(agent_cls, SequencesConfig())
    assert str(error.value) == ("generator 'sequences' produces sequences, but iql learns from transitions; "
                                "choose a generator that produces transitions.")
