import numpy as np
import pytest

from mbrl_offline import DatasetError, OfflineDataset, get_env_info

from conftest import rollout_dataset


def arrays(n=10, obs_dim=11, act_dim=3):
    rng = np.random.default_rng(0)
    return dict(observations=rng.normal(size=(n, obs_dim)), actions=rng.uniform(-1, 1, (n, act_dim)),
                rewards=rng.normal(size=n), next_observations=rng.normal(size=(n, obs_dim)),
                terminals=np.zeros(n, bool), timeouts=np.zeros(n, bool))


def test_arrays_become_float32_and_last_row_ends_an_episode():
    data = OfflineDataset(**arrays(), source="x")
    assert data.observations.dtype == np.float32 and data.terminals.dtype == bool
    assert data.timeouts[-1] and data.num_episodes == 1


def test_episode_returns_split_on_terminals_and_timeouts():
    a = arrays(n=6)
    a["rewards"] = np.arange(6.0)
    a["terminals"][1] = True
    a["timeouts"][3] = True
    data = OfflineDataset(**a)
    np.testing.assert_allclose(data.episode_returns(), [0 + 1, 2 + 3, 4 + 5])
    assert [(s.start, s.stop) for s in data.episode_slices()] == [(0, 2), (2, 4), (4, 6)]


@pytest.mark.parametrize("env,ret,expected", [
    ("hopper", 3234.3, 100.0), ("hopper", -20.272305, 0.0), ("halfcheetah", 12135.0, 100.0),
    ("walker2d", 1.629008, 0.0), ("ant", 3879.7, 100.0),
    ("hopper", (3234.3 - 20.272305) / 2, 50.0),
])
def test_normalized_score_matches_d4rl_constants(env, ret, expected):
    info = get_env_info(env)
    data = OfflineDataset(**arrays(obs_dim=info.obs_dim, act_dim=info.act_dim), ref_min_score=info.ref_min_score,
                          ref_max_score=info.ref_max_score)
    assert data.normalized_score(ret) == pytest.approx(expected, abs=1e-3)
    assert info.normalized_score(ret) == pytest.approx(expected, abs=1e-3)


def test_normalized_score_without_references_is_an_error():
    with pytest.raises(DatasetError, match="no reference scores"):
        OfflineDataset(**arrays(), source="mine").normalized_score(1.0)


def test_empty_dataset_is_rejected():
    with pytest.raises(DatasetError, match="empty"):
        OfflineDataset(**arrays(n=0), source="file.hdf5")


def test_ragged_arrays_are_rejected():
    a = arrays()
    a["actions"] = a["actions"][:-1]
    with pytest.raises(DatasetError, match=r"file.hdf5: arrays have different lengths .*actions=9"):
        OfflineDataset(**a, source="file.hdf5")


@pytest.mark.parametrize("key", ["observations", "actions", "rewards", "next_observations"])
def test_nan_and_inf_rows_are_rejected_with_their_row(key):
    a = arrays()
    a[key] = a[key].copy()
    a[key][4] = np.nan
    with pytest.raises(DatasetError, match=rf"'{key}' has 1 row\(s\) with NaN or Inf values \(first at row 4\)"):
        OfflineDataset(**a, source="f")
    a[key][4] = np.inf
    with pytest.raises(DatasetError, match="NaN or Inf"):
        OfflineDataset(**a, source="f")


def test_wrong_dimensions_for_the_env_are_rejected():
    data = OfflineDataset(**arrays(obs_dim=12), env_name="hopper", source="f")
    with pytest.raises(DatasetError, match="'observations' have dimension 12 but env 'hopper' expects 11"):
        data.validate(obs_dim=11, act_dim=3)


def test_wrong_rank_is_rejected():
    a = arrays()
    a["rewards"] = a["rewards"][:, None].repeat(2, axis=1)
    with pytest.raises(DatasetError, match="'rewards' has shape"):
        OfflineDataset(**a, source="f")


def test_concatenate_keeps_episode_boundaries():
    first, second = rollout_dataset("hopper", steps=40, seed=1), rollout_dataset("hopper", steps=30, seed=2)
    both = OfflineDataset.concatenate([first, second], source="both")
    assert len(both) == 70 and both.num_episodes == first.num_episodes + second.num_episodes
    np.testing.assert_allclose(both.episode_returns(),
                               np.concatenate([first.episode_returns(), second.episode_returns()]), rtol=1e-5)
