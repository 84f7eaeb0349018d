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
        "build_run generator_config=number": (lambda: build_run("ravl", data, None, 5),
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


# ------------------------------------------------- the shared checks at each edge (datasets, configs, buffers)
def env_less(data):
    """``data`` with no env named (as arrays built into an OfflineDataset without ``env_name``)."""
    return dataclasses.replace(data, env_name=None, env_id=None, source="arrays.npz")


def test_every_agents_for_dataset_refuses_an_array_a_dataset_without_an_env_and_a_dict_config(data, tmp_path,
                                                                                             monkeypatch):
    from mbrl_offline.errors import DatasetError

    monkeypatch.chdir(tmp_path)
    for name, (agent_cls, config_cls) in ALGORITHMS.items():
        where = f"{agent_cls.__name__}.for_dataset"
        with pytest.raises(InputTypeError) as excinfo:
            agent_cls.for_dataset(np.zeros((10, 3), np.float32))
        assert one_line(excinfo.value).startswith(f"{where} needs an OfflineDataset, got numpy.ndarray"), name
        with pytest.raises(DatasetError) as excinfo:
            agent_cls.for_dataset(env_less(data))
        assert one_line(excinfo.value).startswith(f"{where}: arrays.npz names no env"), name
        with pytest.raises(InputTypeError) as excinfo:
            agent_cls.for_dataset(data, {"batch_size": 8})
        assert one_line(excinfo.value).startswith(f"{where}'s config must be a {config_cls.__name__}, got dict; "
                                                  f"build one with"), name
    with pytest.raises(DatasetError, match=r"^build_run: arrays.npz names no env") as excinfo:
        build_run("td3bc", env_less(data))
    one_line(excinfo.value)
    assert list(tmp_path.iterdir()) == []


def test_build_run_takes_config_objects_and_refuses_dicts_of_settings_with_the_fix(data, tmp_path, monkeypatch):
    """One rule for every config argument (`mbrl_offline.config.config_argument`): an instance or None, never a
    dict; the message says how to build one from the dict."""
    monkeypatch.chdir(tmp_path)
    calls = {
        "trainer_config": (lambda: build_run("td3bc", data, trainer_config={"epochs": 1}),
                           "build_run's trainer_config must be a TrainerConfig, got dict; build one with "
                           "TrainerConfig(epochs=100), or from a dict of settings with "
                           "mbrl_offline.config.config_to_dataclass(TrainerConfig, settings, 'trainer')."),
        "algo_config": (lambda: build_run("ravl", data, {"batch_size": 8}),
                        "build_run's algo_config for ravl must be a RAVLConfig, got dict; build one with"),
        "generator_config": (lambda: build_run("ravl", data, None, {"kind": "rollouts"}),
                             "build_run's generator_config must be a generator config"),
        "Trainer config": (lambda: Trainer(ALGORITHMS["td3bc"][0].for_dataset(data), data, {"epochs": 1}),
                           "Trainer's config must be a TrainerConfig, got dict; build one with"),
    }
    for case, (call, expected) in calls.items():
        with pytest.raises(InputTypeError) as excinfo:
            call()
        assert one_line(excinfo.value).startswith(expected), (case, str(excinfo.value))
    assert list(tmp_path.iterdir()) == []


def test_load_policy_refuses_a_device_this_machine_lacks(data, tmp_path, monkeypatch):
    from mbrl_offline.algorithms import TD3BC, TD3BCConfig
    from mbrl_offline.errors import ConfigError

    agent = TD3BC.for_dataset(data, TD3BCConfig(hidden_size=8, batch_size=8))
    settings = TrainerConfig(epochs=1, updates_per_epoch=2, eval_episodes=1, run_dir=str(tmp_path / "run"),
                             progress=False, tensorboard=False)
    Trainer(agent, data, settings).train()
    path = tmp_path / "run" / "checkpoint.pt"
    with pytest.raises(ConfigError, match=r"^load_policy's device=nonsense is not a device; write cpu") as excinfo:
        load_policy(path, device="nonsense")
    one_line(excinfo.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, as one without a GPU
    with pytest.raises(ConfigError, match=r"^load_policy's device=cuda, but torch finds no CUDA GPU") as excinfo:
        load_policy(path, device="cuda")
    one_line(excinfo.value)


def buffer_rows(n=5, obs=3, act=1, **changes):
    rows = dict(observations=np.zeros((n, obs), np.float32), actions=np.zeros((n, act), np.float32),
                rewards=np.zeros(n, np.float32), next_observations=np.zeros((n, obs), np.float32),
                terminals=np.zeros(n, bool), timeouts=np.zeros(n, bool))
    return {**rows, **changes}


@pytest.mark.parametrize("case, changes, expected", [
    ("wide rows", {"observations": np.zeros((5, 4), np.float32)},
     "transition rows: field 'observations' must have shape (n, 3), got (5, 4)"),
    ("narrow actions", {"actions": np.zeros((5, 2), np.float32)},
     "transition rows: field 'actions' must have shape (n, 1), got (5, 2)"),
    ("one row short", {"rewards": np.zeros(4, np.float32)},
     "transition rows: field 'rewards' has 4 rows but 'observations' has 5"),
    ("flat actions", {"actions": np.zeros(5, np.float32)},
     "transition rows: field 'actions' must have shape (n, 1), got (5,)"),
    ("rewards as a column", {"rewards": np.zeros((5, 2), np.float32)},
     "transition rows: field 'rewards' must have shape (n,), got (5, 2)"),
])
def test_buffers_refuse_rows_of_another_width_or_length_in_one_line(case, changes, expected):
    from mbrl_offline.buffer import SequenceBuffer, TransitionBuffer

    buffer = TransitionBuffer(100, 3, 1)
    with pytest.raises(InputError) as excinfo:
        buffer.add(**buffer_rows(**changes))
    assert one_line(excinfo.value).startswith(expected), str(excinfo.value)
    assert len(buffer) == 0  # nothing written
    sequences = SequenceBuffer(100, 3, 1)
    with pytest.raises(InputError) as excinfo:
        sequences.add_episodes(np.eye(1, 5, dtype=bool).reshape(-1), **buffer_rows(**changes))
    assert one_line(excinfo.value).startswith(expected.replace("transition", "sequence")), str(excinfo.value)
    assert len(sequences) == 0


def test_a_single_transition_of_another_width_is_refused():
    from mbrl_offline.buffer import TransitionBuffer

    buffer = TransitionBuffer(10, 3, 1)
    one = {k: v[0] for k, v in buffer_rows().items()}
    buffer.add(single=True, **one)
    with pytest.raises(InputError, match=r"field 'observations' must have shape \(3,\), got \(4,\)"):
        buffer.add(single=True, **{**one, "observations": np.zeros(4, np.float32)})
    assert len(buffer) == 1


def test_a_neubay_episode_policy_stepped_for_more_episodes_than_it_was_reset_for_says_so():
    from mbrl_offline.algorithms import NEUBAY, NEUBAYConfig

    low, high = ENV.action_bounds()
    agent = NEUBAY(3, 1, low, high, NEUBAYConfig(d_model=16, d_hidden=8, head_hidden=16))
    policy = agent.episode_policy(True)
    policy.reset(2)
    obs = np.zeros((3, 3), np.float32)
    with pytest.raises(InputError) as excinfo:
        policy(obs, np.zeros(3), np.ones(3, bool), np.arange(3))
    assert one_line(excinfo.value).startswith("neubay episode policy: rows must be episode indices in 0..1 (it was "
                                              "reset for 2 episode(s)), got 0..2; call reset(episodes)")
    assert policy(obs[:2], np.zeros(2), np.ones(2, bool), np.arange(2)).shape == (2, 1)


def test_config_dataclasses_check_their_field_types_and_take_nested_mappings():
    """One mechanism (`mbrl_offline.config.check_field_types`) in every config's __post_init__: a nested
    mapping becomes the nested config (unknown keys refused), a scalar for a tuple or a string for a number
    is refused in one line naming the setting."""
    from mbrl_offline.algorithms import SACConfig
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.generators.pgd import PGDGeneratorConfig, UNetConfig
    from mbrl_offline.models.diffusion import DiffusionTrainConfig

    config = PGDGeneratorConfig(unet={"base": 16, "levels": 2})
    assert config.unet == UNetConfig(base=16, levels=2)
    assert DiffusionTrainConfig(betas=[0.9, 0.999]).betas == (0.9, 0.999)
    refused = {
        (lambda: DiffusionTrainConfig(betas=0.9)): "generator.train.betas = 0.9 must be a list or tuple",
        (lambda: PGDGeneratorConfig(unet={"bse": 16})): "unknown setting 'generator.unet.bse'. Did you mean",
        (lambda: PGDGeneratorConfig(unet=16)): "generator.unet = 16 has the wrong type; expected a UNetConfig",
        (lambda: SACConfig(gamma="0.99")): "algo.gamma = '0.99' has the wrong type; expected float",
        (lambda: SACConfig(auto_alpha="yes")): "algo.auto_alpha = 'yes' has the wrong type; expected true or false",
        (lambda: TrainerConfig(run_dir=3)): "trainer.run_dir = 3 has the wrong type; expected str",
        (lambda: DynamicsConfig(weight_decay=1e-5)): "dynamics.weight_decay = 1e-05 must be a list or tuple",
    }
    for call, expected in refused.items():
        with pytest.raises(ConfigError) as excinfo:
            call()
        assert one_line(excinfo.value).startswith(expected), str(excinfo.value)


def test_an_unfitted_diffusion_model_refuses_to_sample_and_a_fitted_or_loaded_one_samples(tmp_path):
    from mbrl_offline.models.diffusion import DiffusionModel, DiffusionTrainConfig, EDMConfig

    model = DiffusionModel((3,), "resmlp", {"width": 16, "blocks": 1, "dim_t": 8}, EDMConfig(steps=2))
    with pytest.raises(NotFittedError, match=r"never fitted.*call fit\(data\) first") as excinfo:
        model.sample(4)
    one_line(excinfo.value)
    with pytest.raises(NotFittedError):
        DiffusionModel.load(model.save(tmp_path / "unfitted.pt")).sample(4)
    model.fit(torch.randn(64, 3), DiffusionTrainConfig(steps=2, batch_size=16))
    assert model.sample(4).shape == (4, 3)
    assert DiffusionModel.load(model.save(tmp_path / "fitted.pt")).sample(4).shape == (4, 3)
    saved = torch.load(tmp_path / "fitted.pt", weights_only=True)
    del saved["state_dict"]["fitted"]  # a model saved before the flag existed: only fitted ones were
    torch.save(saved, tmp_path / "old.pt")
    assert DiffusionModel.load(tmp_path / "old.pt").sample(4).shape == (4, 3)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_an_agents_constructor_takes_its_own_config_class_or_none(name):
    """``cls(obs_dim, act_dim, low, high)`` builds the agent with its own config class's defaults (not a
    parent class's: COMBO's constructor once defaulted to CQL's config and failed at the first update),
    and a config of another class, or a dict, is refused in one line that names the class to build."""
    cls, config_cls = ALGORITHMS[name]
    low, high = ENV.action_bounds()
    agent = cls(ENV.obs_dim, ENV.act_dim, low, high)
    assert type(agent.config) is config_cls
    with pytest.raises(InputTypeError) as error:
        cls(ENV.obs_dim, ENV.act_dim, low, high, {"batch_size": 8})
    assert one_line(error.value).startswith(f"{cls.__name__}'s config must be a {config_cls.__name__}, got dict")
