"""Buffers: the transition buffer's schema with extra fields, and the sequence buffer against a slow
reference written with Python lists."""
import numpy as np
import pytest
import torch

from mbrl_offline import load_dataset
from mbrl_offline.buffer import SequenceBuffer, TransitionBuffer

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
