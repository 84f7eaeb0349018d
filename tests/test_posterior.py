"""Posterior rollouts (NEUBAY, `mbrl_offline.generators.posterior`) with a scripted fake posterior and a
fake recurrent policy that records its inputs."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.data.termination import never
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import posterior as posterior_module
from mbrl_offline.generators.posterior import (Histories, PosteriorConfig, PosteriorGenerator,
                                               PosteriorGeneratorConfig, PosteriorRollouts)
from mbrl_offline.policies import FunctionPolicy


def episodes_dataset(lengths=(3, 5, 4), ends=("timeout", "terminal", "timeout")) -> OfflineDataset:
    """Episode e, row k: s = (100e + k, 0), s' = (100e + k + 1, 0), a = 1000e + k, r = 10e + k + 0.5."""
    rows = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    for e, (length, end) in enumerate(zip(lengths, ends)):
        for k in range(length):
            rows["observations"].append([100 * e + k, 0])
            rows["next_observations"].append([100 * e + k + 1, 0])
            rows["actions"].append([1000 * e + k])
            rows["rewards"].append(10 * e + k + 0.5)
            rows["terminals"].append(k == length - 1 and end == "terminal")
            rows["timeouts"].append(k == length - 1 and end == "timeout")
    return OfflineDataset(**{k: np.array(v) for k, v in rows.items()}, env_name="pendulum")


class FakePosterior:
    """posterior_step: s' = s + (1, 1), raw reward ``reward``, U = s[1] + 1 (a rollout from a data state,
    whose second coordinate is 0, sees U = j + 1 at its step j), the row's member echoed. Optionally
    non-finite predictions for one member from a given step. Records every call."""

    def __init__(self, elites=(0, 1, 2), threshold=math.inf, mean=1.0, reward=7.0, nan_member=None, nan_from=0):
        self.elites = torch.tensor(elites)
        self.threshold, self.mean, self.reward = threshold, mean, reward
        self.nan_member, self.nan_from = nan_member, nan_from
        self.calls, self.asked = [], []

    def posterior_step(self, obs, act, members, generator=None):
        self.calls.append({"obs": obs.clone(), "act": act.clone(), "members": members.clone()})
        next_obs = obs + torch.tensor([1.0, 1.0], device=obs.device)
        if self.nan_member is not None:
            bad = (members == self.nan_member) & (obs[:, 1] >= self.nan_from)
            next_obs[bad] = float("nan")
        return {"next_observations": next_obs, "rewards": torch.full((len(obs),), self.reward, device=obs.device),
                "uncertainty": obs[:, 1] + 1.0, "member": members.clone()}

    def uncertainty_threshold(self, q):
        self.asked.append(q)
        return self.threshold

    def uncertainty_mean(self):
        return self.mean

    def state_dict(self):
        return {"threshold": self.threshold}

    def load_state_dict(self, state):
        self.threshold = state["threshold"]

    def to(self, device):
        return self


class RecordingPolicy:
    """A recurrent policy whose state is the running sum of s[0] over its inputs since the last start
    (pads are zero rows that start); its action is that sum. Records every call."""

    recurrent = True

    def __init__(self, device="cpu"):
        self.calls, self.device = [], device

    def initial_state(self, batch_size):
        return [torch.zeros(batch_size, device=self.device)]

    def sample(self, observations, state=None, starts=None):
        self.calls.append({"inputs": observations.clone(), "starts": starts.clone(), "state": state[0].clone()})
        x, s = (observations, starts) if observations.dim() == 3 else (observations[:, None], starts[:, None])
        total = state[0].clone()
        for k in range(x.shape[1]):
            total = torch.where(s[:, k], torch.zeros((), device=x.device), total) + x[:, k, 0]
        return total[:, None], [total]


def rollouts(dataset=None, horizon=50, dynamics=None, termination=never, device="cpu", **config):
    dataset = dataset if dataset is not None else episodes_dataset()
    dynamics = dynamics if dynamics is not None else FakePosterior()
    config.setdefault("quantile", -1.0)
    return PosteriorRollouts(dynamics, termination, Histories(dataset, horizon, device), PosteriorConfig(**config))


def episodes(rows):
    """The episodes of sequence rows, split at ``starts``."""
    starts = torch.nonzero(rows["starts"]).squeeze(1).tolist() + [len(rows["starts"])]
    return [{k: v[a:b] for k, v in rows.items()} for a, b in zip(starts[:-1], starts[1:])]


def prefix_length(episode):
    return int((~episode["synthetic"]).sum())


def data_episode(observation):
    """Episode e and row k of a data observation (100e + k, 0)."""
    return int(observation[0]) // 100, int(observation[0]) % 100


def test_histories_cut_at_the_horizon_and_the_cut_row_times_out():
    hist = Histories(episodes_dataset(), horizon=4)
    assert hist.lengths.tolist() == [3, 4, 4] and hist.num_positions == 3 + 4 + 4 + 3 and hist.max_length == 4
    assert hist.terminals.tolist() == [False] * 11  # episode 1's terminal was at row 4, now dropped
    assert hist.timeouts.tolist() == [False, False, True] + [False] * 3 + [True] + [False] * 3 + [True]
    assert hist.observations[:, 0].tolist() == [0, 1, 2, 100, 101, 102, 103, 200, 201, 202, 203]
    uncut = Histories(episodes_dataset(), horizon=5)
    assert uncut.terminals[7].item() and not uncut.timeouts[7].item()  # a terminal at the horizon stays terminal
    # s_t: the data's observation inside the episode, the last next observation at t = L
    torch.testing.assert_close(hist.observations_at(torch.tensor([0, 0, 1]), torch.tensor([1, 3, 4])),
                               torch.tensor([[1.0, 0.0], [3.0, 0.0], [104.0, 0.0]]))


def test_history_positions_are_uniform_over_all_positions_including_the_finished_one():
    hist = Histories(episodes_dataset(), horizon=50)  # 3 + 5 + 4 rows, 15 positions
    n = 45_000
    episode, t = hist.sample(n, torch.Generator().manual_seed(0))
    assert (t >= 0).all() and (t <= hist.lengths[episode]).all()
    counts = torch.bincount(episode * 10 + t, minlength=30)
    cells = [e * 10 + k for e, length in enumerate((3, 5, 4)) for k in range(length + 1)]
    assert counts.sum() == counts[cells].sum()  # nothing outside the 15 positions
    expected = n / 15
    chi2 = ((counts[cells].double() - expected) ** 2 / expected).sum().item()
    assert chi2 < 36.1  # the 0.999 quantile of chi-square with 14 degrees of freedom
    s0_episode, s0_t = hist.sample(3000, torch.Generator().manual_seed(1), start_from_s0=True)
    assert (s0_t == 0).all() and torch.bincount(s0_episode, minlength=3).min() > 900  # episodes, not rows


def test_member_is_constant_along_a_rollout_and_each_elite_drives_one_when_parallel_equals_elites():
    for parallel, expected in ((3, [4, 1, 7]), (6, [4, 4, 1, 1, 7, 7])):
        dynamics = FakePosterior(elites=(4, 1, 7))
        rows, stats = rollouts(dynamics=dynamics, parallel=parallel, start_from_s0=True, max_rollout_len=5).generate(
            RecordingPolicy(), None, torch.Generator().manual_seed(0))
        eps = episodes(rows)
        assert len(eps) == parallel and all(prefix_length(e) == 0 for e in eps)
        assert [e["member"].unique().tolist() for e in eps] == [[m] for m in expected]
        for call in dynamics.calls:  # every step asks each rollout's own elite
            assert call["members"].tolist() == expected
        assert stats["members_used"] == 3 and stats["member_share_max"] == pytest.approx(1 / 3)


def test_parallel_must_be_a_multiple_of_the_elites():
    with pytest.raises(ConfigError, match="multiple of the model's elites"):
        rollouts(dynamics=FakePosterior(elites=(0, 1, 2)), parallel=4)


def test_uncertainty_at_the_threshold_continues_and_above_it_truncates_at_that_row():
    dynamics = FakePosterior(threshold=3.0)
    rows, stats = rollouts(dynamics=dynamics, quantile=0.9, parallel=3, start_from_s0=True).generate(
        RecordingPolicy(), None, torch.Generator().manual_seed(0))
    assert dynamics.asked == [0.9]
    for e in episodes(rows):
        assert e["uncertainty"].tolist() == [1.0, 2.0, 3.0, 4.0]  # U = 3 = threshold continues; 4 > 3 is kept
        assert e["timeouts"].tolist() == [False, False, False, True] and not e["terminals"].any()
    assert stats["threshold"] == 3.0 and stats["uncertainty_truncated_fraction"] == 1.0
    assert stats["truncated_fraction"] == 1.0 and stats["time_limit_fraction"] == 0.0
    assert stats["horizon_q50"] == 4.0 and stats["uncertainty_mean"] == 2.5

    unlimited = FakePosterior(threshold=3.0)
    rows, stats = rollouts(dynamics=unlimited, quantile=-1.0, parallel=3, start_from_s0=True, horizon=9).generate(
        RecordingPolicy(), None)
    assert unlimited.asked == [] and stats["threshold"] == math.inf and len(rows["rewards"]) == 27


def test_clock_continues_from_the_prefix_and_truncates_exactly_at_the_horizon():
    horizon = 6
    rows, stats = rollouts(horizon=horizon, parallel=60, dynamics=FakePosterior()).generate(
        RecordingPolicy(), None, torch.Generator().manual_seed(0))
    eps = episodes(rows)
    seen = set()
    for e in eps:
        t = prefix_length(e)
        episode = data_episode(e["observations"][0])[0]  # s_0 of the data episode (a real or imagined row)
        length = (3, 5, 4)[episode]
        if t == length:  # a finished history: nothing imagined
            assert len(e["rewards"]) == length and not e["synthetic"].any()
        else:
            assert len(e["rewards"]) == horizon  # t real rows, then horizon - t imagined ones
            assert e["timeouts"][-1] and not e["timeouts"][:-1].any() and not e["terminals"].any()
        seen.add((episode, t))
    assert len(seen) > 10  # many different prefixes were drawn
    assert stats["time_limit_fraction"] == pytest.approx(1 - stats["finished_history_fraction"])

    capped, _ = rollouts(horizon=horizon, parallel=60, max_rollout_len=2).generate(
        RecordingPolicy(), None, torch.Generator().manual_seed(0))
    for e in episodes(capped):
        t, length = prefix_length(e), (3, 5, 4)[data_episode(e["observations"][0])[0]]
        assert int(e["synthetic"].sum()) == (0 if t == length else min(2, horizon - t))
        assert e["timeouts"][-1] or e["terminals"][-1]


def test_finished_histories_are_prefix_only_episodes_with_the_data_flags():
    rows, stats = rollouts(parallel=90).generate(RecordingPolicy(), None, torch.Generator().manual_seed(3))
    finished = [e for e in episodes(rows) if not e["synthetic"].any()]
    assert len(finished) == round(stats["finished_history_fraction"] * 90) and len(finished) > 5
    for e in finished:
        episode = data_episode(e["observations"][0])[0]
        assert len(e["rewards"]) == (3, 5, 4)[episode]
        assert e["terminals"][-1].item() == (episode == 1) and e["timeouts"][-1].item() == (episode != 1)


def test_a_terminal_row_ends_the_rollout():
    def terminal(next_obs):  # terminal once the first coordinate reaches 100e + 7
        return next_obs[..., 0] % 100 >= 7

    rows, stats = rollouts(parallel=3, start_from_s0=True, termination=terminal).generate(RecordingPolicy(), None)
    for e in episodes(rows):
        assert len(e["rewards"]) == 7 and e["terminals"].tolist() == [False] * 6 + [True]
        assert not e["timeouts"].any()
    assert stats["terminated_fraction"] == 1.0 and stats["truncated_fraction"] == 0.0


def test_prefix_rows_are_copied_from_the_data():
    dataset = episodes_dataset()
    rows, _ = rollouts(dataset, parallel=60).generate(RecordingPolicy(), None, torch.Generator().manual_seed(0))
    checked = 0
    for e in episodes(rows):
        t = prefix_length(e)
        assert not e["synthetic"][:t].any() and e["synthetic"][t:].all()
        if t == 0:
            continue
        episode, k = data_episode(e["observations"][0])
        assert k == 0  # a prefix starts at its episode's first row
        start = (0, 3, 8)[episode]
        for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
            expected = torch.as_tensor(getattr(dataset, key)[start:start + t])
            assert torch.equal(e[key][:t], expected), key
        assert torch.equal(e["observed_rewards"][:t], e["rewards"][:t])
        assert (e["member"][:t] == -1).all() and e["uncertainty"][:t].isnan().all()
        if t < (3, 5, 4)[episode]:  # the continuation starts at s_t
            assert e["observations"][t, 0] == 100 * episode + t
        checked += 1
    assert checked > 20


def test_warm_up_reads_the_whole_prefix_and_its_state_carries_through_the_rollout():
    policy = RecordingPolicy()
    rows, _ = rollouts(parallel=60, horizon=8).generate(policy, None, torch.Generator().manual_seed(0))
    warm = policy.calls[0]
    inputs, starts = warm["inputs"], warm["starts"]
    running = [e for e in episodes(rows) if e["synthetic"].any()]
    assert inputs.shape == (len(running), max(prefix_length(e) for e in running) + 1, 2 + 1 + 1)
    assert (warm["state"] == 0).all()
    for row, e in enumerate(running):
        t, width = prefix_length(e), inputs.shape[1]
        pad = width - 1 - t
        assert starts[row].tolist() == [True] * (pad + 1) + [False] * t
        assert (inputs[row, :pad] == 0).all()
        history = inputs[row, pad:]  # [s_k, a_{k-1}, r_{k-1}], k = 0..t
        torch.testing.assert_close(history[:, :2], e["observations"][:t + 1])
        torch.testing.assert_close(history[1:, 2], e["actions"][:t, 0])
        torch.testing.assert_close(history[1:, 3], e["rewards"][:t])
        assert (history[0, 2:] == 0).all()
        # The policy's action is the running sum of s[0] over every input since the start: the first
        # imagined action comes from the whole prefix, and the state is carried (and compacted) after it.
        torch.testing.assert_close(e["actions"][t:, 0], torch.cumsum(e["observations"][:, 0], 0)[t:])
    for call in policy.calls[1:]:  # step inputs: [s', a, raw r], never a start
        assert call["inputs"].dim() == 2 and not call["starts"].any()
        assert (call["inputs"][:, 3] == 7.0).all()


def test_stored_rewards_are_penalised_and_the_policy_sees_the_raw_ones():
    policy = RecordingPolicy()
    dynamics = FakePosterior(mean=2.0, reward=7.0)
    rows, stats = rollouts(dynamics=dynamics, parallel=3, start_from_s0=True, penalty_coef=0.5, horizon=5).generate(
        policy, None)
    synthetic = rows["synthetic"]
    torch.testing.assert_close(rows["observed_rewards"][synthetic], torch.full((15,), 7.0))
    torch.testing.assert_close(rows["rewards"][synthetic], 7.0 - 0.5 / 2.0 * rows["uncertainty"][synthetic])
    assert all((call["inputs"][:, 3] == 7.0).all() for call in policy.calls[1:])
    assert stats["return_mean"] == pytest.approx(5 * 7.0 - 0.25 * (1 + 2 + 3 + 4 + 5))


def test_rows_are_sequence_rows_and_transitions_count_the_prefixes():
    rows, stats = rollouts(parallel=60, horizon=7).generate(RecordingPolicy(), None, torch.Generator().manual_seed(2))
    eps = episodes(rows)
    assert len(eps) == 60 and rows["starts"].sum() == 60 and all(len(e["rewards"]) >= 1 for e in eps)
    assert all(e["starts"][0] and not e["starts"][1:].any() for e in eps)
    assert all(bool(e["terminals"][-1] or e["timeouts"][-1]) for e in eps)
    prefixes = sum(prefix_length(e) for e in eps)
    horizons = [int(e["synthetic"].sum()) for e in eps]
    assert stats["transitions"] == len(rows["rewards"]) == prefixes + sum(horizons)
    assert stats["rollout_transitions"] == sum(horizons) and stats["prefix_mean"] == pytest.approx(prefixes / 60)
    assert stats["horizon_max"] == max(horizons) and stats["horizon_mean"] == pytest.approx(sum(horizons) / 60)
    assert stats["horizon_q50"] == pytest.approx(float(np.quantile(horizons, 0.5)))
    # imagined rows chain: each row starts where the previous one ended
    for e in eps:
        t = prefix_length(e)
        torch.testing.assert_close(e["observations"][t + 1:], e["next_observations"][t:-1])
    assert set(rows) == {"observations", "actions", "rewards", "next_observations", "terminals", "timeouts",
                         "synthetic", "member", "uncertainty", "observed_rewards", "starts"}


def test_a_feed_forward_policy_acts_on_the_state_alone():
    policy = FunctionPolicy(lambda obs: obs[:, :1] * 2.0)
    rows, _ = rollouts(parallel=30, horizon=6).generate(policy, None, torch.Generator().manual_seed(0))
    synthetic = rows["synthetic"]
    torch.testing.assert_close(rows["actions"][synthetic, 0], rows["observations"][synthetic, 0] * 2.0)


def test_non_finite_predictions_are_dropped_and_cut_their_rollout():
    dynamics = FakePosterior(elites=(0, 1, 2), nan_member=1, nan_from=2)  # member 1's third step is NaN
    rows, stats = rollouts(dynamics=dynamics, parallel=3, start_from_s0=True, horizon=6).generate(
        RecordingPolicy(), None)
    eps = episodes(rows)
    assert [len(e["rewards"]) for e in eps] == [6, 2, 6]
    assert eps[1]["timeouts"].tolist() == [False, True] and torch.isfinite(rows["next_observations"]).all()
    assert stats["nonfinite_fraction"] == pytest.approx(1 / 3)


def test_rollouts_run_on_the_device_and_keep_their_rows_there(device):
    def run(where):
        dynamics = FakePosterior(threshold=3.0, mean=2.0)
        generator = torch.Generator(where).manual_seed(0)
        return rollouts(dynamics=dynamics, parallel=30, horizon=8, quantile=1.0, penalty_coef=0.5, device=where
                        ).generate(RecordingPolicy(where), None, generator)

    rows, stats = run(device)
    assert all(value.device.type == torch.device(device).type for value in rows.values())
    assert stats["transitions"] == len(rows["rewards"]) > 30
    synthetic = rows["synthetic"]
    torch.testing.assert_close(rows["rewards"][synthetic], 7.0 - 0.25 * rows["uncertainty"][synthetic])
    assert (rows["uncertainty"][synthetic] <= 4.0).all()  # truncated at the first U > 3


def test_config_checks():
    with pytest.raises(ConfigError, match="posterior.quantile"):
        PosteriorConfig(quantile=1.5)
    with pytest.raises(ConfigError, match="posterior.max_rollout_len"):
        PosteriorConfig(max_rollout_len=0)
    with pytest.raises(ConfigError, match="posterior.parallel"):
        PosteriorConfig(parallel=0)
    with pytest.raises(ConfigError, match="posterior.penalty_coef"):
        PosteriorConfig(penalty_coef=-1.0)
    with pytest.raises(ConfigError, match="posterior.deterministic_actions"):
        rollouts(parallel=3, deterministic_actions=True).generate(RecordingPolicy(), None)


def test_generator_defaults_are_neubays():
    config = PosteriorGeneratorConfig()
    assert config.utd == 0.05 and config.every == 0 and config.buffer_rows == 40_000_000
    assert config.mixing.rule == "tape" and config.mixing.kappa == 0.05
    assert config.posterior == PosteriorConfig(parallel=100, quantile=1.0, penalty_coef=0.0, max_rollout_len=-1)
    assert config.dynamics.ensemble_size == 128 and config.dynamics.num_elites == 100


def test_for_dataset_builds_histories_at_the_env_horizon_and_hands_over_its_model(monkeypatch):
    from mbrl_offline.buffer import MixingConfig
    from mbrl_offline.models.dynamics import DynamicsConfig

    dataset, fitted = episodes_dataset(), []
    dynamics = FakePosterior(threshold=2.0)

    def load_or_fit(data, config, cache_dir, device, progress):
        fitted.append((data, config))
        return dynamics, None

    env = SimpleNamespace(name="pendulum", termination_fn=never, max_episode_steps=4)
    monkeypatch.setattr(posterior_module, "load_or_fit_dynamics", load_or_fit)
    monkeypatch.setattr(posterior_module, "dataset_env", lambda dataset, where: env)
    config = PosteriorGeneratorConfig(posterior=PosteriorConfig(parallel=3, quantile=1.0),
                                      dynamics=DynamicsConfig(), mixing=MixingConfig(rule="weights"))
    generator = PosteriorGenerator.for_dataset(config, dataset)
    assert fitted == [(dataset, config.dynamics)] and generator.produces == "sequences"
    assert generator.rollouts.histories.lengths.tolist() == [3, 4, 4] and generator.buffer_capacity == 40_000_000
    assert set(generator.extra_fields) == {"synthetic", "member", "uncertainty", "observed_rewards"}
    rows, stats = generator.generate(RecordingPolicy(), None, torch.Generator().manual_seed(0))
    assert stats["threshold"] == 2.0 and rows["starts"].sum() == 3
    # a checkpoint keeps the model's fingerprint only (the trainer's rule); the model is handed over
    assert generator.state_dict() == {} and generator.model is dynamics and generator.dynamics is dynamics
    env_without = SimpleNamespace(name="pendulum", termination_fn=never)
    monkeypatch.setattr(posterior_module, "dataset_env", lambda dataset, where: env_without)
    with pytest.raises(ConfigError, match="max_episode_steps"):
        PosteriorGenerator.for_dataset(config, dataset)


def test_trainer_logs_the_posterior_statistics_to_tensorboard(tmp_path):
    """Through the trainer, with the real posterior at tiny sizes: rollout lengths, the truncation
    shares (all, by uncertainty, by the time limit) and the members used reach TensorBoard with the
    values of ``metrics.jsonl``."""
    import dataclasses

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mbrl_offline import build_run, load_dataset
    from mbrl_offline.algorithms.neubay import NEUBAY, NEUBAYConfig
    from mbrl_offline.logging import read_metrics
    from mbrl_offline.trainer import TrainerConfig

    data = load_dataset("pendulum-medium").subset(range(1000))
    published = NEUBAY.published_generator()
    dynamics = dataclasses.replace(published.dynamics, ensemble_size=4, num_elites=3, hidden_size=16, hidden_layers=2,
                                   min_epochs=0, max_epochs=2)
    generator = dataclasses.replace(published, dynamics=dynamics,
                                    posterior=dataclasses.replace(published.posterior, parallel=6))
    agent = dataclasses.replace(NEUBAYConfig(), batch_size=64, d_model=16, d_hidden=8, head_hidden=16)
    settings = TrainerConfig(epochs=2, updates_per_epoch=10, eval_every=2, eval_episodes=1, checkpoint_every=2,
                             run_dir=str(tmp_path / "run"), progress=False, tensorboard=True)
    build_run("neubay", data, agent, generator, settings, cache_dir=tmp_path / "cache").train()

    records = read_metrics(tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    names = ("horizon_mean", "horizon_q50", "horizon_max", "truncated_fraction", "uncertainty_truncated_fraction",
             "time_limit_fraction", "members_used", "member_share_max")
    tags = set(events.Tags()["scalars"])
    for name in names:
        assert f"rollout/{name}" in tags, name
        logged = [e.value for e in events.Scalars(f"rollout/{name}")]
        assert logged == pytest.approx([r["rollout"][name] for r in records if name in r.get("rollout", {})]), name
    assert 1 <= records[0]["rollout"]["members_used"] <= 3
    assert 0.0 <= records[0]["rollout"]["uncertainty_truncated_fraction"] <= records[0]["rollout"]["truncated_fraction"] <= 1.0


def test_a_refiner_refines_each_posterior_step_and_the_rollout_continues_from_it():
    """With ``posterior.refiner.enabled`` each model step's sample goes through the refiner (its single
    refinement), the stored rows and the next step start from what it returns, and U stays the model's."""
    from mbrl_offline.models.refiner import RefinerConfig

    class Shifting:
        def refine(self, obs, act, next_obs, rewards, generator=None, samples=None):
            assert samples == 1
            return {"next_observations": next_obs + torch.tensor([10.0, 0.0]), "rewards": rewards * 2}

    dynamics = FakePosterior()
    refined = PosteriorRollouts(dynamics, never, Histories(episodes_dataset(), 50),
                                PosteriorConfig(parallel=3, quantile=-1.0, start_from_s0=True, max_rollout_len=3,
                                                refiner=RefinerConfig(enabled=True)), Shifting())
    rows, _ = refined.generate(RecordingPolicy(), None, torch.Generator().manual_seed(0))
    for episode in episodes(rows):
        steps = episode["synthetic"]
        assert torch.equal(episode["next_observations"][steps][:, 0], episode["observations"][steps][:, 0] + 11.0)
        assert torch.equal(episode["observations"][steps][1:], episode["next_observations"][steps][:-1])
        assert bool((episode["observed_rewards"][steps] == 14.0).all())  # the model's 7, refined
        assert torch.equal(episode["uncertainty"][steps], episode["observations"][steps][:, 1] + 1.0)
    first, second = dynamics.calls[0]["obs"], dynamics.calls[1]["obs"]
    assert torch.equal(second, first + torch.tensor([11.0, 1.0]))  # the model's +1, then the refiner's +10
    with pytest.raises(ConfigError, match="no refiner was given"):
        PosteriorRollouts(dynamics, never, Histories(episodes_dataset(), 50),
                          PosteriorConfig(parallel=3, refiner=RefinerConfig(enabled=True)))
