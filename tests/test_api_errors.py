"""The Python API refuses bad calls as the tools do: a library exception (`MbrlOfflineError`, and
ValueError or TypeError as fits) with one line that names the problem and the fix, never a silent NaN
or an AttributeError or shape error from deep inside. The classes: arguments of the wrong type,
observations of the wrong shape or with NaN/inf values for any agent's ``act``, and a dynamics model
asked to predict before it was fitted."""
import dataclasses

import numpy as np
import pytest
import torch

from mbrl_offline import build_run, load_dataset
from mbrl_offline.algorithms import ALGORITHMS, RAVLConfig, load_policy
from mbrl_offline.checkpoint import read_checkpoint
from mbrl_offline.data.envs import get_env_info
from mbrl_offline.errors import InputError, InputTypeError, MbrlOfflineError, NotFittedError
from mbrl_offline.generators import RolloutGeneratorConfig
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics
from mbrl_offline.trainer import Trainer, TrainerConfig
from tests.test_dynamics import linear_gaussian_data

ENV = get_env_info("pendulum")  # observations of width 3, actions of width 1
SMALL = DynamicsConfig(ensemble_size=3, num_elites=2, hidden_size=8, hidden_layers=1, weight_decay=(0.0, 0.0),
                       max_epochs=2)


def one_line(error: Exception) -> str:
    message = str(error)
    assert isinstance(error, MbrlOfflineError) and message and "\n" not in message
    return message


@pytest.fixture(scope="module")
def data():
    return load_dataset("pendulum-medium").subset(range(500))


@pytest.fixture(scope="module", params=sorted(ALGORITHMS))
def agent(request):
    agent_cls, config_cls = ALGORITHMS[request.param]
    low, high = ENV.action_bounds()
    small = {k: v for k, v in dict(hidden_size=16, d_model=16, d_hidden=8, head_hidden=16).items()
             if k in {f.name for f in dataclasses.fields(config_cls)}}  # whichever widths the agent's config has
    return agent_cls(ENV.obs_dim, ENV.act_dim, low, high, dataclasses.replace(config_cls(), **small))


# ---------------------------------------------------------------------------- act, for every agent
def test_act_takes_one_observation_or_a_batch(agent):
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    assert agent.act(obs[0], deterministic=True).shape == (1,)
    assert agent.act(obs, deterministic=True).shape == (5, 1)
    assert agent.act(obs.tolist(), deterministic=True).shape == (5, 1)  # any array-like of numbers
    assert agent.act(torch.as_tensor(obs, dtype=torch.float64), deterministic=True).shape == (5, 1)


@pytest.mark.parametrize("shape", [(4,), (2,), (5, 4), (5, 2), (2, 5, 3), (), (3, 1)])
def test_act_refuses_observations_of_another_shape(agent, shape):
    with pytest.raises(InputError) as excinfo:
        agent.act(np.zeros(shape, np.float32), deterministic=True)
    message = one_line(excinfo.value)
    assert isinstance(excinfo.value, ValueError)
    assert message.startswith(f"{agent.name}.act: observations must have shape (3,) (one) or (batch, 3), "
                              f"got {shape}"), message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_act_refuses_nan_and_infinite_observations(agent, bad, as_tensor):
    batch = np.zeros((4, 3), np.float32)
    batch[2, 1] = bad
    single = batch[2]
    wrap = torch.as_tensor if as_tensor else (lambda x: x)
    for obs, where in ((batch, "row 2 of the batch"), (single, "the observation")):
        with pytest.raises(InputError) as excinfo:
            agent.act(wrap(obs), deterministic=True)
        assert one_line(excinfo.value).startswith(f"{agent.name}.act: {where} holds NaN or infinite values")


@pytest.mark.parametrize("obs", [None, "0.1 0.2 0.3", {"obs": [0.0, 0.0, 0.0]}, [[0.0, 0.0], [0.0]]],
                         ids=["none", "str", "dict", "ragged"])
def test_act_refuses_what_is_not_numbers(agent, obs):
    with pytest.raises(InputTypeError) as excinfo:
        agent.act(obs, deterministic=True)
    assert isinstance(excinfo.value, TypeError)
    assert one_line(excinfo.value).startswith(f"{agent.name}.act: observations must be numbers")


# ----------------------------------------------------------------------------- the unfitted model
def test_an_unfitted_model_refuses_to_predict_and_a_fitted_or_loaded_one_predicts(tmp_path):
    model = GaussianEnsembleDynamics(3, 1, SMALL)
    obs, act = torch.zeros(4, 3), torch.zeros(4, 1)
    calls = {"predict": lambda: model.predict(obs, act), "step": lambda: model.step(obs, act),
             "sample_next_observations": lambda: model.sample_next_observations(obs, act, 2)}
    for name, call in calls.items():
        with pytest.raises(NotFittedError, match=r"never fitted.*call fit\(dataset\) first") as excinfo:
            call()
        one_line(excinfo.value)
    unfitted = model.save(tmp_path / "unfitted.pt")
    with pytest.raises(NotFittedError):
        GaussianEnsembleDynamics.load(unfitted).step(obs, act)

    model.fit(linear_gaussian_data(n=600), progress=False)
    assert model.is_fitted and bool(model.fitted)
    for call in calls.values():
        call()
    loaded = GaussianEnsembleDynamics.load(model.save(tmp_path / "fitted.pt"))
    assert loaded.is_fitted
    loaded.step(obs, act)
    again = GaussianEnsembleDynamics(3, 1, SMALL)
    again.load_state_dict(model.state_dict())  # a generator's state in a checkpoint
    assert again.is_fitted


def test_models_and_states_saved_before_the_fitted_flag_count_as_fitted(tmp_path):
    """Only fitted models were saved before the flag existed: files and checkpoint states without it
    load as fitted."""
    model = GaussianEnsembleDynamics(3, 1, SMALL)
    model.mark_fitted()
    path = model.save(tmp_path / "old.pt")
    saved = torch.load(path, weights_only=True)
    del saved["state_dict"]["fitted"]
    torch.save(saved, path)
    obs, act = torch.zeros(4, 3), torch.zeros(4, 1)
    torch.testing.assert_close(GaussianEnsembleDynamics.load(path).predict(obs, act), model.predict(obs, act))
    state = model.state_dict()
    del state["fitted"]
    fresh = GaussianEnsembleDynamics(3, 1, SMALL)
    fresh.load_state_dict(state)
    assert fresh.is_fitted


# ------------------------------------------------------------------------------- wrong types
def wrong_type_calls(data):
    array = np.zeros((10, 3), np.float32)
    agent_cls = ALGORITHMS["ravl"][0]
    agent = agent_cls.for_dataset(data, RAVLConfig(num_critics=2, hidden_size=16))
    return {
        "build_run dataset=array": (lambda: build_run("ravl", array), "build_run needs an OfflineDataset, got numpy.ndarray"),
        "build_run dataset=path": (lambda: build_run("ravl", "pendulum-medium"), "build_run needs an OfflineDataset, got str"),
        "build_run algo=array": (lambda: build_run(array, data), "build_run's algo must be an algorithm's name"),
        "build_run algo_config=dict": (lambda: build_run("ravl", data, {"batch_size": 8}),
                                       "build_run's algo_config for ravl must be a RAVLConfig, got dict"),
        "build_run generator_config=str": (lambda: build_run("ravl", data, None, "rollouts"),
                                           "build_run's generator_config must be a generator config"),
        "Trainer dataset=str": (lambda: Trainer(agent, "not a dataset"), "Trainer needs an OfflineDataset, got str"),
        "Trainer agent=str": (lambda: Trainer("ravl", data), "Trainer needs an agent"),
        "Trainer config=dict": (lambda: Trainer(agent, data, {"epochs": 1}), "Trainer's config must be a TrainerConfig"),
        "Trainer generator=config": (lambda: Trainer(agent, data, TrainerConfig(), RolloutGeneratorConfig()),
                                     "Trainer's generator must be a generator"),
        "load_dataset spec=int": (lambda: load_dataset(123), "load_dataset needs a dataset's name or file"),
        "load_dataset spec=None": (lambda: load_dataset(None), "load_dataset needs a dataset's name or file"),
        "load_dataset spec=array": (lambda: load_dataset(array), "load_dataset needs a dataset's name or file"),
        "load_dataset env=int": (lambda: load_dataset("pendulum-medium", env=3), "load_dataset's env must be"),
        "read_checkpoint path=int": (lambda: read_checkpoint(7), "read_checkpoint needs the path of a checkpoint.pt"),
        "load_policy path=None": (lambda: load_policy(None), "read_checkpoint needs the path of a checkpoint.pt"),
    }


def test_wrong_types_are_refused_in_one_line(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, here or anywhere
    for case, (call, expected) in wrong_type_calls(data).items():
        with pytest.raises(InputTypeError) as excinfo:
            call()
        assert isinstance(excinfo.value, TypeError), case
        assert one_line(excinfo.value).startswith(expected), (case, str(excinfo.value))
    assert list(tmp_path.iterdir()) == []


def test_build_run_refuses_a_device_this_machine_lacks_before_any_work(data, tmp_path, monkeypatch):
    from mbrl_offline.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^build_run's device=nonsense is not a device; write cpu"):
        build_run("td3bc", data, device="nonsense")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU on this machine"):
            build_run("ravl", data, device="cuda", cache_dir=tmp_path / "cache")
    assert list(tmp_path.iterdir()) == []
