import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.data.envs import get_env_info

warnings.filterwarnings("ignore", message=".*eval_env.*")
# The tests use small tensors, which gain nothing from threads, and OpenMP threads that spin while
# other processes hold the cores slow them down many times over.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The slow learning tests first, their CPU variants before the CUDA ones (which skip without a GPU):
    under ``-n 2`` (setup.cfg) the two workers take them in turn from the start, instead of one worker
    running the last of them alone at the end."""
    def key(item):
        callspec = getattr(item, "callspec", None)
        cuda = callspec is not None and callspec.params.get("device") == "cuda"
        return item.get_closest_marker("slow") is None, cuda
    items.sort(key=key)  # stable: the order is kept otherwise


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder ``name`` in the session's temporary folder that pytest-xdist's workers share (the parent of
    each worker's own), for model caches whose file lock lets one worker fit a model while the other waits."""
    root = tmp_path_factory.getbasetemp()
    return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / name


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device (these variants run on a GPU machine)"))])
def device(request) -> str:
    """Runs a test on the CPU, and again on CUDA where there is a GPU."""
    return request.param


def rollout_dataset(env_name: str = "hopper", steps: int = 300, max_episode_steps: int = 25, seed: int = 0) -> OfflineDataset:
    """Random-action transitions from the real env; short time limits give both terminals and timeouts."""
    info = get_env_info(env_name)
    env = info.make(max_episode_steps=max_episode_steps)
    env.action_space.seed(seed)
    rows = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    episode = 0
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated)):
            rows[key].append(value)
        obs = next_obs
        if terminated or truncated:
            episode += 1
            obs, _ = env.reset(seed=seed + episode)
    return OfflineDataset(**{k: np.array(v) for k, v in rows.items()}, env_name=info.name, env_id=info.gym_id,
                          ref_min_score=info.ref_min_score, ref_max_score=info.ref_max_score,
                          source=f"{env_name}-random-rollout", metadata={"seed": seed})


@pytest.fixture
def hopper_data() -> OfflineDataset:
    data = rollout_dataset("hopper")
    assert data.terminals.any() and data.timeouts.any()
    return data


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def assert_same_transitions(a: OfflineDataset, b: OfflineDataset) -> None:
    for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)


class Interrupt(Exception):
    """A run killed from outside (`StopAfterEpoch1`), for the tests of exact resume."""


class StopAfterEpoch1:
    """A trainer callback that kills the run after epoch 1's evaluation and checkpoint (``raise Interrupt``)."""

    def on_eval(self, trainer, epoch, result):
        if epoch == 1:
            raise Interrupt
