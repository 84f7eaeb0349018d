"""``generator=synther``: rows in the buffer's format, thresholded terminals, clipped actions, the cache,
and an agent training on the samples."""
import dataclasses

import numpy as np
import pytest
import torch
from conftest import Interrupt, StopAfterEpoch1

from mbrl_offline import build_run, load_dataset
from mbrl_offline.buffer import TRANSITION_FIELDS, TransitionBuffer, transition_schema
from mbrl_offline.compose import check_pair
from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.config import config_to_dataclass
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import GENERATORS, SyntherGenerator, SyntherGeneratorConfig, build_generator
from mbrl_offline.generators.synther import transition_rows
from mbrl_offline.models.diffusion import DiffusionTrainConfig, EDMConfig, ResidualMLPConfig
from mbrl_offline.trainer import TrainerConfig

TINY = SyntherGeneratorConfig(samples=300, sample_batch=128, denoiser=ResidualMLPConfig(width=32, blocks=2, dim_t=16),
                              edm=EDMConfig(steps=4), train=DiffusionTrainConfig(steps=30, batch_size=64))


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(1000))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("diffusion")


def test_registered_and_default_mixing_replaces_the_real_data():
    assert GENERATORS["synther"] == (SyntherGeneratorConfig, SyntherGenerator)
    config = SyntherGeneratorConfig()
    assert config.every == 0 and config.mixing.rule == "fraction" and config.mixing.real_ratio == 0.0
    check_pair(ALGORITHMS["iql"][0], config)
    with pytest.raises(ConfigError, match="needs the generator's dynamics model"):
        check_pair(ALGORITHMS["mobile"][0], config)


def test_rows_have_the_buffers_schema_and_binary_terminals(data, cache):
    generator = build_generator(TINY, data, cache_dir=cache, progress=False)
    rows, stats = generator.generate(None, {}, torch.Generator().manual_seed(0))
    schema = transition_schema(data.obs_dim, data.act_dim, generator.extra_fields)
    assert set(rows) == set(TRANSITION_FIELDS) == set(schema)
    for key, (shape, dtype) in schema.items():
        assert rows[key].shape == (TINY.samples, *shape) and rows[key].dtype == dtype, key
    assert rows["terminals"].dtype == torch.bool and not rows["timeouts"].any()
    low, high = generator.action_low, generator.action_high
    assert (rows["actions"] >= low).all() and (rows["actions"] <= high).all()
    assert stats["transitions"] == TINY.samples and all(np.isfinite(v) for v in stats.values())
    buffer = TransitionBuffer(generator.buffer_capacity, data.obs_dim, data.act_dim,
                              extra_fields=generator.extra_fields)
    buffer.add(**rows)
    assert len(buffer) == TINY.samples


def test_terminal_threshold_and_action_clipping(data, cache):
    generator = build_generator(TINY, data, cache_dir=cache, progress=False)
    o, a = data.obs_dim, data.act_dim
    samples = torch.zeros(4, 2 * o + a + 2)
    samples[:, -1] = torch.tensor([0.2, 0.5, 0.51, 3.0])
    samples[:, o] = torch.tensor([-5.0, 0.5, 1.0, 5.0])  # pendulum's actions lie in [-2, 2]
    rows = generator.split(samples)
    assert rows["terminals"].tolist() == [False, False, True, True]
    assert rows["actions"][:, 0].tolist() == [-2.0, 0.5, 1.0, 2.0]
    unclipped = SyntherGenerator(generator.model, o, a, (generator.action_low, generator.action_high),
                                 dataclasses.replace(TINY, clip_actions=False))
    assert unclipped.split(samples)["actions"][:, 0].tolist() == [-5.0, 0.5, 1.0, 5.0]


def test_model_is_fitted_on_transition_rows_and_cached(data, cache):
    rows = transition_rows(data)
    assert rows.shape == (len(data), 2 * data.obs_dim + data.act_dim + 2)
    torch.testing.assert_close(rows[:, -1], torch.as_tensor(data.terminals, dtype=torch.float32))
    first = build_generator(TINY, data, cache_dir=cache, progress=False)
    assert first.model.normalizer.std[-1] == 1.0 and first.model.normalizer.mean[-1] == 0.0  # d is not z-scored
    files = sorted(cache.glob("*.pt"))
    second = build_generator(TINY, data, cache_dir=cache, progress=False)
    assert sorted(cache.glob("*.pt")) == files and len(files) == 1
    for x, y in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(x, y)


def test_iql_trains_on_synther_samples(data, cache, tmp_path):
    _, config_cls = ALGORITHMS["iql"]
    algo = dataclasses.replace(config_cls(), hidden_size=16, batch_size=32)
    settings = TrainerConfig(epochs=1, updates_per_epoch=5, eval_every=1, eval_episodes=1, checkpoint_every=1,
                             run_dir=str(tmp_path / "run"), progress=False, tensorboard=False)
    trainer = build_run("iql", data, algo, TINY, settings, cache_dir=cache)
    trainer.train()
    assert len(trainer.synthetic) == TINY.samples
    batch = trainer.mixing.sample(trainer.real, trainer.synthetic, 32)
    assert batch["synthetic"].all()  # real_ratio 0: synthetic data replaces the real data
    assert np.isfinite(trainer.history[-1]["normalized_score"])


@pytest.mark.parametrize("settings, message", [
    ({"samples": 0}, "generator.samples must be at least 1, got 0."),
    ({"terminal_threshold": 2.0}, "generator.terminal_threshold must be in [0, 1], got 2.0."),
    ({"edm": {"steps": 0}}, "generator.edm.steps must be at least 1, got 0."),
    ({"denoiser": {"width": 0}}, "generator.denoiser.width must be at least 1, got 0."),
    ({"train": {"lr": -1}}, "generator.train.lr must be above 0, got -1.0."),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError) as error:
        config_to_dataclass(SyntherGeneratorConfig, {"kind": "synther", **settings}, "generator")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_an_interrupted_synther_run_resumes_exactly(data, cache, tmp_path):
    _, config_cls = ALGORITHMS["iql"]
    algo = dataclasses.replace(config_cls(), hidden_size=16, batch_size=32)

    def run(folder, callbacks=()):
        settings = TrainerConfig(epochs=2, updates_per_epoch=5, eval_every=1, eval_episodes=1, checkpoint_every=1,
                                 run_dir=str(tmp_path / folder), progress=False, tensorboard=False)
        return build_run("iql", data, algo, TINY, settings, cache_dir=cache, callbacks=list(callbacks))

    straight = run("straight")
    straight.train()
    with pytest.raises(Interrupt):
        run("resumed", [StopAfterEpoch1()]).train()
    resumed = run("resumed")
    resumed.train(resume=True)
    for a, b in zip(straight.agent.actor.state_dict().values(), resumed.agent.actor.state_dict().values()):
        assert torch.equal(a, b)
    assert [h["normalized_score"] for h in straight.history] == [h["normalized_score"] for h in resumed.history]
