"""Configs to and from plain dicts (`mbrl_offline.config`), which checkpoints, run.json and the
command line all go through."""
import json

import pytest

from mbrl_offline.algorithms import ALGORITHMS
from mbrl_offline.config import CONFIG_DIR, config_to_dataclass, config_to_dict, did_you_mean
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


def test_one_strict_parser_holds_every_value_to_its_type():
    """`parse_setting`: a boolean is a real true or false; 'no', 'yes', 'False' as text, 0 and 1 are refused
    in one line that says how to write it, wherever the value comes from."""
    from typing import Optional

    from mbrl_offline.config import parse_setting

    assert parse_setting(bool, False, "overwrite") is False and parse_setting(Optional[bool], None, "x") is None
    for value in ("no", "yes", "False", "true", 0, 1, None):
        with pytest.raises(ConfigError, match=r"^overwrite = .* has the wrong type; expected true or false \(write "
                                              r"overwrite=true or overwrite=false\)\.$"):
            parse_setting(bool, value, "overwrite")
    assert parse_setting(int, 3.0, "seed") == 3 and parse_setting(float, 2, "x") == 2.0
    for hint, value in ((int, True), (int, "3"), (float, False), (str, 5), (str, None)):
        with pytest.raises(ConfigError, match="has the wrong type"):
            parse_setting(hint, value, "s")
    with pytest.raises(ConfigError, match=r"^2 unknown settings: 'trainer.epoch' \(Did you mean 'trainer.epochs'\?\); "
                                          r"'trainer.sed' \(Did you mean 'trainer.seed'\?\)\. Valid: epochs,"):
        config_to_dataclass(TrainerConfig, {"epoch": 3, "sed": 1}, "trainer")


def test_a_run_folder_is_never_deleted_for_a_value_that_only_looks_true(tmp_path):
    from mbrl_offline.trainer import check_run_dir

    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "checkpoint.pt").write_bytes(b"weights")
    for value in ("no", 1, "False"):
        with pytest.raises(ConfigError, match=r"overwrite = .* expected true or false"):
            check_run_dir(tmp_path, overwrite=value)
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"weights"


@pytest.mark.parametrize("tool, override", [("train", "overwrite=no"), ("train", "resume=yes"),
                                            ("train", "keep_freed_memory=0"), ("tune", "overwrite=no"),
                                            ("inspect_dataset", "overwrite=no"), ("evaluate", "episodes=true")])
def test_every_tool_holds_its_top_level_settings_to_their_types(tool, override):
    from mbrl_offline.config_files import compose

    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key} = .* has the wrong type; expected"):
        compose(CONFIG_DIR, tool, [override])
