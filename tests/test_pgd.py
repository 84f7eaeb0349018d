"""Policy-guided diffusion (``generator=pgd``): PGD's temporal U-Net, the training windows, the rows'
encoding, policy guidance of the sampler, the generation schedule, and composition with agents.

Everything runs at tiny sizes (a U-Net of base 16, a few hundred fitting steps) on the bundled
pendulum data; the guidance test fits a small model so that guidance has to work against a prior."""
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
