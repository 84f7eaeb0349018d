"""The datasets shipped inside the package."""
import os
import subprocess
import sys

import numpy as np
import pytest

import mbrl_offline as m
from mbrl_offline.data.envs import ENVS

REQUIRED = ["hopper-medium", "hopper-medium-replay", "halfcheetah-medium", "walker2d-medium",
            "pendulum-medium", "pendulum-medium-replay", "pendulum-expert", "pendulum-random", "pendulum-medium-expert"]


def test_required_datasets_are_bundled():
    assert set(REQUIRED) <= set(m.bundled_datasets())


@pytest.mark.parametrize("name", m.bundled_datasets())
def test_bundled_dataset_loads_with_env_scores_and_provenance(name):
    data = m.load_dataset(name)
    env, level = data.env_name, data.metadata["level"]
    assert name == f"{env}-{level}" and data.env_id == ENVS[env].gym_id
    assert (data.ref_min_score, data.ref_max_score) == (ENVS[env].ref_min_score, ENVS[env].ref_max_score)
    meta = data.metadata
    assert meta["transitions"] == len(data) and meta["episodes"] == data.num_episodes
    returns = data.episode_returns()
    assert meta["data_return_mean"] == pytest.approx(returns.mean(), rel=1e-6)
    if level in ("medium", "medium-replay"):
        assert meta["policy_eval_normalized_score"] >= meta["medium_score_threshold"]
    if env in ("hopper", "halfcheetah", "walker2d") and level == "medium":
        assert len(data) == 100_000  # rolled-out levels have dataset_size rows; medium-replay what training took
    # obs[t+1] == next_obs[t] inside every episode: the flat arrays were rebuilt correctly.
    continuing = ~data.episode_ends[:-1]
    np.testing.assert_array_equal(data.observations[1:][continuing], data.next_observations[:-1][continuing])


def test_medium_data_lies_between_random_and_expert():
    score = lambda name: m.load_dataset(name).metadata["data_normalized_score_mean"]
    assert score("pendulum-random") < score("pendulum-medium") < score("pendulum-expert")
    for name in ("hopper-medium", "halfcheetah-medium", "walker2d-medium"):
        assert 20 < score(name) < 80


def test_load_by_short_name_from_anywhere(tmp_path):
    code = "import mbrl_offline as m; d = m.load_dataset('hopper-medium'); print(len(d))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "empty")})
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 100_000
