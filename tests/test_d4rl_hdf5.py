import h5py
import numpy as np
import pytest

from mbrl_offline import DatasetError, load_dataset, write_d4rl_hdf5
from mbrl_offline.data.d4rl_hdf5 import read_d4rl_hdf5

from conftest import assert_same_transitions


def write_raw(path, **arrays):
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value)
    return path


def raw_arrays(data, keys=("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")):
    return {k: getattr(data, k) for k in keys}


def test_round_trip_is_identical(tmp_path, hopper_data):
    path = write_d4rl_hdf5(hopper_data, tmp_path / "hopper_random.hdf5")
    loaded = load_dataset(str(path))
    assert_same_transitions(hopper_data, loaded)
    assert loaded.env_id == "Hopper-v5" and loaded.ref_max_score == 3234.3
    assert loaded.metadata == {"seed": 0}


def test_exported_reference_scores_are_kept(tmp_path, hopper_data):
    hopper_data.ref_min_score, hopper_data.ref_max_score = 0.0, 1000.0
    loaded = load_dataset(str(write_d4rl_hdf5(hopper_data, tmp_path / "anything.hdf5")))
    assert (loaded.env_name, loaded.ref_min_score, loaded.ref_max_score) == ("hopper", 0.0, 1000.0)
    assert loaded.normalized_score(500.0) == 50.0


def test_d4rl_file_with_next_observations_keeps_timed_out_last_transitions(tmp_path, hopper_data):
    path = write_raw(tmp_path / "hopper_medium-v2.hdf5", **raw_arrays(hopper_data))
    loaded = load_dataset(str(path))  # env read from the file name, as for D4RL's own files
    assert loaded.env_name == "hopper" and loaded.ref_min_score == pytest.approx(-20.272305)
    assert len(loaded) == len(hopper_data)
    assert_same_transitions(hopper_data, loaded)


def test_d4rl_file_without_next_observations_drops_rows_without_successor(tmp_path, hopper_data):
    path = write_raw(tmp_path / "hopper_old.hdf5",
                     **raw_arrays(hopper_data, ("observations", "actions", "rewards", "terminals", "timeouts")))
    loaded = load_dataset(str(path))
    # d4rl.qlearning_dataset semantics: a timed-out episode's last row has no successor in the file.
    keep = ~hopper_data.timeouts | hopper_data.terminals
    assert (hopper_data.timeouts & hopper_data.terminals).any()  # the case d4rl gets wrong is covered
    assert len(loaded) == keep.sum()
    np.testing.assert_array_equal(loaded.observations, hopper_data.observations[keep])
    # Terminal rows stay (their next row is another episode's start, flagged in the metadata);
    # every other successor is the next row, which equals the true next observation.
    assert loaded.terminals.sum() == hopper_data.terminals.sum()
    assert loaded.metadata == {"inferred_next_observations": True}
    continuing = ~loaded.terminals
    np.testing.assert_array_equal(loaded.next_observations[continuing],
                                  hopper_data.next_observations[keep][continuing])


def test_d4rl_file_without_timeouts_and_with_column_rewards(tmp_path, hopper_data):
    arrays = raw_arrays(hopper_data, ("observations", "actions", "next_observations", "terminals"))
    arrays["rewards"] = hopper_data.rewards[:, None]  # some exporters store (N, 1)
    loaded = load_dataset(str(write_raw(tmp_path / "walker.hdf5", **arrays)), env="hopper")
    np.testing.assert_array_equal(loaded.rewards, hopper_data.rewards)
    assert not loaded.timeouts[:-1].any() and loaded.timeouts[-1] == (not hopper_data.terminals[-1])


def test_missing_key(tmp_path, hopper_data):
    path = write_raw(tmp_path / "hopper_x.hdf5", **raw_arrays(hopper_data, ("observations", "actions", "rewards")))
    with pytest.raises(DatasetError, match=r"hopper_x.hdf5: missing key\(s\) \['terminals'\]"):
        load_dataset(str(path))


def test_ragged_lengths(tmp_path, hopper_data):
    arrays = raw_arrays(hopper_data)
    arrays["actions"] = arrays["actions"][:-5]
    with pytest.raises(DatasetError, match="arrays have different lengths"):
        load_dataset(str(write_raw(tmp_path / "hopper_x.hdf5", **arrays)))


def test_nan_row(tmp_path, hopper_data):
    arrays = raw_arrays(hopper_data)
    arrays["observations"] = arrays["observations"].copy()
    arrays["observations"][7, 2] = np.nan
    with pytest.raises(DatasetError, match=r"'observations' has 1 row\(s\) with NaN or Inf values \(first at row 7\)"):
        load_dataset(str(write_raw(tmp_path / "hopper_x.hdf5", **arrays)))


def test_wrong_observation_dimension_for_the_env(tmp_path, hopper_data):
    arrays = raw_arrays(hopper_data)
    arrays["observations"] = np.pad(arrays["observations"], ((0, 0), (0, 6)))
    arrays["next_observations"] = np.pad(arrays["next_observations"], ((0, 0), (0, 6)))
    with pytest.raises(DatasetError, match="'observations' have dimension 17 but env 'hopper' expects 11"):
        load_dataset(str(write_raw(tmp_path / "hopper_x.hdf5", **arrays)))


def test_truncated_file(tmp_path, hopper_data):
    path = write_d4rl_hdf5(hopper_data, tmp_path / "hopper_x.hdf5")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="cannot read the HDF5 file .* corrupt or truncated"):
        load_dataset(str(path))


def test_corrupt_file(tmp_path):
    path = tmp_path / "hopper_x.hdf5"
    path.write_bytes(b"this is not an HDF5 file" * 100)
    with pytest.raises(DatasetError, match="corrupt or truncated"):
        load_dataset(str(path))


def test_missing_file_and_unknown_env(tmp_path, hopper_data):
    with pytest.raises(DatasetError, match="file not found"):
        load_dataset(str(tmp_path / "nothing.hdf5"))
    path = write_raw(tmp_path / "mystery.hdf5", **raw_arrays(hopper_data))
    with pytest.raises(DatasetError, match="cannot tell which environment"):
        load_dataset(str(path))


def test_export_refuses_to_overwrite_and_writes_atomically(tmp_path, hopper_data):
    path = write_d4rl_hdf5(hopper_data, tmp_path / "out.hdf5")
    before = path.read_bytes()
    with pytest.raises(DatasetError, match="already exists"):
        write_d4rl_hdf5(hopper_data, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.hdf5"]  # no temporary files left
    assert read_d4rl_hdf5(path).metadata == {}  # provenance lives in attributes, read by load_dataset


def test_rewards_of_two_columns_are_refused_as_not_one_column(tmp_path, hopper_data):
    arrays = raw_arrays(hopper_data)
    arrays["rewards"] = np.stack([arrays["rewards"], arrays["rewards"]], axis=1)
    path = write_raw(tmp_path / "hopper_two.hdf5", **arrays)
    assert_refused_in_one_line(path, f"{path}: 'rewards' has shape ({len(hopper_data)}, 2); it must be one column",
                               "different lengths")


def assert_refused_in_one_line(path, start: str, wrong_words: str) -> None:
    """Loading ``path`` raises one `DatasetError` line that starts with ``start`` and lacks ``wrong_words``."""
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(str(path))
    message = str(excinfo.value)
    assert "\n" not in message and wrong_words not in message
    assert message.startswith(start), message


def test_observations_stored_as_a_group_are_named_a_group_not_a_corrupt_file(tmp_path, hopper_data):
    path = write_raw(tmp_path / "hopper_group.hdf5", **raw_arrays(hopper_data, ("actions", "rewards", "terminals")))
    with h5py.File(path, "a") as f:
        f.create_group("observations").create_dataset("x", data=hopper_data.observations)
    assert_refused_in_one_line(path, f"{path}: 'observations' is a group where an array is expected", "corrupt")


def test_actions_far_outside_the_envs_bounds_load_with_a_one_line_warning(tmp_path, hopper_data):
    import warnings

    from mbrl_offline.errors import DatasetWarning

    arrays = raw_arrays(hopper_data)
    path = write_raw(tmp_path / "hopper_scaled.hdf5", **{**arrays, "actions": 3.0 * np.sign(arrays["actions"])})
    with pytest.warns(DatasetWarning) as record:
        loaded = load_dataset(str(path))
    assert len(loaded) == len(hopper_data)  # it still loads
    message = str(record[0].message)
    assert "\n" not in message and record[0].filename == __file__  # points at the caller's line
    assert message.startswith(f"{path}: ") and "far outside hopper's action bounds" in message, message
    assert "rescale the actions into the bounds" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in-bounds data loads silently
        load_dataset(str(write_raw(tmp_path / "hopper_fine.hdf5", **arrays)))
