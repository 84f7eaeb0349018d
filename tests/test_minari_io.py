import json

import minari
import numpy as np
import pytest

from mbrl_offline import DatasetError, load_dataset, write_minari
from mbrl_offline.data.minari_io import read_minari

from conftest import assert_same_transitions


def test_round_trip_through_minari_is_identical(minari_root, hopper_data):
    path = write_minari(hopper_data, "mbrl/hopper/test-v0")
    assert path == minari_root / "mbrl/hopper/test-v0"
    loaded = load_dataset("mbrl/hopper/test-v0")
    assert_same_transitions(hopper_data, loaded)
    assert (loaded.env_name, loaded.env_id, loaded.ref_min_score) == ("hopper", "Hopper-v5", -20.272305)
    assert loaded.metadata == {"seed": 0}
    assert load_dataset("minari:mbrl/hopper/test-v0").num_episodes == hopper_data.num_episodes
    assert load_dataset(str(path)).num_episodes == hopper_data.num_episodes  # by folder


def test_written_dataset_is_a_normal_minari_dataset(minari_root, hopper_data):
    write_minari(hopper_data, "mbrl/hopper/test-v0")
    ds = minari.load_dataset("mbrl/hopper/test-v0")
    assert ds.total_steps == len(hopper_data) and ds.total_episodes == hopper_data.num_episodes
    assert minari.get_normalized_score(ds, np.array([3234.3])) == pytest.approx(1.0)
    episode = next(ds.iterate_episodes())
    assert episode.observations.shape[0] == len(episode.rewards) + 1


def test_arrow_format_reads_too(minari_root, hopper_data):
    write_minari(hopper_data, "mbrl/hopper/arrow-v0", data_format="arrow")
    assert_same_transitions(hopper_data, load_dataset("mbrl/hopper/arrow-v0"))


def test_existing_dataset_is_not_overwritten(minari_root, hopper_data):
    path = write_minari(hopper_data, "mbrl/hopper/test-v0")
    before = (path / "data" / "main_data.hdf5").read_bytes()
    with pytest.raises(DatasetError, match="already exists"):
        write_minari(hopper_data, "mbrl/hopper/test-v0")
    assert (path / "data" / "main_data.hdf5").read_bytes() == before
    assert not [p for p in minari_root.iterdir() if p.name.startswith(".staging")]


def test_missing_minari_dataset_names_the_fix(minari_root):
    with pytest.raises(DatasetError) as info:
        load_dataset("mujoco/hopper/medium-v0")
    message = str(info.value)
    assert str(minari_root / "mujoco/hopper/medium-v0") in message
    assert "mbrl-collect env=hopper collect.namespace=mujoco" in message and "minari download mujoco/hopper/medium-v0" in message


def test_corrupt_minari_file_is_reported(minari_root, hopper_data):
    path = write_minari(hopper_data, "mbrl/hopper/test-v0")
    data_file = path / "data" / "main_data.hdf5"
    data_file.write_bytes(data_file.read_bytes()[:2000])
    with pytest.raises(DatasetError, match="corrupt or truncated"):
        load_dataset("mbrl/hopper/test-v0")


def test_nan_in_minari_dataset_is_reported(minari_root, hopper_data):
    hopper_data.rewards[3] = np.nan  # bypasses validation, as a buggy writer would
    path = write_minari(hopper_data, "mbrl/hopper/test-v0")
    with pytest.raises(DatasetError, match=r"'rewards' has 1 row\(s\) with NaN"):
        read_minari(path)


def test_provenance_is_stored_in_minari_metadata(minari_root, hopper_data):
    hopper_data.metadata = {"policy_eval_return": 123.5, "seed": 3}
    path = write_minari(hopper_data, "mbrl/hopper/test-v0")
    meta = json.loads((path / "data" / "metadata.json").read_text())
    assert json.loads(meta["mbrl_offline"]) == {"policy_eval_return": 123.5, "seed": 3}
    assert meta["ref_max_score"] == 3234.3 and meta["ref_min_score"] == -20.272305


def test_dataset_for_an_env_outside_the_registry_keeps_its_own_settings(minari_root, hopper_data):
    hopper_data.env_name, hopper_data.env_id, hopper_data.ref_max_score = None, "Hopper-v4", 3000.0
    write_minari(hopper_data, "other/hopper/v4-v0")
    loaded = load_dataset("other/hopper/v4-v0")
    assert (loaded.env_name, loaded.env_id, loaded.ref_max_score) == (None, "Hopper-v4", 3000.0)
    # Naming a registry env explicitly evaluates it there, after checking the sizes fit.
    assert load_dataset("other/hopper/v4-v0", env="hopper").env_id == "Hopper-v5"
    with pytest.raises(DatasetError, match="expects 17"):
        load_dataset("other/hopper/v4-v0", env="walker2d")
