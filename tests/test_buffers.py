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


# ------------------------------------------------------------------ sequences: add_episodes, tapes, the tape rule
def episode(n: int, first: float, synthetic=None):
    """An episode of n recognisable rows (rewards first, first + 1, ...), whose next observations are
    the observations shifted by 0.5 (so the final row of a tape is recognisable too)."""
    out = rows(n, first)
    out["next_observations"] = out["observations"] + 0.5
    if synthetic is not None:
        out["synthetic"] = torch.full((n,), synthetic)
    return out


def concatenated(episodes):
    """Episodes as a generator returns them: fields concatenated and ``starts`` at each first row."""
    out = {k: torch.cat([e[k] for e in episodes]) for k in episodes[0]}
    out["starts"] = torch.cat([torch.arange(len(e["rewards"])) == 0 for e in episodes])
    return out


def test_add_episodes_splits_by_starts_as_add_episode_does(device):
    rng = np.random.default_rng(1)
    episodes = [episode(int(rng.integers(1, 9)), 100.0 * e) for e in range(12)]  # ~55 rows through 30
    one_by_one, together = SequenceBuffer(30, OBS, ACT, device), SequenceBuffer(30, OBS, ACT, device)
    for e in episodes[:3]:
        one_by_one.add_episode(**e)
    for e in episodes[3:]:
        one_by_one.add_episode(**e)
    together.add_episodes(**concatenated(episodes[:3]))
    together.add_episodes(**concatenated(episodes[3:]))  # more rows than the buffer holds: the newest fit
    assert list(together.episode_lengths) == list(one_by_one.episode_lengths)
    assert (together.first, together.total_added) == (one_by_one.first, one_by_one.total_added)
    for a, b in ((together.state_dict()["rows"], one_by_one.state_dict()["rows"]),):
        assert all(torch.equal(a[k], b[k]) for k in a)
    everywhere = torch.arange(together.first, together.total_added, device=device)
    a, b = together.windows(everywhere, 5), one_by_one.windows(everywhere, 5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    stored = [len(e["rewards"]) for e in episodes]
    assert list(together.episode_lengths) == stored[len(stored) - together.num_episodes:]
    with pytest.raises(ValueError, match="first row of the sequences must start an episode"):
        together.add_episodes(**{**concatenated(episodes[:2]), "starts": torch.zeros(
            len(episodes[0]["rewards"]) + len(episodes[1]["rewards"]), dtype=torch.bool)})


def slow_tape(stored: list[dict], draws: list[int], length: int) -> dict:
    """A port of NEUBAY's ``TapeBuffer.sample`` with Python lists: for each drawn episode (index into
    the stored ones, oldest first) its rows and then its final row, until ``length`` rows, cut."""
    out = {k: [] for k in (*stored[0], "starts", "final")}
    for i in draws:
        e = stored[i]
        n = len(e["rewards"])
        for t in range(n + 1):
            final = t == n
            for k, v in e.items():
                out[k].append(v[n - 1] if final else v[t])
            if final:
                out["observations"][-1] = e["next_observations"][n - 1]
            out["starts"].append(torch.tensor(t == 0))
            out["final"].append(torch.tensor(final))
        if len(out["rewards"]) >= length:
            break
    assert len(out["rewards"]) >= length, "too few draws for the tape"
    return {k: torch.stack(v)[:length] for k, v in out.items()}


def test_tape_matches_a_port_of_the_official_sampler_after_eviction_and_wrap_around(device):
    rng = np.random.default_rng(2)
    buffer, reference = SequenceBuffer(40, OBS, ACT, device, extra_fields={"synthetic": ((), torch.bool)}), Reference(40)
    for e in range(25):  # ~125 rows through 40: evicted whole, stored across the ring's end
        ep = episode(int(rng.integers(1, 9)), 100.0 * e, synthetic=bool(e % 2))
        buffer.add_episode(**ep)
        reference.add(ep)
    stored = [e for _, e in reference.episodes]
    assert buffer.num_episodes == len(stored) and buffer.first % 40 != 0  # the ring has wrapped
    for length in (1, 7, 23, 60):
        draws = rng.integers(0, len(stored), 40).tolist()
        got = buffer.tape(length, episode_ids=torch.tensor(draws, device=device))
        want = slow_tape(stored, draws, length)
        assert set(got) == set(want)
        for key, value in want.items():
            assert torch.equal(got[key].cpu(), value), (length, key)
    # drawn: every tape starts at a start, its final rows hold the next observations, only the last episode is cut
    tape = buffer.tape(200, torch.Generator(device).manual_seed(0))
    assert tape["starts"][0] and tape["observations"].shape == (200, OBS) and tape["synthetic"].dtype == torch.bool
    before_start = torch.cat([tape["starts"][1:], torch.ones(1, dtype=torch.bool, device=device)])
    assert torch.equal(tape["final"][:-1], before_start[:-1])  # a final row comes right before each start
    torch.testing.assert_close(tape["observations"][tape["final"]], tape["next_observations"][tape["final"]])
    plain = SequenceBuffer(10, OBS, ACT, device)
    plain.add_episode(**episode(3, 0.0))
    assert not plain.tape(8)["synthetic"].any()  # no synthetic field stored: every row real


def test_tapes_are_uniform_over_episodes_not_rows(device):
    buffer = SequenceBuffer(100, OBS, ACT, device)
    buffer.add_episode(**episode(1, 0.0))
    buffer.add_episode(**episode(39, 1000.0))
    rng = torch.Generator(device).manual_seed(0)
    firsts = torch.stack([buffer.tape(3, rng)["rewards"][0] for _ in range(2000)])
    share = (firsts == 0.0).float().mean().item()  # row-uniform would give 1/40; sd of the share ~ 0.011
    assert abs(share - 0.5) < 0.05
    assert torch.isin(firsts, torch.tensor([0.0, 1000.0], device=device)).all()  # a tape starts at a start


def hand_weights(starts, synthetic, kappa):
    """The tape rule's weights written out with loops (the contract's formula)."""
    T = len(starts)
    m = [(not starts[k + 1]) if k < T - 1 else False for k in range(T)]
    n_real = sum(1 for k in range(T) if m[k] and not synthetic[k])
    n_fake = sum(1 for k in range(T) if m[k] and synthetic[k])
    return [0.0 if not m[k] else (kappa / max(1, n_real) if not synthetic[k] else (1 - kappa) / max(1, n_fake))
            for k in range(T)]


@pytest.mark.parametrize("starts, synthetic", [
    ([1, 0, 0, 1, 0, 0, 0, 1, 0], [0, 0, 0, 1, 1, 1, 1, 0, 0]),  # both groups, a final row before each start
    ([1, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]),  # no synthetic row: the empty group weighs nothing
    ([1, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]),  # no real row; a one-row "episode" (only its final row)
])
def test_tape_weights_match_a_hand_computation(starts, synthetic, device):
    from mbrl_offline.buffer import tape_weights

    kappa = 0.3
    got = tape_weights(torch.tensor(starts, dtype=torch.bool, device=device),
                       torch.tensor(synthetic, dtype=torch.bool, device=device), kappa)
    want = hand_weights([bool(s) for s in starts], [bool(s) for s in synthetic], kappa)
    torch.testing.assert_close(got.cpu(), torch.tensor(want))
    assert got[-1] == 0 and (got[torch.tensor(starts[1:] + [1], dtype=torch.bool, device=device)] == 0).all()
    if not any(synthetic):
        assert got.sum().item() == pytest.approx(kappa)
    # the first case by hand: masked rows 0, 1, 7 (real) and 3, 4, 5 (synthetic); 2 and 6 precede a start
    if len(starts) == 9:
        torch.testing.assert_close(got.cpu(), torch.tensor([0.1, 0.1, 0, 0.7 / 3, 0.7 / 3, 0.7 / 3, 0, 0.1, 0]))


def test_tape_rule_draws_from_the_synthetic_sequences_or_else_the_real_ones(device):
    real = SequenceBuffer(50, OBS, ACT, device)
    for e in range(4):
        real.add_episode(**episode(5, 100.0 * e))
    synthetic = SequenceBuffer(50, OBS, ACT, device, extra_fields={"synthetic": ((), torch.bool)})
    mixing = Mixing(MixingConfig(rule="tape", kappa=0.25))
    assert mixing.real_rows(64) is None
    for empty in (None, synthetic):  # no synthetic data yet: a tape of the dataset, every row real
        tape = mixing.sample(real, empty, 16, torch.Generator(device).manual_seed(0))
        assert (tape["rewards"] < 1000).all() and not tape["synthetic"].any() and "final" in tape
        torch.testing.assert_close(tape["weights"], tape_weights_of(tape, 0.25))
    synthetic.add_episodes(**concatenated([episode(6, 1000.0, synthetic=False), episode(3, 2000.0, synthetic=True)]))
    tape = mixing.sample(real, synthetic, 40, torch.Generator(device).manual_seed(0))
    assert (tape["rewards"] >= 1000).all() and torch.equal(tape["synthetic"], tape["rewards"] >= 2000)
    torch.testing.assert_close(tape["weights"], tape_weights_of(tape, 0.25))
    assert tape["weights"][~tape["synthetic"]].sum().item() == pytest.approx(0.25)
    with pytest.raises(ConfigError, match="mixing.rule=tape draws tapes of episodes from sequence buffers"):
        mixing.sample(TransitionBuffer(5, OBS, ACT, device), None, 4)


def tape_weights_of(tape, kappa):
    return torch.tensor(hand_weights(tape["starts"].tolist(), tape["synthetic"].tolist(), kappa),
                        device=tape["starts"].device)
