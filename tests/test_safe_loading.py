"""Files the library writes with torch.save (training checkpoints, cached dynamics models, the
collector's state) hold tensors and plain data only and load with ``weights_only=True``: a file that
needs more, such as a pickle that runs code when it is loaded, is refused in one line and never
unpickled, by the library and by the tools."""
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mbrl_offline import load_dataset
from mbrl_offline.algorithms import load_policy
from mbrl_offline.cache import cache_key
from mbrl_offline.checkpoint import read_checkpoint
from mbrl_offline.collect import STATE_FILE, CollectConfig, collect
from mbrl_offline.errors import CheckpointError, MbrlOfflineError
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, cache_settings, load_or_fit_dynamics
from mbrl_offline.torch_files import load_plain, plain, save_plain
from tests.test_trainer import make_trainer

ROOT = Path(__file__).resolve().parents[1]
SMALL = DynamicsConfig(ensemble_size=3, num_elites=2, hidden_size=8, hidden_layers=1, weight_decay=(0.0, 0.0),
                       max_epochs=2)


class RunsCode:
    """An object whose unpickling calls ``open(marker, "w")``: it creates a file, as a malicious
    checkpoint could do anything else."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(2000))


def trained_checkpoint(data, tmp_path) -> Path:
    make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=1).train()
    return tmp_path / "run" / "checkpoint.pt"


def assert_refused_in_one_line(excinfo, path, marker, *phrases):
    message = str(excinfo.value)
    assert isinstance(excinfo.value, MbrlOfflineError) and "\n" not in message
    assert message.startswith(f"{path} holds more than tensors and plain data"), message
    assert all(phrase in message for phrase in phrases), message
    assert not marker.exists()  # nothing was unpickled


def test_a_checkpoint_is_plain_data_and_restores_every_random_state(data, tmp_path):
    path = trained_checkpoint(data, tmp_path)
    state = torch.load(path, weights_only=True)  # no pickled objects in it
    assert state["epoch"] == 1 and isinstance(state["rng"]["numpy"]["key"], list)
    drawn = (np.random.rand(3).tolist(), random.random())  # the states at the checkpoint, drawn from
    np.random.seed(123)
    random.seed(123)
    make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2).load_checkpoint(path)
    assert (np.random.rand(3).tolist(), random.random()) == drawn


def test_a_checkpoint_that_would_run_code_is_refused_by_every_reader(data, tmp_path):
    path = trained_checkpoint(data, tmp_path)
    marker = tmp_path / "code-ran"
    state = torch.load(path, weights_only=True)
    state["history"].append({"epoch": 1, "note": RunsCode(marker)})
    torch.save(state, path)
    for load in (read_checkpoint, load_policy,
                 lambda p: make_trainer(data, tmp_path / "run", tmp_path / "cache", epochs=2).train(resume=True)):
        with pytest.raises(CheckpointError) as excinfo:
            load(path)
        assert_refused_in_one_line(excinfo, path, marker, "open)", "could run code", "start a new run_dir")
    torch.load(path, weights_only=False)  # what the readers used to do: the file's code runs
    assert marker.exists()


def test_a_checkpoint_of_an_older_version_with_numpy_random_states_is_refused_with_what_to_do(data, tmp_path):
    path = trained_checkpoint(data, tmp_path)
    state = torch.load(path, weights_only=True)
    state["rng"]["numpy"] = np.random.get_state()  # as checkpoints held before they were plain data
    torch.save(state, path)
    with pytest.raises(CheckpointError) as excinfo:
        read_checkpoint(path)
    assert_refused_in_one_line(excinfo, path, tmp_path / "none", "numpy", "older version of mbrl_offline",
                               "cannot be resumed", "start a new run_dir")


def test_evaluate_refuses_a_checkpoint_that_would_run_code_in_one_line(tmp_path):
    marker, path = tmp_path / "code-ran", tmp_path / "checkpoint.pt"
    torch.save({"format": 2, "algorithm": "ravl", "payload": RunsCode(marker)}, path)
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "evaluate.py"), f"checkpoint={path}"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path} holds more than tensors and plain data"), \
        result.stderr
    assert not marker.exists()


def test_a_dynamics_model_that_would_run_code_is_refused_directly_and_from_the_cache(tmp_path):
    marker = tmp_path / "code-ran"
    model = GaussianEnsembleDynamics(3, 1, SMALL)
    path = model.save(tmp_path / "model.pt")
    saved = torch.load(path, weights_only=True)
    saved["train_log"] = [RunsCode(marker)]
    torch.save(saved, path)
    with pytest.raises(CheckpointError) as excinfo:
        GaussianEnsembleDynamics.load(path)
    assert_refused_in_one_line(excinfo, path, marker, "open)", "could run code")

    data = load_dataset("pendulum-medium").subset(range(600))
    cached = tmp_path / "cache" / f"{data.env_name}-{cache_key(data.fingerprint(), cache_settings(SMALL))}.pt"
    cached.parent.mkdir()
    cached.write_bytes(path.read_bytes())
    with pytest.raises(CheckpointError) as excinfo:
        load_or_fit_dynamics(data, SMALL, cache_dir=tmp_path / "cache", progress=False)
    assert_refused_in_one_line(excinfo, cached, marker, "delete it and it is fitted again")
    assert cached.read_bytes() == path.read_bytes()  # not overwritten either


def test_the_collectors_state_that_would_run_code_is_refused(tmp_path):
    marker, run_dir = tmp_path / "code-ran", tmp_path / "collect"
    run_dir.mkdir()
    torch.save({"config": {}, "payload": RunsCode(marker)}, run_dir / STATE_FILE)
    config = CollectConfig(env="pendulum", levels=("random",), run_dir=str(run_dir), progress=False,
                           minari_root=str(tmp_path / "minari"), export_hdf5=False)
    with pytest.raises(CheckpointError) as excinfo:
        collect(config)
    assert_refused_in_one_line(excinfo, run_dir / STATE_FILE, marker, "open)", "cannot be resumed")


def test_unreadable_files_are_refused_in_one_line(tmp_path):
    junk, truncated = tmp_path / "junk.pt", tmp_path / "truncated.pt"
    junk.write_bytes(b"not a checkpoint at all")
    save_plain({"weights": torch.ones(1000)}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:500])
    for path in (junk, truncated):
        with pytest.raises(CheckpointError, match=r"is not a readable checkpoint") as excinfo:
            load_plain(path)
        assert "\n" not in str(excinfo.value) and str(excinfo.value).startswith(str(path))


def test_only_plain_data_is_saved():
    """Numpy scalars become Python numbers; anything a weights-only load would refuse fails when it is
    saved, naming the entry, and nothing is written."""
    state = {"loss": np.float32(0.5), "steps": [np.int64(3)], "flag": np.bool_(True), "weights": torch.ones(2)}
    converted = plain(state)
    assert type(converted["loss"]) is float and type(converted["steps"][0]) is int and converted["flag"] is True
    assert converted["weights"] is state["weights"]
    module_state = torch.nn.Linear(2, 2).state_dict()
    assert plain(module_state) is module_state  # unchanged: the same object, metadata and all
    for bad, entry in (({"rng": {"key": np.zeros(3)}}, "['rng']['key'] is a numpy.ndarray"),
                       ({"history": [{"note": object()}]}, "['history'][0]['note'] is a builtins.object")):
        with pytest.raises(TypeError, match=entry.replace("[", r"\[").replace("]", r"\]")):
            plain(bad)


def test_save_plain_writes_nothing_when_refused(tmp_path):
    path = tmp_path / "state.pt"
    with pytest.raises(TypeError, match=r"state.pt\['bad'\]"):
        save_plain({"bad": np.zeros(2)}, path)
    assert list(tmp_path.iterdir()) == []
    save_plain({"good": np.float64(1.5)}, path)
    assert torch.load(path, weights_only=True) == {"good": 1.5}
