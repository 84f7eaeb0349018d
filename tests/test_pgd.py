"""Policy-guided diffusion (``generator=pgd``): PGD's temporal U-Net, the training windows, the rows'
encoding, policy guidance of the sampler, the generation schedule, and composition with agents.

Everything runs at tiny sizes (a U-Net of base 16, a few hundred fitting steps) on the bundled
pendulum data; the guidance test fits a small model so that guidance has to work against a prior."""
import json
import math

import numpy as np
import pytest
import torch

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.data.windows import dataset_windows, window_starts
from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models.unet import TemporalUNet, unet_parameter_count


# ------------------------------------------------------------------------------------------- U-Net
@pytest.mark.parametrize("rows", [4, 17, 32, 129])
def test_unet_keeps_any_window_length_and_passes_gradients(rows):
    torch.manual_seed(0)
    net = TemporalUNet(6, base=16)
    x = torch.randn(3, rows, 6, requires_grad=True)
    y = net(x, torch.randn(3))
    assert y.shape == x.shape
    y.square().sum().backward()
    assert x.grad.abs().sum() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    # every row's output depends on the noise level and on its neighbours (the convolutions reach them)
    assert not torch.allclose(net(x, torch.zeros(3)), net(x, torch.ones(3)))


@pytest.mark.parametrize("kernel, padding", [(3, 1), (2, 0)])
def test_wide_convolutions_as_one_product_match_the_convolution(kernel, padding, monkeypatch):
    """`_Conv1d`'s matrix-product path (wide weights, few positions, CPU) gives the convolution's values
    and gradients; with the thresholds lowered, a small U-Net takes it at every conv and still agrees."""
    from mbrl_offline.models import unet as unet_module

    monkeypatch.setattr(unet_module, "MATMUL_MIN_WEIGHTS", 1)
    torch.manual_seed(0)
    conv = unet_module._Conv1d(6, 5, kernel, padding=padding)
    x = torch.randn(3, 6, 7, requires_grad=True)
    out = conv(x)
    expected = torch.nn.functional.conv1d(x, conv.weight, conv.bias, padding=padding)
    assert out.grad_fn.name() == "TransposeBackward0"  # the product's (B, rows, C_out), transposed
    torch.testing.assert_close(out, expected)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, conv.weight, conv.bias), upstream)
    expected_grads = torch.autograd.grad(expected, (x, conv.weight, conv.bias), upstream)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)
    net = TemporalUNet(6, base=16)
    window = torch.randn(2, 9, 6)
    product = net(window, torch.zeros(2))
    monkeypatch.setattr(unet_module, "MATMUL_MIN_WEIGHTS", 10 ** 12)
    torch.testing.assert_close(product, net(window, torch.zeros(2)), rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(unet_module, "MATMUL_MIN_WEIGHTS", 1)
    monkeypatch.setattr(unet_module, "MATMUL_MAX_POSITIONS", 3 * 7 - 1)  # more positions: the convolution
    assert conv(x).grad_fn.name() == "ConvolutionBackward0"


def test_unet_paper_size_is_178m_parameters_for_25_channels():
    with torch.device("meta"):
        net = TemporalUNet(25, base=1024, levels=3)  # walker2d / halfcheetah rows: 17 + 6 + 2 channels
    count = sum(p.numel() for p in net.parameters())
    assert count == unet_parameter_count(25, 1024, 3)
    assert round(count / 1e6) == 178
    assert unet_parameter_count(6, 32, 3) == sum(p.numel() for p in TemporalUNet(6, base=32).parameters())


def test_unet_refuses_bad_sizes_in_one_line():
    with pytest.raises(ConfigError, match="multiple of groups"):
        TemporalUNet(6, base=20)
    with pytest.raises(InputError, match="at least 4 rows, got 3"):
        TemporalUNet(6, base=16)(torch.zeros(1, 3, 6), torch.zeros(1))


# ------------------------------------------------------------------------------------------- windows
def reference_starts(terminals, timeouts, length, stride):
    """The official rule written episode by episode: valid starts in order, every stride-th of them,
    plus episode starts and terminal-ending windows, minus timeout-ending windows."""
    ends = np.flatnonzero(terminals | timeouts)
    valid, first_of_episode, terminal_ending = [], set(), set()
    start = 0
    for end in list(ends) + ([len(terminals) - 1] if len(ends) == 0 or ends[-1] != len(terminals) - 1 else []):
        episode = list(range(start, end - length + 2))
        valid += episode
        if episode:
            first_of_episode.add(episode[0])
            if terminals[end]:
                terminal_ending.add(episode[-1])
        start = end + 1
    chosen = set(valid[::stride]) | first_of_episode | terminal_ending
    return sorted(s for s in chosen if not timeouts[s + length - 1])


def flags(lengths, kinds):
    """End flags of consecutive episodes of the given lengths, each ending in a terminal ("t"),
    a timeout ("o") or nothing ("-", the data's end)."""
    n = sum(lengths)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    end = -1
    for length, kind in zip(lengths, kinds):
        end += length
        if kind == "t":
            terminals[end] = True
        elif kind == "o":
            timeouts[end] = True
    return terminals, timeouts


@pytest.mark.parametrize("length, stride", [(32, 8), (5, 3), (1, 1)])
def test_windows_stay_inside_episodes_and_match_the_official_rule(length, stride):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 80, size=30).tolist()
    kinds = rng.choice(["t", "o"], size=30).tolist()
    kinds[-1] = "-"
    terminals, timeouts = flags(lengths, kinds)
    starts = window_starts(terminals, timeouts, length, stride)
    assert starts.tolist() == reference_starts(terminals, timeouts, length, stride)
    ends = terminals | timeouts
    for s in starts:
        assert not ends[s:s + length - 1].any()  # no episode end before the window's last row
        assert not timeouts[s + length - 1]  # never ending in a timeout
    # every terminal of an episode long enough ends a window
    episode_ends = np.flatnonzero(ends)
    episode_lengths = np.diff(np.concatenate([[-1], episode_ends]))
    for end, n in zip(episode_ends, episode_lengths):
        if terminals[end] and n >= length:
            assert end - length + 1 in set(starts.tolist())


def test_dataset_with_only_short_episodes_is_refused_in_one_line():
    n, obs = 60, 3
    terminals, timeouts = flags([10] * 6, ["o"] * 6)
    data = OfflineDataset(np.zeros((n, obs)), np.zeros((n, 1)), np.zeros(n), np.zeros((n, obs)), terminals, timeouts,
                          env_name="pendulum", source="short.hdf5")
    with pytest.raises(ConfigError) as error:
        dataset_windows(data, 32, 8, "generator=pgd")
    assert str(error.value) == ("generator=pgd: short.hdf5 has no window of 32 rows inside one episode (its longest "
                                "episode has 10 rows); use a dataset with longer episodes or shorter windows.")


# ------------------------------------------------------------------------------------------- rows
def test_rows_round_trip_and_transitions():
    from mbrl_offline.generators.pgd import TrajectoryRows

    rows = TrajectoryRows(3, 2, [-2.0, -1.0], [2.0, 1.0])
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(4, 5, 3, generator=g)
    actions = (torch.rand(4, 5, 2, generator=g) * 2 - 1) * 0.99 * torch.tensor([2.0, 1.0])
    rewards, terminals = torch.randn(4, 5, generator=g), torch.rand(4, 5, generator=g) < 0.3
    encoded = rows.encode(obs, actions, rewards, terminals)
    assert encoded.shape == (4, 5, 7)
    assert torch.allclose(encoded[..., 3:5], torch.atanh(actions / torch.tensor([2.0, 1.0])))
    back = rows.decode(encoded)
    assert torch.allclose(back["actions"], actions, atol=1e-5) and torch.equal(back["observations"], obs)
    assert torch.equal(back["rewards"], rewards) and torch.equal(back["terminals"], terminals)
    # actions at the bounds are clipped to ±0.999 before the arctanh, so they stay finite
    edge = rows.encode(obs[:1, :1], torch.tensor([[[2.0, -1.0]]]), rewards[:1, :1], terminals[:1, :1])
    assert torch.allclose(edge[..., 3:5], torch.atanh(torch.tensor([0.999, -0.999])))
    # transitions: s' is the next row's state; the last row's action and reward are dropped
    terminals = torch.zeros(4, 5, dtype=torch.bool)
    terminals[0, 1] = True
    out = rows.transitions(rows.encode(obs, actions, rewards, terminals))
    assert len(out["rewards"]) == 16 and torch.equal(out["next_observations"].view(4, 4, 3), obs[:, 1:])
    assert out["terminals"].sum() == 1 and not out["timeouts"].any()
    dropped = rows.transitions(rows.encode(obs, actions, rewards, terminals), drop_after_terminal=True)
    assert len(dropped["rewards"]) == 14  # trajectory 0 keeps rows 0 and 1 (the terminal)


# ------------------------------------------------------------------------------------------- generation
def tiny_pgd(scale: float = 0.1, **changes):
    """A PGD config at test sizes: a base-16 U-Net fitted for 300 steps on 16-row windows, 16 sampler
    steps, 32 trajectories of 16 rows."""
    from mbrl_offline.generators.pgd import PGDGeneratorConfig, PGDGuidanceConfig, UNetConfig
    from mbrl_offline.models.diffusion import DiffusionTrainConfig, EDMConfig

    train = DiffusionTrainConfig(steps=300, batch_size=32, lr=2e-3, betas=(0.9, 0.999), schedule="warmup_cosine",
                                 grad_clip=None)
    settings = dict(window=16, stride=8, unet=UNetConfig(base=16), train=train, train_epochs=None, edm=EDMConfig(steps=16),
                    length=16,
                    trajectories=32, sample_batch=32, guidance=PGDGuidanceConfig(scale=scale))
    return PGDGeneratorConfig(**{**settings, **changes})


class TargetPolicy:
    """A policy that wants action +1.5 (pendulum's actions span [-2, 2]; its data's mean is about 0)."""

    recurrent = False

    def log_prob(self, observations, actions):
        return (-0.5 * ((actions - 1.5) / 0.5) ** 2).sum(-1)


@pytest.fixture(scope="module")
def pendulum():
    from mbrl_offline import load_dataset

    return load_dataset("pendulum-medium")


@pytest.fixture(scope="module")
def pgd_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("pgd")


@pytest.fixture(scope="module")
def fitted(pendulum, pgd_cache):
    """A PGD generator on pendulum-medium (fitted once for the module, through the cache)."""
    from mbrl_offline.generators.pgd import PGDGenerator

    return PGDGenerator.for_dataset(tiny_pgd(), pendulum, cache_dir=pgd_cache, progress=False)


def test_the_fitted_model_is_cached_and_loads_from_a_file(fitted, pendulum, pgd_cache, tmp_path):
    from mbrl_offline.generators.pgd import PGDGenerator

    assert fitted.model.denoiser_kind == "unet" and fitted.model.event_shape == (16, 6)
    again = PGDGenerator.for_dataset(tiny_pgd(scale=0.3), pendulum, cache_dir=pgd_cache, progress=False)  # no refit
    assert len(list(pgd_cache.rglob("*.pt"))) == 1
    path = fitted.model.save(tmp_path / "pgd.pt")
    loaded = PGDGenerator.for_dataset(tiny_pgd(), pendulum, model_path=path, progress=False)
    for other in (again, loaded):
        assert all(torch.equal(a, b) for a, b in zip(fitted.model.state_dict().values(),
                                                      other.model.state_dict().values()))
    noise = torch.randn(4, 16, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fitted.sample_trajectories(4, noise=noise, rng=torch.Generator().manual_seed(1)),
                       loaded.sample_trajectories(4, noise=noise, rng=torch.Generator().manual_seed(1)))


def test_guidance_raises_the_policys_likelihood_from_the_same_noise(fitted):
    """The fitted model samples actions near the data's; guidance with λ > 0 moves them towards the
    policy's (the likelihood rises), λ < 0 away from it, from the same starting noise and churn draws.
    The gradient touches the action channels only."""
    from mbrl_offline.generators.pgd import policy_guidance

    policy = TargetPolicy()
    noise = torch.randn(32, 16, fitted.rows.channels, generator=torch.Generator().manual_seed(2))

    def likelihood(scale):
        guidance = policy_guidance(policy, fitted.rows, fitted.model.normalizer, fitted.config.guidance, scale=scale)
        rows = fitted.sample_trajectories(32, guidance, torch.Generator().manual_seed(1), noise)
        out = fitted.rows.transitions(rows)
        assert torch.isfinite(out["observations"]).all()
        return policy.log_prob(out["observations"], out["actions"]).mean().item()

    unguided, guided, repelled = likelihood(0.0), likelihood(0.1), likelihood(-0.1)
    assert guided > unguided + 2.0 and repelled < unguided - 2.0, (repelled, unguided, guided)
    assert likelihood(0.0) == unguided  # the same noise gives the same samples
    g = policy_guidance(policy, fitted.rows, fitted.model.normalizer, fitted.config.guidance).grad(noise)
    act = fitted.rows.act
    assert g[..., act].abs().sum() > 0 and torch.count_nonzero(g) == torch.count_nonzero(g[..., act])


def test_trajectories_start_at_given_states(fitted, pendulum):
    """``start_observations`` hold the first row's states (data units, after the normaliser's round trip);
    without them the samples are the unconditional ones, bit for bit."""
    starts = torch.as_tensor(pendulum.observations[:40:5])
    noise = torch.randn(8, 16, fitted.rows.channels, generator=torch.Generator().manual_seed(0))
    rows = fitted.sample_trajectories(8, rng=torch.Generator().manual_seed(1), noise=noise, start_observations=starts)
    assert torch.allclose(rows[:, 0, fitted.rows.obs], starts, atol=1e-5)
    free = fitted.sample_trajectories(8, rng=torch.Generator().manual_seed(1), noise=noise)
    assert torch.equal(free, fitted.sample_trajectories(8, rng=torch.Generator().manual_seed(1), noise=noise,
                                                        start_observations=None))
    assert not torch.allclose(free[:, 0, fitted.rows.obs], starts, atol=1e-3)
    with pytest.raises(InputError, match="start_observations holds 8 states for 4 trajectories"):
        fitted.sample_trajectories(4, start_observations=starts)


def test_the_first_generation_is_unguided_and_later_ones_guided(fitted):
    from mbrl_offline.generators.pgd import PGDGenerator

    generator = PGDGenerator(fitted.model, fitted.rows, fitted.config)
    policy = TargetPolicy()
    first, first_stats = generator.generate(policy, {}, torch.Generator().manual_seed(5))
    second, second_stats = generator.generate(policy, {}, torch.Generator().manual_seed(5))
    assert first_stats["guidance_scale"] == 0.0 and second_stats["guidance_scale"] == 0.1
    unguided = fitted.rows.transitions(generator.sample_trajectories(32, None, torch.Generator().manual_seed(5)))
    assert torch.equal(first["actions"], unguided["actions"])  # the first one is exactly an unguided sample
    assert policy.log_prob(second["observations"], second["actions"]).mean() > \
        policy.log_prob(first["observations"], first["actions"]).mean()
    assert len(first["rewards"]) == 32 * 15 == generator.buffer_capacity
    # the count is the generator's state: a resumed run does not guide its first generation again
    resumed = PGDGenerator(fitted.model, fitted.rows, fitted.config)
    resumed.load_state_dict(generator.state_dict())
    assert resumed.generate(policy, {}, torch.Generator().manual_seed(5))[1]["guidance_scale"] == 0.1


def test_guidance_with_a_policy_without_log_prob_is_refused_in_one_line(fitted):
    from mbrl_offline.generators.pgd import PGDGenerator
    from mbrl_offline.policies import FunctionPolicy

    generator = PGDGenerator(fitted.model, fitted.rows, fitted.config)
    with pytest.raises(ConfigError) as error:  # refused at the first generation, although it is unguided
        generator.generate(FunctionPolicy(lambda obs: obs[:, :1]), {})
    message = str(error.value)
    assert "\n" not in message and message.startswith("generator.guidance.scale=0.1 needs the policy's log-probability")
    assert message.endswith("or generator.guidance.scale=0 for unguided diffusion.")
    unguided = PGDGenerator(fitted.model, fitted.rows, tiny_pgd(scale=0.0))
    assert unguided.generate(FunctionPolicy(lambda obs: obs[:, :1]), {})[1]["guidance_scale"] == 0.0


def test_a_recurrent_policy_is_refused_in_one_line(fitted):
    from mbrl_offline.generators.pgd import PGDGenerator

    class Recurrent(TargetPolicy):
        recurrent = True

    with pytest.raises(ConfigError, match="a recurrent agent needs a sequence generator"):
        PGDGenerator(fitted.model, fitted.rows, tiny_pgd(scale=0.0)).generate(Recurrent(), {})


def test_td3bc_and_ravl_train_on_pgd_data(pendulum, fitted, tmp_path):
    """td3bc with generator=pgd runs to a normalised score; ravl (the SAC family) and iql compose with it
    and their policies' log-probabilities guide the sampler; MOBILE (whose penalty needs a dynamics
    model) is refused in one line."""
    import dataclasses

    from mbrl_offline import build_run
    from mbrl_offline.algorithms import ALGORITHMS
    from mbrl_offline.compose import check_pair
    from mbrl_offline.generators.pgd import policy_guidance
    from mbrl_offline.trainer import TrainerConfig

    config = dataclasses.replace(tiny_pgd(), every=10)
    settings = TrainerConfig(epochs=1, updates_per_epoch=20, eval_episodes=1, run_dir=str(tmp_path / "run"),
                             progress=False, tensorboard=False)
    agent_cls, agent_config = ALGORITHMS["td3bc"]
    trainer = build_run("td3bc", pendulum, dataclasses.replace(agent_config(), hidden_size=16, batch_size=32), config,
                        settings, cache_dir=tmp_path / "cache")
    trainer.train()
    assert trainer.generator.generations == 2 and len(trainer.synthetic) == 32 * 15
    assert math.isfinite(trainer.history[-1]["normalized_score"])
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["rollout"]["guidance_scale"] == 0.1  # the second generation (update 10) was guided

    for name in ("ravl", "iql"):  # the SAC family's tanh-Gaussian and IQL's Gaussian guide too
        cls, agent_config = ALGORITHMS[name]
        check_pair(cls, config)
        agent = cls.for_dataset(pendulum, dataclasses.replace(agent_config(), hidden_size=16))
        guidance = policy_guidance(agent.policy, fitted.rows, fitted.model.normalizer, fitted.config.guidance)
        assert torch.isfinite(guidance.grad(torch.randn(4, 16, fitted.rows.channels))).all()
        rows = fitted.sample_trajectories(8, guidance, torch.Generator().manual_seed(0))
        assert torch.isfinite(rows).all()
    with pytest.raises(ConfigError, match="needs the generator's dynamics model, and generator 'pgd' has none"):
        check_pair(ALGORITHMS["mobile"][0], config)


def test_train_epochs_count_whole_passes_over_the_windows(pendulum, tmp_path):
    from mbrl_offline.data.windows import dataset_windows
    from mbrl_offline.generators.pgd import PGDGenerator

    generator = PGDGenerator.for_dataset(tiny_pgd(train_epochs=2), pendulum, cache_dir=tmp_path, progress=False)
    windows = len(dataset_windows(pendulum, 16, 8))
    assert generator.model.train_log[-1]["step"] == 2 * (windows // 32)


def test_an_interrupted_pgd_run_resumes_exactly(pendulum, pgd_cache, tmp_path):
    """Two epochs in one go, and one epoch then a resume for the second, give the same agent and
    synthetic data: the generation count (the first generation is unguided) is in the checkpoint."""
    import dataclasses

    from mbrl_offline import build_run
    from mbrl_offline.algorithms import ALGORITHMS
    from mbrl_offline.checkpoint import model_fingerprint, read_checkpoint
    from mbrl_offline.errors import CheckpointError
    from mbrl_offline.trainer import TrainerConfig

    config = dataclasses.replace(tiny_pgd(), every=15, trajectories=8)
    agent_config = dataclasses.replace(ALGORITHMS["td3bc"][1](), hidden_size=16, batch_size=32)

    def run(folder, epochs, resume=False):
        settings = TrainerConfig(epochs=epochs, updates_per_epoch=10, eval_episodes=1, run_dir=str(tmp_path / folder),
                                 progress=False, tensorboard=False)
        trainer = build_run("td3bc", pendulum, agent_config, config, settings, cache_dir=pgd_cache)
        trainer.train(resume=resume)
        return trainer

    straight = run("straight", 2)
    run("resumed", 1)
    resumed = run("resumed", 2, resume=True)
    assert straight.generator.generations == resumed.generator.generations == 2
    for a, b in zip(straight.agent.state_dict()["actor"].values(), resumed.agent.state_dict()["actor"].values()):
        assert torch.equal(a, b)
    # a checkpoint holds the model's fingerprint, not its weights (one rule for every generator); a resume
    # with another model is refused in one line
    path = tmp_path / "straight" / "checkpoint.pt"
    saved = read_checkpoint(path)["generator"]
    assert saved["state"] == {"generations": 2}
    assert saved["model"] == model_fingerprint(straight.generator.model.state_dict())
    other = build_run("td3bc", pendulum, agent_config, config, TrainerConfig(
        epochs=2, updates_per_epoch=10, eval_episodes=1, run_dir=str(tmp_path / "straight"), progress=False,
        tensorboard=False), cache_dir=pgd_cache)
    with torch.no_grad():
        next(other.generator.model.parameters()).add_(1.0)
    with pytest.raises(CheckpointError, match="was trained with another pgd model"):
        other.load_checkpoint(path)


def test_hopper_windows_end_at_terminals_and_short_episodes_are_refused(hopper_data):
    """Random hopper episodes (at most 25 rows, terminals and timeouts): 32-row windows are refused in
    one line through the generator; 8-row windows carry a terminal only in their last row, and every
    terminal of an episode of 8 rows or more ends one, unless it is also a timeout (the official code
    removes every window ending in a timeout; row 74 of this data is both)."""
    from mbrl_offline import build_run
    from mbrl_offline.generators.pgd import PGDGeneratorConfig, TrajectoryRows, training_windows

    with pytest.raises(ConfigError) as error:
        build_run("td3bc", hopper_data, generator_config=PGDGeneratorConfig())
    assert str(error.value).startswith("generator=pgd: hopper-random-rollout has no window of 32 rows inside one "
                                       "episode (its longest episode has ")
    rows = TrajectoryRows(hopper_data.obs_dim, hopper_data.act_dim, -np.ones(3), np.ones(3))
    windows = training_windows(hopper_data, rows, 8, 8)
    done = windows[..., rows.done]
    assert set(done.unique().tolist()) <= {0.0, 1.0} and not done[:, :-1].any()
    ends = np.flatnonzero(hopper_data.episode_ends)
    lengths = np.diff(np.concatenate([[-1], ends]))
    long_terminals = sum(bool(hopper_data.terminals[e] and not hopper_data.timeouts[e]) and n >= 8
                         for e, n in zip(ends, lengths))
    assert long_terminals > 0 and done[:, -1].sum() == long_terminals
