"""Buffers: the transition buffer's schema with extra fields, the sequence buffer against a slow
reference written with Python lists, and the mixing rules' weights and extra fields."""
import numpy as np
import pytest
import torch

from mbrl_offline import load_dataset
from mbrl_offline.buffer import Mixing, MixingConfig, SequenceBuffer, TransitionBuffer
from mbrl_offline.errors import ConfigError

OBS, ACT = 2, 1


def rows(n: int, first: float, **extra):
    """n rows whose reward counts up from ``first`` (so every row is recognisable)."""
    return {"observations": torch.arange(n * OBS, dtype=torch.float32).view(n, OBS) + first,
            "actions": torch.full((n, ACT), first), "rewards": torch.arange(n, dtype=torch.float32) + first,
            "next_observations": torch.zeros(n, OBS), "terminals": torch.zeros(n, dtype=torch.bool),
            "timeouts": torch.zeros(n, dtype=torch.bool), **extra}


def test_declared_extra_fields_are_kept_and_others_refused(device):
    buffer = TransitionBuffer(8, OBS, ACT, device, extra_fields={"member": ((), torch.long), "u": ((), torch.float32)})
    buffer.add(**rows(5, 0.0, member=torch.arange(5), u=torch.linspace(0, 1, 5)))
    batch = buffer.sample(64, torch.Generator(device).manual_seed(0))
    assert batch["member"].dtype == torch.long and torch.equal(batch["member"].float(), batch["rewards"])
    with pytest.raises(ValueError, match="not in the schema: synthetic .declare them as extra fields."):
        buffer.add(**rows(2, 0.0, member=torch.zeros(2), u=torch.zeros(2), synthetic=torch.ones(2)))
    with pytest.raises(ValueError, match="missing u"):
        buffer.add(**rows(2, 0.0, member=torch.zeros(2)))
    plain = TransitionBuffer(8, OBS, ACT, device)
    with pytest.raises(ValueError, match="not in the schema: member"):  # never dropped silently
        plain.add(**rows(2, 0.0, member=torch.zeros(2)))


class Reference:
    """The same FIFO of whole episodes with Python lists, and windows built row by row."""

    def __init__(self, capacity):
        self.capacity, self.episodes, self.first = capacity, [], 0  # episodes: (absolute start, dict of rows)
        self.total = 0

    def add(self, episode):
        n = len(episode["rewards"])
        while self.total + n - self.first > self.capacity:
            start, old = self.episodes.pop(0)
            self.first = start + len(old["rewards"])
        self.episodes.append((self.total, episode))
        self.total += n

    def window(self, start, length):
        for first, episode in self.episodes:
            n = len(episode["rewards"])
            if first <= start < first + n:
                out = {k: [] for k in episode}
                mask, starts = [], []
                for t in range(length):
                    i = start - first + t
                    inside = i < n
                    for k, v in episode.items():
                        out[k].append(v[i] if inside else torch.zeros_like(v[0]))
                    mask.append(inside)
                    starts.append(inside and i == 0)
                return {**{k: torch.stack(v) for k, v in out.items()}, "mask": torch.tensor(mask),
                        "starts": torch.tensor(starts)}
        raise AssertionError(f"row {start} is not stored")


def test_sequence_windows_match_a_slow_reference_and_never_cross_an_episode(device):
    rng = np.random.default_rng(0)
    buffer, reference = SequenceBuffer(50, OBS, ACT, device), Reference(50)
    for e in range(30):  # ~150 rows through a 50-row buffer: old episodes are evicted whole
        episode = rows(int(rng.integers(1, 12)), 100.0 * e)
        buffer.add_episode(**episode)
        reference.add(episode)
        assert len(buffer) == reference.total - reference.first <= 50
    starts = torch.arange(buffer.first, buffer.total_added, device=device)  # every stored row
    got = buffer.windows(starts, 7)
    for b, start in enumerate(starts.tolist()):
        want = reference.window(start, 7)
        for key, value in want.items():
            assert torch.equal(got[key][b].cpu(), value), (key, start)
    # a window holds one episode: every valid row's reward is within 100 of its first row's
    valid = got["mask"]
    assert ((got["rewards"] - got["rewards"][:, :1]).abs()[valid] < 100).all()

    sample = buffer.sample(256, 7, torch.Generator(device).manual_seed(0))
    assert sample["observations"].shape == (256, 7, OBS) and sample["mask"][:, 0].all()
    assert sample["rewards"].device.type == device


def test_sequence_buffer_state_round_trip_and_dataset_episodes(device):
    data = load_dataset("pendulum-medium-replay")
    buffer = SequenceBuffer(2000, data.obs_dim, data.act_dim, device)
    buffer.add_dataset(data)  # the newest whole episodes that fit
    assert buffer.num_episodes == len(buffer) // 200 and len(buffer) <= 2000
    again = SequenceBuffer(2000, data.obs_dim, data.act_dim, device)
    again.load_state_dict(buffer.state_dict())
    a = buffer.sample(32, 10, torch.Generator(device).manual_seed(1))
    b = again.sample(32, 10, torch.Generator(device).manual_seed(1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert int(a["starts"].sum()) == int((a["mask"] & a["starts"]).sum())
    with pytest.raises(ValueError, match="does not fit a sequence buffer of 5 rows"):
        SequenceBuffer(5, OBS, ACT, device).add_episode(**rows(6, 0.0))


def two_buffers(device, n_real=300, n_synthetic=900, extra=None):
    """A real buffer whose rewards are 0..n_real-1 and a synthetic one whose rewards are 1000 + its rows
    (every row recognisable), the synthetic one with ``extra`` fields (name -> (shape, dtype, values))."""
    real = TransitionBuffer(n_real, OBS, ACT, device)
    real.add(**rows(n_real, 0.0))
    extra = extra or {}
    synthetic = TransitionBuffer(max(n_synthetic, 1), OBS, ACT, device,
                                 extra_fields={k: (shape, dtype) for k, (shape, dtype, _) in extra.items()})
    if n_synthetic:
        synthetic.add(**rows(n_synthetic, 1000.0, **{k: v for k, (_, _, v) in extra.items()}))
    return real, synthetic


def test_weights_rule_mixes_in_the_loss(device):
    real, synthetic = two_buffers(device)
    mixing = Mixing(MixingConfig(rule="weights", kappa=0.3))
    assert mixing.real_rows(256) is None
    rng = torch.Generator(device).manual_seed(0)
    drawn_real = 0
    for _ in range(40):
        batch = mixing.sample(real, synthetic, 256, rng)
        w, fake = batch["weights"], batch["synthetic"]
        assert w.shape == (256,) and w.dtype == torch.float32 and w.device.type == device
        # rows come from the buffer the mask names, whole (the observations match the rewards)
        assert torch.equal(fake, batch["rewards"] >= 1000)
        first = 1000.0 * fake  # each buffer's first reward (rows())
        assert torch.equal(batch["observations"][:, 0], 2 * batch["rewards"] - first)
        assert torch.equal(batch["actions"][:, 0], first)
        n_real = int((~fake).sum())
        assert 0 < n_real < 256
        torch.testing.assert_close(w[~fake], torch.full((n_real,), 0.3 / n_real, device=device))
        torch.testing.assert_close(w[~fake].sum(), torch.tensor(0.3, device=device))
        torch.testing.assert_close(w[fake].sum(), torch.tensor(0.7, device=device))
        torch.testing.assert_close(w.sum(), torch.tensor(1.0, device=device))
        drawn_real += n_real
    # uniform over the pooled rows: a quarter of them real (300 of 1200); 10,240 draws, sd ~ 0.004
    assert abs(drawn_real / (40 * 256) - 0.25) < 0.02
    rewards = torch.cat([mixing.sample(real, synthetic, 4096, rng)["rewards"] for _ in range(8)])
    real_rows, fake_rows = rewards[rewards < 1000], rewards[rewards >= 1000] - 1000
    assert real_rows.max() < 300 and fake_rows.max() < 900  # only stored rows
    assert real_rows.float().mean().item() == pytest.approx(149.5, abs=10)  # uniform within each buffer
    assert fake_rows.float().mean().item() == pytest.approx(449.5, abs=20)


def test_weights_rule_clips_empty_groups_and_without_synthetic_data_is_a_plain_mean(device):
    real, synthetic = two_buffers(device, n_real=1, n_synthetic=5000)
    mixing = Mixing(MixingConfig(rule="weights", kappa=0.2))
    batch = mixing.sample(real, synthetic, 8, torch.Generator(device).manual_seed(0))  # P(any real) ~ 0.2%
    assert batch["synthetic"].all()
    torch.testing.assert_close(batch["weights"], torch.full((8,), 0.8 / 8, device=device))  # sums to 1 - kappa
    real, empty = two_buffers(device, n_synthetic=0)
    for empty in (None, empty):
        batch = mixing.sample(real, empty, 16, torch.Generator(device).manual_seed(0))
        assert not batch["synthetic"].any() and (batch["rewards"] < 1000).all()
        torch.testing.assert_close(batch["weights"], torch.full((16,), 1 / 16, device=device))
    # kappa = 1: the synthetic rows weigh nothing; kappa = 0: the real rows
    real, synthetic = two_buffers(device)
    for kappa in (0.0, 1.0):
        batch = Mixing(MixingConfig(rule="weights", kappa=kappa)).sample(real, synthetic, 64,
                                                                         torch.Generator(device).manual_seed(1))
        zero = batch["synthetic"] if kappa == 1.0 else ~batch["synthetic"]
        assert (batch["weights"][zero] == 0).all() and batch["weights"].sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("kappa", [-0.1, 1.5])
def test_bad_kappa_is_refused_in_one_line(kappa):
    with pytest.raises(ConfigError) as error:
        MixingConfig(rule="weights", kappa=kappa)
    assert str(error.value).startswith(f"mixing.kappa must be between 0 and 1, got {kappa}") and "\n" not in str(error.value)


def test_the_sample_rules_are_unchanged_and_carry_no_weights(device):
    """fraction and counts: the same rows as drawing the real and then the synthetic rows directly."""
    real, synthetic = two_buffers(device)
    for config, n_real in ((MixingConfig(rule="fraction", real_ratio=0.25), 16), (MixingConfig(rule="counts", real_rows=5), 5)):
        batch = Mixing(config).sample(real, synthetic, 64, torch.Generator(device).manual_seed(3))
        rng = torch.Generator(device).manual_seed(3)
        fake, true = synthetic.sample(64 - n_real, rng), real.sample(n_real, rng)
        assert set(batch) == set(true) | {"synthetic"}
        for key in true:
            assert torch.equal(batch[key], torch.cat([true[key], fake[key]])), key
        assert torch.equal(batch["synthetic"], torch.arange(64, device=device) >= n_real)


@pytest.mark.parametrize("rule", ["fraction", "counts", "weights"])
def test_extra_fields_of_the_synthetic_rows_are_filled_in_the_real_rows(rule, device):
    extra = {"u": ((), torch.float32, torch.linspace(0, 1, 900)), "member": ((), torch.long, torch.arange(900) % 5),
             "flag": ((2,), torch.bool, torch.ones(900, 2, dtype=torch.bool))}
    real, synthetic = two_buffers(device, extra=extra)
    mixing = Mixing(MixingConfig(rule=rule, real_ratio=0.5, real_rows=20, kappa=0.5))
    batch = mixing.sample(real, synthetic, 64, torch.Generator(device).manual_seed(0))
    fake = batch["synthetic"]
    assert 0 < int(fake.sum()) < 64
    assert batch["u"].dtype == torch.float32 and batch["member"].dtype == torch.long and batch["flag"].shape == (64, 2)
    assert torch.isnan(batch["u"][~fake]).all() and torch.isfinite(batch["u"][fake]).all()
    assert (batch["member"][~fake] == -1).all() and (batch["member"][fake] >= 0).all()
    assert not batch["flag"][~fake].any() and batch["flag"][fake].all()
    index = (batch["rewards"][fake] - 1000).long()  # each synthetic row keeps its own extras
    torch.testing.assert_close(batch["u"][fake], synthetic.data["u"][index])
    # an all-real batch (no synthetic data yet, or a rule that draws all rows real) has the same fields
    empty = TransitionBuffer(10, OBS, ACT, device, extra_fields={k: synthetic.schema[k] for k in extra})
    all_real = Mixing(MixingConfig(rule=rule, real_ratio=1.0, real_rows=64, kappa=0.5))
    for other in (empty, synthetic) if rule != "weights" else (empty,):
        only_real = all_real.sample(real, other, 64)
        assert set(only_real) == set(batch) and not only_real["synthetic"].any()
        assert torch.isnan(only_real["u"]).all() and (only_real["member"] == -1).all() and not only_real["flag"].any()
