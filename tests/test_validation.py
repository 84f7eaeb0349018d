"""Validation at the edge (issue 22, item 1): every setting's range where its config is built, devices
that exist, presets on the env they were made for, output folders that can be written, run folders
never overwritten, damaged logs refused in one line, and writes that fail midway leaving nothing."""
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from mbrl_offline.algorithms import (COPlannerConfig, EDACConfig, IQLConfig, MOBILEConfig, MOPOConfig, OfflineRLKitSACConfig,
                                     RAVLConfig, SACConfig, TD3BCConfig)
from mbrl_offline.buffer import MixingConfig
from mbrl_offline.collect import CollectConfig, collect
from mbrl_offline.config import CONFIG_DIR, check_device, check_writable_dir
from mbrl_offline.errors import CheckpointError, ConfigError, DatasetError
from mbrl_offline.adjust import CDSAConfig
from mbrl_offline.online import OnlineConfig
from mbrl_offline.generators import RolloutConfig, RolloutGeneratorConfig, UPMPCConfig
from mbrl_offline.models.refiner import RefinerConfig
from mbrl_offline.models.dynamics import DynamicsConfig
from mbrl_offline.algorithms.neubay import NEUBAYConfig
from mbrl_offline.generators.posterior import PosteriorConfig, PosteriorGeneratorConfig
from mbrl_offline.trackers.wandb import WandbConfig
from mbrl_offline.trainer import TrainerConfig, check_run_dir, run_files
from mbrl_offline.tune import PrunerConfig, SamplerConfig, SweepConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR
NAN = float("nan")

# ------------------------------------------------------------------------------ setting ranges
SAC_FAMILY = (SACConfig, OfflineRLKitSACConfig, EDACConfig, RAVLConfig, MOPOConfig, MOBILEConfig, COPlannerConfig)
SAC_BAD = [("num_critics", 0), ("eta", -0.1), ("eta", NAN), ("hidden_size", 0), ("hidden_layers", 0),
           ("init", "xavier"), ("actor_lr", 0.0), ("actor_lr", -3e-4), ("critic_lr", -1.0), ("critic_lr", math.inf),
           ("alpha_lr", 0.0), ("gamma", 99.0), ("gamma", 0.0), ("gamma", NAN), ("tau", 0.0), ("tau", 1.5),
           ("init_alpha", 0.0), ("init_alpha", -1.0), ("target_entropy", NAN), ("batch_size", 0),
           ("batch_size", 2.5), ("update_order", "rlkit"), ("alpha_max", 0.0), ("alpha_max", -1.0)]
# (config class, field, a value out of its range); every numeric or named-choice field of every
# config class has at least one row (test_the_table_covers_every_setting).
BAD_SETTINGS = [(cls, field, value) for cls in SAC_FAMILY for field, value in SAC_BAD] + [
    (MOBILEConfig, "penalty_coef", -1.0), (MOBILEConfig, "num_samples", 0), (MOBILEConfig, "target_floor", NAN),
    (TD3BCConfig, "alpha", -1.0), (TD3BCConfig, "policy_noise", -0.1), (TD3BCConfig, "noise_clip", -0.5),
    (TD3BCConfig, "policy_freq", 0), (TD3BCConfig, "actor_lr", 0.0), (TD3BCConfig, "critic_lr", -1.0),
    (TD3BCConfig, "gamma", 1.5), (TD3BCConfig, "tau", 0.0), (TD3BCConfig, "hidden_size", 0),
    (TD3BCConfig, "hidden_layers", 0), (TD3BCConfig, "batch_size", -5), (TD3BCConfig, "state_std_eps", -1e-3),
    (IQLConfig, "expectile", 1.0), (IQLConfig, "expectile", 0.0), (IQLConfig, "beta", -3.0),
    (IQLConfig, "exp_adv_max", 0.0), (IQLConfig, "actor_lr", 0.0), (IQLConfig, "critic_lr", -1.0),
    (IQLConfig, "value_lr", NAN), (IQLConfig, "gamma", 2.0), (IQLConfig, "tau", 1.01), (IQLConfig, "hidden_size", 0),
    (IQLConfig, "hidden_layers", 0), (IQLConfig, "batch_size", 0), (IQLConfig, "state_std_eps", -1.0),
    (TrainerConfig, "epochs", 0), (TrainerConfig, "updates_per_epoch", 0), (TrainerConfig, "eval_every", 0),
    (TrainerConfig, "eval_episodes", 0), (TrainerConfig, "final_eval_episodes", -1), (TrainerConfig, "checkpoint_every", 0), (TrainerConfig, "seed", -1),
    (TrainerConfig, "run_dir", ""), (TrainerConfig, "divergence_q", 0.0), (TrainerConfig, "divergence_q", NAN),
    (TrainerConfig, "risk_level", 0.0), (TrainerConfig, "risk_level", 1.0), (TrainerConfig, "risk_level", NAN),
    (RolloutConfig, "horizon", 0), (RolloutConfig, "rollouts_per_epoch", 0), (RolloutConfig, "retain_epochs", 0),
    (RolloutConfig, "member", "episode"), (RolloutConfig, "penalty", "mopo"), (RolloutConfig, "penalty_coef", -0.5),
    (RolloutConfig, "planner", "cem"), (RolloutConfig, "halt", "threshold"), (RolloutConfig, "pessimism_coef", 0.0),
    (RolloutConfig, "halt_reward", NAN), (RolloutConfig, "halt_min_steps", 0), (RolloutConfig, "start", "reset"),
    (RolloutConfig, "min_length", 0), (RolloutConfig, "clamp", -1.0),
    (UPMPCConfig, "candidates", 0), (UPMPCConfig, "horizon", 0), (UPMPCConfig, "uncertainty_weight", -2.0),
    (UPMPCConfig, "reward_discount", 1.5), (UPMPCConfig, "uncertainty_discount", -0.1),
    (RolloutGeneratorConfig, "kind", "rolouts"), (RolloutGeneratorConfig, "every", -1),
    (RolloutGeneratorConfig, "utd", -0.5), (RolloutGeneratorConfig, "observation_std_eps", -1e-3),
    (DynamicsConfig, "ensemble_size", 0), (DynamicsConfig, "num_elites", 0), (DynamicsConfig, "num_elites", 8),
    (DynamicsConfig, "hidden_size", 0), (DynamicsConfig, "hidden_layers", 0), (DynamicsConfig, "activation", "tanh"),
    (DynamicsConfig, "learning_rate", 0.0), (DynamicsConfig, "weight_decay", (-1e-5, 0.0, 0.0, 0.0, 0.0)),
    (DynamicsConfig, "weight_decay", (1e-5,)), (DynamicsConfig, "logvar_bound_coef", -0.01),
    (DynamicsConfig, "logvar_bounds", "global"), (DynamicsConfig, "logvar_min", 1.0), (DynamicsConfig, "logvar_min", NAN),
    (DynamicsConfig, "logvar_max", NAN), (DynamicsConfig, "init_truncation", 0.0), (DynamicsConfig, "batch_size", 0),
    (DynamicsConfig, "holdout_ratio", 1.0), (DynamicsConfig, "holdout_ratio", -0.2), (DynamicsConfig, "max_holdout", 0),
    (DynamicsConfig, "bootstrap", "twice"), (DynamicsConfig, "max_epochs", 0), (DynamicsConfig, "min_epochs", -1),
    (DynamicsConfig, "patience", 0), (DynamicsConfig, "improvement_threshold", -0.01), (DynamicsConfig, "input_clip", 0.0),
    (DynamicsConfig, "seed", -1), (DynamicsConfig, "init", "normal"), (DynamicsConfig, "variance_head", "std"),
    (DynamicsConfig, "log_std_min", NAN), (DynamicsConfig, "log_std_max", NAN), (DynamicsConfig, "statistics", "median"),
    (DynamicsConfig, "loss", "mse"), (DynamicsConfig, "optimizer", "sgd"), (DynamicsConfig, "adamw_weight_decay", -1e-5),
    (NEUBAYConfig, "batch_size", 1), (NEUBAYConfig, "encoder", "lstm"), (NEUBAYConfig, "d_model", 0),
    (NEUBAYConfig, "d_hidden", 0), (NEUBAYConfig, "encoder_layers", 0), (NEUBAYConfig, "r_min", 1.0),
    (NEUBAYConfig, "r_max", 0.0), (NEUBAYConfig, "max_phase", 0.0), (NEUBAYConfig, "head_hidden", 0),
    (NEUBAYConfig, "head_layers", 0), (NEUBAYConfig, "num_critics", 0), (NEUBAYConfig, "sampled_critics", 11),
    (NEUBAYConfig, "gamma", 0.0), (NEUBAYConfig, "tau", 0.0), (NEUBAYConfig, "init_alpha", 0.0),
    (NEUBAYConfig, "target_alpha_ratio", -1.0), (NEUBAYConfig, "encoder_lr", 0.0), (NEUBAYConfig, "critic_encoder_lr", -1.0),
    (NEUBAYConfig, "actor_encoder_lr", NAN), (NEUBAYConfig, "critic_head_lr", 0.0), (NEUBAYConfig, "actor_head_lr", 0.0),
    (NEUBAYConfig, "alpha_lr", 0.0), (NEUBAYConfig, "critic_lr_ratio", 2.0), (NEUBAYConfig, "actor_lr_ratio", -1.0),
    (NEUBAYConfig, "adam_eps", 0.0), (NEUBAYConfig, "grad_clip", 0.0), (NEUBAYConfig, "schedule_updates", 0),
    (PosteriorConfig, "parallel", 0), (PosteriorConfig, "quantile", 2.0), (PosteriorConfig, "penalty_coef", -1.0),
    (PosteriorConfig, "max_rollout_len", 0),
    (PosteriorGeneratorConfig, "kind", "posterio"), (PosteriorGeneratorConfig, "every", -1),
    (PosteriorGeneratorConfig, "utd", 0.0), (PosteriorGeneratorConfig, "buffer_rows", 0),
    (MixingConfig, "rule", "half"), (MixingConfig, "real_ratio", 1.5), (MixingConfig, "real_ratio", NAN),
    (MixingConfig, "real_rows", -1), (MixingConfig, "kappa", 2.0),
    (SweepConfig, "n_trials", 0), (SweepConfig, "seeds", ()), (SweepConfig, "seeds", (-1,)),
    (SweepConfig, "objective", "best"), (SweepConfig, "heartbeat_seconds", 0), (SweepConfig, "dir", ""),
    (SweepConfig, "space", {"algo": 3}), (SweepConfig, "sampler", SamplerConfig(name="cmaes")),
    (SweepConfig, "pruner", PrunerConfig(name="asha")), (SweepConfig, "job", "evaluate"),
    (SamplerConfig, "seed", -1), (SamplerConfig, "n_startup_trials", -1),
    (PrunerConfig, "n_startup_trials", -1), (PrunerConfig, "n_warmup_epochs", -2),
    (CollectConfig, "env", "pendulumm"), (CollectConfig, "levels", ("mediocre",)), (CollectConfig, "seed", -1),
    (CollectConfig, "dataset_size", 0), (CollectConfig, "expert_steps", 0), (CollectConfig, "medium_score", NAN),
    (CollectConfig, "max_medium_steps", 0), (CollectConfig, "eval_every", 0), (CollectConfig, "eval_episodes", 0),
    (CollectConfig, "confirm_episodes", 0), (CollectConfig, "start_steps", -1), (CollectConfig, "checkpoint_every", 0),
    (CollectConfig, "run_dir", ""), (CollectConfig, "namespace", ""), (CollectConfig, "version", " "),
    (CollectConfig, "device", "nonsense"), (CollectConfig, "torch_threads", -1),
    (TrainerConfig, "adjust", "cdsb"),
    (TrainerConfig, "logger", {"name": "mlflow"}), (TrainerConfig, "logger", {"name": "wandb", "mode": "live"}),
    (TrainerConfig, "logger", {"name": "none", "project": "x"}),
    (WandbConfig, "mode", "live"), (WandbConfig, "project", " "), (WandbConfig, "name", "mlflow"),
    (RefinerConfig, "steps", 0), (RefinerConfig, "sigma_min", 0.0), (RefinerConfig, "sigma_min", 1.0),
    (RefinerConfig, "start", "zeros"), (RefinerConfig, "samples", 0), (RefinerConfig, "hidden_size", 0),
    (RefinerConfig, "hidden_layers", 0), (RefinerConfig, "learning_rate", 0.0), (RefinerConfig, "batch_size", 0),
    (RefinerConfig, "updates", 0), (RefinerConfig, "ema_decay", 1.0), (RefinerConfig, "holdout_ratio", 0.0),
    (RefinerConfig, "seed", -1),
    (CDSAConfig, "score_on", "actions"), (CDSAConfig, "sigma", 0.0), (CDSAConfig, "steps", 0),
    (CDSAConfig, "step_size", 0.0), (CDSAConfig, "step_size", 1.5), (CDSAConfig, "combine", "add"),
    (CDSAConfig, "weight", -0.1), (CDSAConfig, "score_width", 0), (CDSAConfig, "score_blocks", 0),
    (CDSAConfig, "score_steps", 0), (CDSAConfig, "inverse_hidden", 0), (CDSAConfig, "inverse_layers", 0),
    (CDSAConfig, "inverse_updates", 0), (CDSAConfig, "seed", -1),
    (OnlineConfig, "steps_per_update", 0), (OnlineConfig, "exploration_noise", -0.1),
    (OnlineConfig, "offline_ratio", 1.5), (OnlineConfig, "offline_ratio", NAN), (OnlineConfig, "max_episode_steps", 0),
    (OnlineConfig, "refit_every", 0),
]
# Settings any value of their type suits (free text checked where it is used, or nested configs,
# which have their own rows); bool fields need no range (their type is checked when a config is read).
ANY_VALUE = {(SweepConfig, "storage"), (SweepConfig, "study_name"), (SweepConfig, "for_algo"),
             (SamplerConfig, "name"), (PrunerConfig, "name"),  # checked by SweepConfig (rows above)
             (CollectConfig, "minari_root"), (CollectConfig, "sac"),
             (RolloutConfig, "upmpc"), (RolloutGeneratorConfig, "rollout"), (RolloutGeneratorConfig, "dynamics"),
             (RolloutGeneratorConfig, "mixing"), (RolloutGeneratorConfig, "adversarial"),  # its own rows in test_rambo
             (PosteriorGeneratorConfig, "posterior"),
             (PosteriorGeneratorConfig, "dynamics"), (PosteriorGeneratorConfig, "mixing"),
             (RolloutConfig, "refiner"), (PosteriorConfig, "refiner"), (TrainerConfig, "cdsa"),  # their own rows
             (TrainerConfig, "online"),
             (CDSAConfig, "dynamics"),
             # W&B's own names, checked by W&B when the run starts (one line: mbrl_offline.trackers.wandb)
             (WandbConfig, "entity"), (WandbConfig, "group"), (WandbConfig, "tags"), (WandbConfig, "run_name")}


@pytest.mark.parametrize("cls, field, value", BAD_SETTINGS,
                         ids=[f"{c.__name__}.{f}={v!r}" for c, f, v in BAD_SETTINGS])
def test_a_setting_out_of_its_range_is_refused_in_one_line_naming_it(cls, field, value):
    with pytest.raises(ConfigError) as error:
        cls(**{field: value})
    message = str(error.value)
    assert "\n" not in message and len(message) < 300
    assert field in message, message


def test_the_table_covers_every_setting():
    """A setting added to a config class without a range (or a reason it needs none) fails here."""
    covered = {(cls, field) for cls, field, _ in BAD_SETTINGS}
    for cls in {cls for cls, _, _ in BAD_SETTINGS}:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if hints[field.name] is bool or (cls, field.name) in ANY_VALUE:
                continue
            assert (cls, field.name) in covered, f"{cls.__name__}.{field.name} has no out-of-range case"


@pytest.mark.parametrize("cls", sorted({cls for cls, _, _ in BAD_SETTINGS}, key=lambda c: c.__name__))
def test_the_defaults_are_accepted(cls):
    cls()


def test_the_edges_of_the_ranges_are_accepted():
    TrainerConfig(divergence_q=math.inf, seed=0)  # inf turns the divergence guard off
    SACConfig(gamma=1.0, tau=1.0, target_entropy=-3.0)
    MOBILEConfig(target_floor=None, penalty_coef=0.0)
    DynamicsConfig(holdout_ratio=0.0, init_truncation=None, input_clip=None, max_holdout=None, min_epochs=0)
    CollectConfig(torch_threads=0, start_steps=0, dataset_size=None)


def test_a_bad_setting_is_refused_where_the_train_config_is_built():
    from mbrl_offline.cli import resolve_train_config
    from mbrl_offline.config_files import compose

    cases = {"algo.gamma=99": "algo.gamma must be in (0, 1] (the discount; usually 0.99), got 99.0.",
             "algo.actor_lr=-0.001": "algo.actor_lr must be above 0, got -0.001.",
             "seed=-1": "seed must be at least 0, got -1.",
             "torch_threads=-1": "torch_threads must be at least 0 (0 or null: torch's default), got -1.",
             "torch_threads=1.5": "torch_threads = 1.5 has the wrong type; expected int or null.",
             "generator.dynamics.learning_rate=0": "dynamics.learning_rate must be above 0, got 0.0.",
             "trainer.divergence_q=-1": "trainer.divergence_q must be above 0, got -1.0."}
    for override, message in cases.items():
        with pytest.raises(ConfigError) as error:
            resolve_train_config(compose(CONFIGS, "train", [override]))
        assert str(error.value).startswith(message), (override, str(error.value))
    resolve_train_config(compose(CONFIGS, "train", ["torch_threads=0", "seed=3"]))  # 0: torch's default


# ------------------------------------------------------------------------------------ devices
def test_devices_that_do_not_exist_are_refused_in_one_line():
    assert check_device("cpu") == torch.device("cpu")
    for device, message in (("nonsense", "device=nonsense is not a device; write cpu, cuda, cuda:<index> or mps."),
                            ("cuda:99", "device=cuda:99, but "), ("meta", "device=meta: the library runs on")):
        with pytest.raises(ConfigError) as error:
            check_device(device)
        assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA; the case is for machines without")
def test_cuda_on_a_machine_without_cuda_is_refused_by_every_tool(tmp_path):
    with pytest.raises(ConfigError, match="device=cuda, but torch finds no CUDA GPU on this machine.*use device=cpu"):
        check_device("cuda")
    with pytest.raises(ConfigError, match="collect.device=cuda, but torch finds no CUDA GPU"):
        CollectConfig(device="cuda")
    train = run_tool("train.py", "device=cuda", f"trainer.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_one_error_line(train, "error: device=cuda, but torch finds no CUDA GPU on this machine")
    assert train.stdout == "" and not (tmp_path / "run").exists()
    evaluate = run_tool("evaluate.py", f"checkpoint={tmp_path / 'run' / 'checkpoint.pt'}", "device=cuda", cwd=tmp_path)
    assert_one_error_line(evaluate, "error: device=cuda, but torch finds no CUDA GPU on this machine")


def test_evaluate_refuses_bad_settings_before_reading_the_checkpoint(tmp_path):
    for override, message in (("device=nonsense", "error: device=nonsense is not a device"),
                              ("episodes=0", "error: episodes must be at least 1, got 0."),
                              ("seed=-2", "error: seed must be at least 0, got -2.")):
        result = run_tool("evaluate.py", f"checkpoint={tmp_path / 'none.pt'}", override, cwd=tmp_path)
        assert_one_error_line(result, message)


# ------------------------------------------------------------------------------------ presets
def test_every_preset_names_the_algorithm_env_and_dataset_it_was_made_for():
    from omegaconf import OmegaConf

    presets = sorted((CONFIGS / "preset").glob("*.yaml"))
    assert presets
    for path in presets:
        preset = OmegaConf.load(path)
        algo, env, level = path.stem.split("-", 2)
        assert (preset.preset_for, preset.preset_env, preset.preset_dataset) == (algo, env, f"{env}-{level}"), path


def test_a_preset_is_refused_on_another_env_and_accepted_on_its_own():
    from mbrl_offline.cli import resolve_train_config
    from mbrl_offline.config_files import compose

    with pytest.raises(ConfigError) as error:
        resolve_train_config(compose(CONFIGS, "train", ["algo=mopo", "env=pendulum", "preset=mopo-hopper-medium"]))
    assert str(error.value) == ("that preset holds the settings published for hopper-medium, not for env pendulum; "
                                "use env=hopper, or a mopo-pendulum-... preset, or no preset.")
    # one preset of each algorithm, on an env it was not made for (the refusal reads the preset's own
    # preset_env, which test_every_preset_names_the_algorithm_env_and_dataset_it_was_made_for checks in every file)
    first = {}
    for path in sorted((CONFIGS / "preset").glob("*.yaml")):
        first.setdefault(path.stem.split("-")[0], path)
    for path in first.values():
        algo, env, level = path.stem.split("-", 2)
        other = "walker2d" if env == "halfcheetah" else "halfcheetah"  # the same sizes as walker2d
        with pytest.raises(ConfigError, match=f"published for {env}-{level}, not for env {other}; use env={env}"):
            resolve_train_config(compose(CONFIGS, "train", [f"algo={algo}", f"env={other}", f"preset={path.stem}"]))
    _, _, generator, _, env = resolve_train_config(compose(CONFIGS, "train", ["algo=mopo", "env=hopper",
                                                                              "preset=mopo-hopper-medium"]))
    assert env.name == "hopper" and (generator.rollout.horizon, generator.rollout.penalty_coef) == (5, 5.0)


def test_every_preset_resolves_on_its_own_algorithm_and_env():
    """A preset's settings all exist in its algorithm's config and its published generator's (a setting put
    under the wrong section, such as algo.dynamics, is refused naming the preset's file)."""
    from mbrl_offline.cli import resolve_train_config
    from mbrl_offline.config_files import compose

    for path in sorted((CONFIGS / "preset").glob("*.yaml")):
        algo, env, _ = path.stem.split("-", 2)
        resolve_train_config(compose(CONFIGS, "train", [f"algo={algo}", f"env={env}", f"preset={path.stem}",
                                                         "preset_dataset=null"]))


def test_a_preset_is_refused_on_other_data_of_its_env_unless_asked():
    from mbrl_offline.cli import dataset_name, resolve_train_config
    from mbrl_offline.config_files import compose

    # the default hopper data is hopper-medium: the medium-replay settings do not silently apply to it
    with pytest.raises(ConfigError) as error:
        resolve_train_config(compose(CONFIGS, "train", ["algo=mopo", "env=hopper", "preset=mopo-hopper-medium-replay"]))
    assert str(error.value) == ("that preset holds the settings published for hopper-medium-replay, but the data is "
                                "hopper-medium; use env.dataset=hopper-medium-replay (or its D4RL file), a "
                                "mopo-hopper-medium preset, or preset_dataset=null to apply these settings to this data.")
    for dataset in ("hopper-medium-replay", "bundled:hopper-medium-replay", "/data/hopper_medium_replay-v2.hdf5",
                    "d4rl:/data/hopper-medium-replay-v2.hdf5", "minari:mujoco/hopper/medium-replay-v0"):
        assert dataset_name(dataset) == "hopper-medium-replay"
        resolve_train_config(compose(CONFIGS, "train", ["algo=mopo", "env=hopper", "preset=mopo-hopper-medium-replay",
                                                        f"env.dataset='{dataset}'"]))
    with pytest.raises(ConfigError, match="but the data is /data/mine.hdf5; use env.dataset=hopper-medium "):
        resolve_train_config(compose(CONFIGS, "train", ["algo=mopo", "env=hopper", "preset=mopo-hopper-medium",
                                                        "env.dataset=/data/mine.hdf5"]))
    _, _, generator, _, _ = resolve_train_config(compose(
        CONFIGS, "train", ["algo=mopo", "env=hopper", "preset=mopo-hopper-medium", "env.dataset=/data/mine.hdf5",
                           "preset_dataset=null"]))
    assert (generator.rollout.horizon, generator.rollout.penalty_coef) == (5, 5.0)


# ----------------------------------------------------------------------------- output folders
def read_only_folder(tmp_path: Path) -> Path:
    """A folder with mode 0o500, or a skip where that does not stop writes (root ignores modes)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        (folder / "probe").write_text("x")
    except PermissionError:
        return folder
    (folder / "probe").unlink()
    folder.chmod(0o700)
    pytest.skip("this user can write to a folder of mode 0o500 (root): the read-only case cannot be made here")


def test_a_folder_that_cannot_be_written_is_refused_without_creating_anything(tmp_path):
    regular = tmp_path / "notes.txt"
    regular.write_text("a regular file")
    with pytest.raises(ConfigError) as error:
        check_writable_dir(regular / "runs" / "run", "trainer.run_dir")
    assert str(error.value) == (f"trainer.run_dir={regular / 'runs' / 'run'} is inside {regular}, which is a file, "
                                f"not a folder; choose another folder.")
    with pytest.raises(ConfigError, match="is a file; choose another folder"):
        check_writable_dir(regular, "--out")
    with pytest.raises(ConfigError, match="is empty"):
        check_writable_dir("", "sweep.dir")
    check_writable_dir(tmp_path / "a" / "b" / "c", "trainer.run_dir")  # fine, and nothing made
    assert not (tmp_path / "a").exists()


def test_a_read_only_folder_is_refused(tmp_path):
    folder = read_only_folder(tmp_path)
    try:
        with pytest.raises(ConfigError, match=r"cannot write to .*permission denied or a read-only file system"):
            check_writable_dir(folder / "run", "trainer.run_dir")
        result = run_tool("train.py", "env=pendulum", f"trainer.run_dir={folder / 'run'}", cwd=tmp_path)
        assert_one_error_line(result, f"error: trainer.run_dir={folder / 'run'}: cannot write to {folder}")
        assert result.stdout == ""
    finally:
        folder.chmod(0o700)


def test_every_tool_refuses_an_output_folder_under_a_regular_file_before_any_work(tmp_path, minari_root):
    regular = tmp_path / "file"
    regular.write_text("")
    train = run_tool("train.py", "env=pendulum", f"trainer.run_dir={regular / 'run'}", cwd=tmp_path)
    assert_one_error_line(train, f"error: trainer.run_dir={regular / 'run'} is inside {regular}, which is a file")
    assert train.stdout == ""  # refused before the dataset was loaded
    cache = run_tool("train.py", "env=pendulum", f"dynamics_cache={regular / 'cache'}",
                     f"trainer.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_one_error_line(cache, f"error: dynamics_cache={regular / 'cache'} is inside {regular}, which is a file")
    assert cache.stdout == "" and not (tmp_path / "run").exists()
    sweep = run_tool("sweep.py", "algo=td3bc", "env=pendulum", f"sweep.dir={regular / 'sweep'}", cwd=tmp_path)
    assert_one_error_line(sweep, f"error: sweep.dir={regular / 'sweep'} is inside {regular}, which is a file")
    runs = tmp_path / "runs" / "r"
    write_fake_run(runs)
    report = run_tool("report.py", str(runs), "--out", str(regular / "out"), cwd=tmp_path)
    assert_one_error_line(report, f"error: --out={regular / 'out'} is inside {regular}, which is a file")
    with pytest.raises(ConfigError, match=f"collect.run_dir={regular / 'c'} is inside"):
        collect(CollectConfig(env="pendulum", run_dir=str(regular / "c"), progress=False))
    with pytest.raises(ConfigError, match="collect.minari_root=.* is inside"):
        collect(CollectConfig(env="pendulum", run_dir=str(tmp_path / "c"), minari_root=str(regular / "m"),
                              progress=False))
    assert not (tmp_path / "c").exists() and not (tmp_path / "out").exists() and regular.read_text() == ""


# -------------------------------------------------------------------------------- run folders
@pytest.fixture(scope="module")
def data():
    from mbrl_offline import load_dataset

    return load_dataset("pendulum-medium").subset(range(500))


def tiny_trainer(data, run_dir):
    from mbrl_offline import build_run
    from mbrl_offline.generators import NoGeneratorConfig

    config = TrainerConfig(epochs=1, updates_per_epoch=3, eval_episodes=1, run_dir=str(run_dir), progress=False,
                           tensorboard=True)
    return build_run("td3bc", data, TD3BCConfig(hidden_size=8, batch_size=16), NoGeneratorConfig(), config)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_run_without_its_checkpoint_is_not_overwritten(data, tmp_path):
    """The checkpoint of a finished run was deleted to save disk: its logs still hold the run."""
    run_dir = tmp_path / "run"
    tiny_trainer(data, run_dir).train()
    (run_dir / "checkpoint.pt").unlink()
    (run_dir / "notes.txt").write_text("mine")
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError) as error:
        tiny_trainer(data, run_dir).train()
    assert str(error.value) == (f"{run_dir} already holds a run (run.json, metrics.jsonl, tensorboard); pass "
                                f"resume=true to continue it, overwrite=true to replace it, or choose another run_dir.")
    assert snapshot(run_dir) == before
    tiny_trainer(data, run_dir).train(overwrite=True)
    assert (run_dir / "checkpoint.pt").exists() and (run_dir / "notes.txt").read_text() == "mine"
    assert len(list((run_dir / "tensorboard").glob("events.*"))) == 1  # the old run's events are gone
    assert [r["epoch"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())] == [1]


@pytest.mark.parametrize("name", run_files())
def test_any_one_file_of_an_earlier_run_protects_its_folder(tmp_path, name):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).mkdir() if "." not in name else (run_dir / name).write_text("{}")
    with pytest.raises(CheckpointError, match=rf"already holds a run \({name}\); pass resume=true"):
        check_run_dir(run_dir)
    check_run_dir(run_dir, overwrite=True)
    with pytest.raises(ConfigError, match="resume=true and overwrite=true contradict each other"):
        check_run_dir(run_dir, resume=True, overwrite=True)
    check_run_dir(tmp_path / "fresh")  # an empty or missing folder is fine
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "unrelated.txt").write_text("")
    check_run_dir(tmp_path / "other")


def test_train_refuses_an_earlier_run_before_loading_data_and_overwrites_when_told(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"epoch": 1, "step": 5}\n')
    tiny = ["algo=td3bc", "env=pendulum", "algo.hidden_size=8", "trainer.epochs=1", "trainer.updates_per_epoch=3",
            "trainer.eval_episodes=1", "trainer.progress=false", "torch_threads=1", f"trainer.run_dir={run_dir}"]
    refused = run_tool("train.py", *tiny, cwd=tmp_path)
    assert_one_error_line(refused, f"error: {run_dir} already holds a run (metrics.jsonl); pass resume=true")
    assert refused.stdout == "" and (run_dir / "metrics.jsonl").read_text() == '{"epoch": 1, "step": 5}\n'
    done = run_tool("train.py", *tiny, "overwrite=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["step"] == 3


# ------------------------------------------------------------------------------- damaged logs
def write_fake_run(folder: Path, scores=(10.0, 20.0, 30.0)) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"algorithm": "ravl", "env": "pendulum", "seed": 0,
                                                 "dataset": "bundled:pendulum-medium", "dataset_score": 39.0}))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"epoch": i, "step": 10 * i, "eval": {"normalized_score": s}}) + "\n"
        for i, s in enumerate(scores, start=1)))
    return folder


GOOD_LINE = json.dumps({"epoch": 1, "step": 10, "eval": {"normalized_score": 1.0}})
DAMAGED_RUNS = {
    "run.json truncated": ("run.json", '{"algorithm": "ravl", "env"', "run.json is not valid JSON (truncated?)"),
    "run.json empty": ("run.json", "", "run.json is empty"),
    "run.json a list": ("run.json", "[1, 2]", "run.json holds a list, not a JSON object"),
    "run.json wrong type": ("run.json", json.dumps({"algorithm": 3, "dataset": "x"}), "run.json has no text 'algorithm'"),
    "run.json score text": ("run.json", json.dumps({"algorithm": "ravl", "dataset": "x", "dataset_score": "high"}),
                            "run.json has 'dataset_score' = 'high', not a number"),
    "run.json binary": ("run.json", b"\xff\xfe\x00", "run.json is not text"),
    "metrics truncated": ("metrics.jsonl", f"{GOOD_LINE}\n{GOOD_LINE}\n" + '{"epoch": 3, "st',
                          "metrics.jsonl line 3 is not valid JSON (truncated?)"),
    "metrics step text": ("metrics.jsonl", '{"epoch": 1, "step": "ten"}\n', "metrics.jsonl line 1 has no whole-number 'step'"),
    "metrics eval number": ("metrics.jsonl", '{"epoch": 1, "step": 1, "eval": 5}\n', "metrics.jsonl line 1 has 'eval' = 5"),
    "metrics group a list": ("metrics.jsonl", '{"epoch": 1, "step": 1, "eval_cdsa": [1]}\n',
                             "metrics.jsonl line 1 has 'eval_cdsa' = [1], not an object of metrics"),
    "metrics no score": ("metrics.jsonl", f'{GOOD_LINE}\n{{"epoch": 2, "step": 2, "eval": {{}}}}\n',
                         "metrics.jsonl line 2 has no number 'eval.normalized_score'"),
    "metrics a list": ("metrics.jsonl", "[1, 2]\n", "metrics.jsonl line 1 holds a list"),
    "metrics binary": ("metrics.jsonl", b"\x80\x81", "metrics.jsonl is not text"),
    "metrics missing": ("metrics.jsonl", None, "metrics.jsonl is missing"),
    "run.json missing": ("run.json", None, "run.json is missing"),
}


@pytest.mark.parametrize("case", DAMAGED_RUNS)
def test_a_damaged_run_log_is_refused_in_one_line_naming_the_file(tmp_path, case):
    from mbrl_offline.report import ReportError, find_runs

    name, content, message = DAMAGED_RUNS[case]
    run_dir = write_fake_run(tmp_path / "runs" / "r")
    write_fake_run(tmp_path / "runs" / "s")  # a good run beside it
    if content is None:
        (run_dir / name).unlink()
        if name == "run.json":  # a folder is a run by its run.json: name it directly
            with pytest.raises(ReportError) as error:
                from mbrl_offline.report import read_run

                read_run(run_dir)
            assert str(error.value).startswith(f"{run_dir / name} {message.split(' ', 1)[1]}")
            return
    else:
        (run_dir / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ReportError) as error:
        find_runs([tmp_path / "runs"])
    text = str(error.value)
    assert text.startswith(f"{run_dir / name}") and message.split(" ", 1)[1] in text and "\n" not in text, text


def test_the_report_tool_ends_in_one_line_on_a_damaged_log_and_writes_nothing(tmp_path):
    run_dir = write_fake_run(tmp_path / "runs" / "r")
    (run_dir / "metrics.jsonl").write_text(f"{GOOD_LINE}\n{GOOD_LINE}\n" + '{"epoch": 3, "st')
    result = run_tool("report.py", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_error_line(result, f"error: {run_dir / 'metrics.jsonl'} line 3 is not valid JSON (truncated?); "
                                  f"the run's log is damaged")
    assert not (tmp_path / "out").exists()


def test_a_resumed_run_with_a_damaged_log_is_refused_in_one_line(tmp_path):
    from mbrl_offline.logging import LogError, RunLogger

    (tmp_path / "metrics.jsonl").write_text(f"{GOOD_LINE}\nnot json\n")
    with pytest.raises(LogError, match=r"metrics.jsonl line 2 is not valid JSON"):
        RunLogger(tmp_path, resume_epoch=1)
    assert (tmp_path / "metrics.jsonl").read_text() == f"{GOOD_LINE}\nnot json\n"


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory):
    """A finished sweep of two trials (fake runs), made once and copied by each test."""
    from mbrl_offline.tune import run_sweep

    root = tmp_path_factory.mktemp("sweep")

    def run_trial(params, seed, run_dir, callbacks):
        write_fake_run(run_dir, scores=(params["algo.eta"],))
        return {"final_score": params["algo.eta"], "last10_score": params["algo.eta"]}

    config = SweepConfig(n_trials=2, dir=str(root / "sweep"), study_name="s", sampler=SamplerConfig(name="random"),
                         pruner=PrunerConfig(name="none"), space={"algo": {"eta": {"type": "float", "low": 0.1, "high": 1.0}}})
    run_sweep(config, run_trial, log=lambda _: None)
    return root / "sweep"


def copy_sweep(sweep_folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_folder, copy)
    info = json.loads((copy / "sweep.json").read_text())
    info["storage"] = f"sqlite:///{copy / 'study.db'}"
    (copy / "sweep.json").write_text(json.dumps(info))
    return copy


@pytest.mark.parametrize("damage, message", [
    ("sweep.json truncated", "sweep.json is not valid JSON (truncated?)"),
    ("sweep.json no storage", "sweep.json has no text 'storage'"),
    ("database missing", "study.db named in"),
    ("database garbage", "cannot open the study of sweep"),
    ("trial log truncated", "metrics.jsonl line 1 is not valid JSON"),
])
def test_a_damaged_sweep_folder_is_refused_in_one_line(sweep_folder, tmp_path, damage, message):
    from mbrl_offline.report import ReportError, find_runs

    sweep = copy_sweep(sweep_folder, tmp_path)
    find_runs([sweep])  # the copy is a good sweep
    if damage == "sweep.json truncated":
        (sweep / "sweep.json").write_text((sweep / "sweep.json").read_text()[:20])
    elif damage == "sweep.json no storage":
        (sweep / "sweep.json").write_text(json.dumps({"study_name": "s"}))
    elif damage == "database missing":
        (sweep / "study.db").unlink()
    elif damage == "database garbage":
        (sweep / "study.db").write_bytes(b"this is not a database" * 100)
    else:
        for log in sweep.glob("trial-*/seed-*/metrics.jsonl"):
            log.write_text('{"epoch": 1, "st')
    with pytest.raises(ReportError) as error:
        find_runs([sweep])
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert damage != "database missing" or not (sweep / "study.db").exists()  # nothing made in its place


# ---------------------------------------------------------------------- writes that fail midway
def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_an_hdf5_export_that_fails_midway_leaves_no_file_and_one_line(tmp_path, monkeypatch, hopper_data):
    """The file is made in memory; only its bytes go to the disk, through the atomic writer (a real full
    disk: tests/test_full_disk.py)."""
    import builtins

    from mbrl_offline import write_d4rl_hdf5

    real_open = builtins.open

    class HalfWritten:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.handle.write(bytes(data)[:100])
            full_disk()

    def opens_a_full_disk(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return HalfWritten(handle) if "w" in mode and str(file).endswith(".tmp") else handle

    monkeypatch.setattr(builtins, "open", opens_a_full_disk)
    out = tmp_path / "export.hdf5"
    with pytest.raises(DatasetError) as error:
        write_d4rl_hdf5(hopper_data, out)
    assert str(error.value) == (f"cannot write {out}: No space left on device; nothing was written. Check the free "
                                f"disk space and the folder's permissions, or choose another location.")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_d4rl_hdf5(hopper_data, out)
    before = out.read_bytes()
    monkeypatch.setattr(builtins, "open", opens_a_full_disk)
    with pytest.raises(DatasetError, match="No space left on device; nothing was written .the previous file is kept."):
        write_d4rl_hdf5(hopper_data, out, overwrite=True)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["export.hdf5"]
    monkeypatch.undo()
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(DatasetError, match=f"cannot write {regular / 'x.hdf5'}: "):
        write_d4rl_hdf5(hopper_data, regular / "x.hdf5")


def test_a_checkpoint_write_that_fails_keeps_the_old_file_and_is_one_line(tmp_path, monkeypatch):
    from mbrl_offline.utils import atomic_torch_save

    path = tmp_path / "checkpoint.pt"
    atomic_torch_save({"epoch": 1}, path)
    before = path.read_bytes()

    def half_written(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 partial")
        full_disk()

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(CheckpointError) as error:
        atomic_torch_save({"epoch": 2}, path)
    assert str(error.value).startswith(f"cannot write {path}: No space left on device; nothing was written")
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]

    def zip_writer_fails(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0: file write failed")

    monkeypatch.setattr(torch, "save", zip_writer_fails)
    with pytest.raises(CheckpointError, match="cannot write .*file write failed"):
        atomic_torch_save({"epoch": 2}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_report_write_that_fails_leaves_no_partial_file(tmp_path, monkeypatch):
    import matplotlib.figure

    from mbrl_offline.report import ReportError, write_report

    write_fake_run(tmp_path / "runs" / "r")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    with pytest.raises(ReportError) as error:
        write_report([tmp_path / "runs"], tmp_path / "out")
    assert str(error.value).startswith(f"cannot write the report in {tmp_path / 'out'}: No space left on device")
    assert list((tmp_path / "out").iterdir()) == []


# ------------------------------------------------------------------------------------- helpers
def run_tool(script, *args, cwd):
    env = {**os.environ, "MBRL_OFFLINE_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def assert_one_error_line(result, start: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), result.stderr


def test_a_dataset_of_another_env_is_refused_even_where_the_sizes_fit():
    from mbrl_offline import load_dataset

    with pytest.raises(DatasetError) as error:  # halfcheetah and walker2d have the same sizes
        load_dataset("halfcheetah-medium", env="walker2d")
    assert str(error.value) == ("bundled:halfcheetah-medium is a halfcheetah dataset, not a walker2d one; "
                                "use env=halfcheetah, or a walker2d dataset.")
    with pytest.raises(DatasetError, match="is a hopper dataset, not a pendulum one"):
        load_dataset("hopper-medium", env="pendulum")
    assert load_dataset("pendulum-medium", env="pendulum").env_name == "pendulum"
