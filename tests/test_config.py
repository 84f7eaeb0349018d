"""Configs to and from plain dicts (`mbrl_offline.config`), which checkpoints, run.json and the
command line all go through."""
import json

import pytest

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.config import config_to_dataclass, config_to_dict, did_you_mean
from mbrl_offline.errors import ConfigError
from mbrl_offline.generators import generator_config
from mbrl_offline.trainer import TrainerConfig


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_and_generator_config_round_trips_through_a_json_dict(name):
    agent_cls, config_cls = ALGORITHMS[name]
    plain = json.loads(json.dumps(config_to_dict(config_cls())))  # nested dataclasses as dicts, tuples as lists
    assert config_to_dataclass(config_cls, plain, "algo") == config_cls()
    published = agent_cls.published_generator()
    assert generator_config(json.loads(json.dumps(config_to_dict(published)))) == published


def test_a_changed_nested_setting_survives_the_round_trip():
    from mbrl_offline.algorithms import MOPO

    config = MOPO.published_generator()
    config.rollout.penalty_coef, config.dynamics.max_epochs = 5.0, 7
    back = generator_config(config_to_dict(config))
    assert back == config and back != MOPO.published_generator()
    assert (back.rollout.penalty_coef, back.dynamics.max_epochs) == (5.0, 7)
    with pytest.raises(ConfigError, match="unknown generator kind 'rolouts'. Did you mean 'rollouts'?"):
        generator_config({"kind": "rolouts"})


def test_unknown_settings_and_wrong_types_are_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown setting 'trainer.epoch'. Did you mean 'trainer.epochs'\?"):
        config_to_dataclass(TrainerConfig, {"epoch": 3}, "trainer")
    with pytest.raises(ConfigError, match=r"trainer.epochs = 'three' has the wrong type; expected int"):
        config_to_dataclass(TrainerConfig, {"epochs": "three"}, "trainer")
    with pytest.raises(ConfigError, match="needs a dataclass config instance"):
        config_to_dict(TrainerConfig)


def test_did_you_mean():
    assert did_you_mean("hoper", ["hopper", "walker2d"]) == " Did you mean 'hopper'?"
    assert did_you_mean("hoper", ["hopper"], prefix="env.") == " Did you mean 'env.hopper'?"
    assert did_you_mean("zzz", ["hopper"]) == ""
