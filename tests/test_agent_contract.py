"""The contract every registered agent and generator meets, run over the registries (plugins included:
`mbrl_offline.registry.load_plugins`): an agent or a generator is covered the day it is registered,
inside the package or outside it (``tests/test_plugins.py`` runs these tests against a plugin).

Per agent, each with its published generator (shrunk to test sizes) and with ``generator=none`` where
the agent allows it: the roles' members (`mbrl_offline.roles`), the shapes and bounds of ``act`` and of
the policy's samples, a log-probability differentiable in the actions, finite scalar metrics from
``update``, a state round trip, exact resume after an interrupted run, per-row loss weights honoured
(the ``weights`` mixing rule), and a bad setting refused with one line.

Agents of sequences (``consumes == "sequences"``, recurrent policies) meet the same contract on tapes:
`history_inputs` for ``sample``/``log_prob`` (a whole history equals stepping with the carried state),
the ``tape`` mixing rule with ``generator=none`` too, and per-row weights on tapes. NEUBAY runs those
cases, and so does a small fake recurrent agent (`sequence_fakes.FakeRecurrent`, registered here), so
that they do not rest on NEUBAY's own code.
"""
import copy
import dataclasses

import numpy as np
import pytest
import torch
from conftest import Interrupt, StopAfterEpoch1
from sequence_fakes import FakeRecurrent, FakeRecurrentConfig, FakeSequenceGenerator, FakeSequenceGeneratorConfig

from mbrl_offline import build_run, load_dataset, registry
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.algorithms import ALGORITHMS, load_policy
from mbrl_offline.compose import check_pair
from mbrl_offline.config import config_to_dataclass
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import GENERATORS, NoGeneratorConfig
from mbrl_offline.models import products
from mbrl_offline.models.recurrent import EnsembleHeads, FusedKernels
from mbrl_offline.roles import (Agent, AgentClass, EpisodePolicy, Generator, GeneratorClass, GeneratorConfig, Mixing,
                                Policy)
from mbrl_offline.policies import history_inputs
from mbrl_offline.trainer import TrainerConfig

TINY_DYNAMICS = dict(ensemble_size=3, num_elites=2, hidden_size=16, hidden_layers=2, min_epochs=0, max_epochs=2)
TINY_WIDTHS = dict(hidden_size=16, d_model=16, d_hidden=8, head_hidden=16)  # whichever the agent's config has


FAKE = "fake-recurrent"  # the fake agent of sequences, registered for every test here


@pytest.fixture(autouse=True)
def fake_sequence_agent(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, FAKE, (FakeRecurrent, FakeRecurrentConfig))
    monkeypatch.setitem(GENERATORS, "fake-sequences", (FakeSequenceGeneratorConfig, FakeSequenceGenerator))


NAMES = sorted(registry.agents()) + [FAKE]  # every registered agent, plugins included


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
    widths = {k: v for k, v in TINY_WIDTHS.items() if k in {f.name for f in dataclasses.fields(config_cls)}}
    config = dataclasses.replace(config_cls(), batch_size=32, **widths)
    if generator == "none":
        return config, NoGeneratorConfig()
    published = agent_cls.published_generator()
    if published.kind == "none":
        return config, published
    fields = {f.name for f in dataclasses.fields(published)}
    changes = {"mixing": mixing or published.mixing}
    if getattr(published, "utd", None) is None:  # under a UTD schedule `every` has no effect (and is refused)
        changes["every"] = 1 if getattr(agent_cls, "on_policy", False) else 10  # on-policy: a generation per update
    if "dynamics" in fields:
        dynamics = published.dynamics  # its recipe at test sizes (an L2 weight decay per layer: none)
        changes["dynamics"] = dataclasses.replace(dynamics, **TINY_DYNAMICS,
                                                  weight_decay=(0.0,) * 3 if dynamics.weight_decay else ())
    if "posterior" in fields:  # one rollout per elite
        changes["posterior"] = dataclasses.replace(published.posterior, parallel=TINY_DYNAMICS["num_elites"])
    if "rollout" in fields:
        changes["rollout"] = dataclasses.replace(published.rollout, rollouts_per_epoch=40, retain_epochs=2)
    return config, dataclasses.replace(published, **changes)


def trainer_for(name, data, cache, run_dir, generator="published", epochs=2, callbacks=(), mixing=None):
    config, generator_config = tiny(name, generator, mixing)
    settings = TrainerConfig(epochs=epochs, updates_per_epoch=10, eval_every=1, eval_episodes=1, checkpoint_every=1,
                             run_dir=str(run_dir), progress=False, tensorboard=False)
    return build_run(name, data, config, generator_config, settings, cache_dir=cache, callbacks=list(callbacks))


def real_source(trainer):
    """The real buffer batches are drawn from: the dataset's episodes for an agent of sequences."""
    return trainer.real_sequences if trainer.agent.consumes == "sequences" else trainer.real


def policy_inputs(agent, data, n):
    """``(inputs, starts)`` for the policy's ``sample``/``log_prob`` on ``n`` dataset rows: observations
    (feed-forward), or `history_inputs` rows of episode starts ``(n, D)`` (recurrent)."""
    obs = torch.as_tensor(data.observations[:n])
    if not agent.policy.recurrent:
        return obs, None
    starts = torch.ones(n, dtype=torch.bool)
    return history_inputs(obs, torch.as_tensor(data.actions[:n]), torch.as_tensor(data.rewards[:n]), starts), starts


def needs_its_generator(name: str) -> bool:
    """Whether the agent cannot run without a generator: its losses use the dynamics model (MOBILE), or
    it learns on-policy from the generator's rollouts only (MOReL's NPG)."""
    if name == FAKE:
        return False
    agent_cls = ALGORITHMS[name][0]
    return agent_cls.needs_dynamics or getattr(agent_cls, "on_policy", False)


CASES = [(name, generator) for name in NAMES for generator in ("published", "none")
         if not (generator == "none" and needs_its_generator(name))]


@pytest.mark.parametrize("name, generator", CASES)
def test_agent_meets_the_roles(name, generator, data, cache, tmp_path):
    trainer = trainer_for(name, data, cache, tmp_path / "run", generator)
    agent = trainer.agent
    assert isinstance(agent, Agent) and isinstance(agent.policy, Policy) and isinstance(trainer.mixing, Mixing)
    assert agent.name == name and agent.consumes in ("transitions", "sequences")
    assert (trainer.mixing.config.rule == "tape") == (agent.consumes == "sequences")
    if trainer.generator is not None:
        assert isinstance(trainer.generator, Generator) and trainer.generator.produces == agent.consumes
    recurrent = agent.policy.recurrent
    assert agent.policy.input_dim == (data.obs_dim + data.act_dim + 1 if recurrent else data.obs_dim)

    low, high = (np.asarray(b) for b in trainer.env.action_bounds())
    one = agent.act(data.observations[0], deterministic=True)
    batch = agent.act(data.observations[:7], deterministic=False)
    assert one.shape == (data.act_dim,) and batch.shape == (7, data.act_dim)
    assert (batch >= low - 1e-6).all() and (batch <= high + 1e-6).all()

    obs, starts = policy_inputs(agent, data, 7)
    assert agent.policy.initial_state(7) is None or recurrent
    actions, _ = agent.policy.sample(obs, agent.policy.initial_state(7), starts)
    assert actions.shape == (7, data.act_dim) and torch.isfinite(actions).all()
    given = torch.as_tensor(data.actions[:7]).clone().requires_grad_(True)
    log_prob = agent.policy.log_prob(obs, given, None, starts)
    assert log_prob.shape == (7,) and torch.isfinite(log_prob).all()
    (gradient,) = torch.autograd.grad(log_prob.sum(), given)
    assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0  # guidance can follow it
    if recurrent:  # a whole history (B, T, D) is the same as stepping through it with the carried state
        tape = real_source(trainer).tape(12, torch.Generator().manual_seed(0))
        previous = lambda v: torch.cat([torch.zeros_like(v[:1]), v[:-1]])  # noqa: E731  (x_k = [s_k, a_k-1, r_k-1])
        steps = history_inputs(tape["observations"], previous(tape["actions"]), previous(tape["rewards"]),
                               tape["starts"]).view(3, 4, -1)
        flags = tape["starts"].view(3, 4)
        whole = agent.policy.log_prob(steps, given[:3].detach(), agent.policy.initial_state(3), flags)
        _, state = agent.policy.sample(steps[:, :3], agent.policy.initial_state(3), flags[:, :3])
        stepped = agent.policy.log_prob(steps[:, 3], given[:3].detach(), state, flags[:, 3])
        torch.testing.assert_close(whole, stepped)

    episode_policy = agent.episode_policy(deterministic=True)
    assert isinstance(episode_policy, EpisodePolicy)
    episode_policy.reset(7)
    first = episode_policy(data.observations[:7], np.zeros(7, np.float32), np.ones(7, bool), np.arange(7))
    assert first.shape == (7, data.act_dim) and (first >= low - 1e-6).all() and (first <= high + 1e-6).all()
    if not recurrent:  # feed-forward: act itself, bit for bit
        assert np.array_equal(first, agent.act(data.observations[:7], deterministic=True))
    # the mode as tensors (what an exported policy computes, mbrl_offline.export) is the action evaluation takes
    observations = torch.as_tensor(data.observations[:7], device=agent.device)
    inputs = observations if not recurrent else history_inputs(
        observations, torch.zeros(7, data.act_dim, device=agent.device), torch.zeros(7, device=agent.device),
        torch.ones(7, dtype=torch.bool, device=agent.device))
    mode, _ = agent.deterministic(inputs, None, torch.ones(7, dtype=torch.bool, device=agent.device))
    assert np.array_equal(mode.cpu().numpy(), first)

    trainer.train()
    if trainer.generator is not None:
        assert len(trainer.synthetic) > 0  # the trainer ran the generator on its schedule
    copy, state = load_policy(tmp_path / "run" / "checkpoint.pt")  # the state round trip, through a checkpoint
    assert type(copy) is type(agent) and state["epoch"] == 2
    assert np.array_equal(copy.act(data.observations[:7], deterministic=True),
                          agent.act(data.observations[:7], deterministic=True))

    metrics = agent.update(trainer.mixing.sample(real_source(trainer), trainer.synthetic, agent.config.batch_size,
                                                 trainer.rng))
    assert metrics and all(v.dim() == 0 and torch.isfinite(v) for v in metrics.values())
    # its optimisers step through torch's multi-tensor or fused path (`mbrl_offline.utils.adam_kernel`), not the
    # per-tensor Python loop torch takes on the CPU by default
    optimisers = [v for v in vars(agent).values() if isinstance(v, torch.optim.Optimizer)]
    assert all(group["foreach"] or group["fused"] for o in optimisers for group in o.param_groups), name


@pytest.mark.parametrize("name", NAMES)
def test_an_interrupted_run_resumes_exactly(name, data, cache, tmp_path, monkeypatch):
    # every product that a full-sized run on an AMD CPU with AVX-512 sends to oneDNN (`products.linear`)
    # goes there at these sizes too, on any CPU
    monkeypatch.setattr(products, "MIN_MULTIPLY_ADDS", 0)
    monkeypatch.setattr(products, "ROUTE_CPU", products.available())
    # and NEUBAY's critic heads run their compiled kernels (`FusedKernels`) at these sizes too
    monkeypatch.setattr(FusedKernels, "FUSE_FROM", 0)

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
    fused = [m for v in vars(straight.agent).values() if isinstance(v, torch.nn.Module)
             for m in v.modules() if isinstance(m, EnsembleHeads) and m.fused]
    if fused:  # the compiled kernels ran (a failed compilation would have run them eagerly)
        assert FusedKernels.failed is None and FusedKernels._compiled


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


@pytest.mark.parametrize("name", NAMES)
def test_agent_honours_per_row_loss_weights(name, data, cache, tmp_path):
    """From the same state and seed: weights of 1/B train as no weights do; rows of weight 0 change
    nothing, whatever they hold; and a run under the weights rule trains with finite metrics."""
    sequences = ALGORITHMS[name][0].consumes == "sequences"
    if getattr(ALGORITHMS[name][0], "on_policy", False):  # takes whole generations: a weighted mix is refused
        with pytest.raises(ConfigError) as error:
            trainer_for(name, data, cache, tmp_path / "run", epochs=1, mixing=MixingConfig(rule="weights", kappa=0.3))
        assert "\n" not in str(error.value) and "mixing.rule=latest" in str(error.value)
        return
    trainer = trainer_for(name, data, cache, tmp_path / "run", epochs=1,
                          mixing=MixingConfig(rule="tape" if sequences else "weights", kappa=0.3))
    agent, rows = trainer.agent, trainer.agent.config.batch_size
    if sequences:
        return check_tape_weights(trainer, name)
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


def check_tape_weights(trainer, name):
    """The weights check on tapes: rewards at rows of weight 0 (an episode's final row, the tape's
    last, and rows given weight 0) change nothing, since a reward enters only its own row's loss and
    the next row's input, which is zeroed at a start; other weights change the update."""
    agent, rows = trainer.agent, trainer.agent.config.batch_size
    tape = trainer.real_sequences.tape(rows, torch.Generator().manual_seed(0))
    tape["synthetic"] = torch.arange(rows) % 2 == 1
    tape["weights"] = torch.ones(rows) / rows

    def updated(batch):
        copied = copy.deepcopy(agent)
        torch.manual_seed(1)
        for _ in range(2):
            copied.update(batch)
        return learned_tensors(copied)

    plain = updated(tape)
    assert any(not torch.equal(x, y) for x, y in zip(plain, learned_tensors(agent)))
    weights = torch.rand(rows, generator=torch.Generator().manual_seed(2))
    ignored = torch.zeros(rows, dtype=torch.bool)
    ignored[-1] = True
    ignored[:-1] |= tape["starts"][1:]  # rows before a start: their rewards reach no input
    weights[ignored] = 0.0
    weighted = {**tape, "weights": weights / weights.sum()}
    result = updated(weighted)
    other = {**weighted, "rewards": torch.where(ignored, torch.randn(rows) * 3, tape["rewards"])}
    assert not torch.equal(other["rewards"], tape["rewards"])
    for x, y in zip(updated(other), result):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-7), f"{name}: {(x - y).abs().max()}"
    assert any(not torch.allclose(x, y) for x, y in zip(result, plain))  # the weights changed the update
    trainer.train()  # the tape rule through the trainer
    assert all(np.isfinite(v) for v in trainer.history[-1].values() if isinstance(v, float))


@pytest.mark.parametrize("name", NAMES)
def test_bad_settings_are_refused_in_one_line(name):
    _, config_cls = ALGORITHMS[name]
    width = next(k for k in TINY_WIDTHS if k in {f.name for f in dataclasses.fields(config_cls)})
    for settings, message in (({"batch_size": 0}, "algo.batch_size must be at least"),
                              ({width: 0}, f"algo.{width} must be at least 1, got 0."),
                              ({"batch_size": "many"}, "algo.batch_size = 'many' has the wrong type; expected int."),
                              ({"no_such_setting": 1}, "unknown setting 'algo.no_such_setting'")):
        with pytest.raises(ConfigError) as error:
            config_to_dataclass(config_cls, settings, "algo")
        assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_every_registered_class_meets_the_class_contract():
    """`mbrl_offline.roles.AgentClass` and `GeneratorClass`, as registration checks them, for every entry
    (including ones put in the dicts by hand, as the fakes here are), and the config classes' defaults."""
    for name, (agent_cls, config_cls) in registry.agents().items():
        registry.check_agent_class(agent_cls)
        assert isinstance(agent_cls, AgentClass) and agent_cls.name == name and agent_cls.config_class is config_cls
        published = agent_cls.published_generator()
        check_pair(agent_cls, published)  # its published pair is allowed
        assert published.kind in registry.generators()
    for kind, (config_cls, generator_cls) in registry.generators().items():
        assert config_cls().kind == kind
        if generator_cls is not None:
            registry.check_generator_class(generator_cls)
            assert isinstance(generator_cls, GeneratorClass) and generator_cls.config_class is config_cls
            assert issubclass(config_cls, GeneratorConfig)


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
