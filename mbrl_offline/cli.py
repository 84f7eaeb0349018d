"""Helpers for the command-line entry points in ``examples/`` (Hydra stays at that edge).

`compose` builds a run's config from Hydra's groups and the overrides; `cli_main` makes every library
error a single ``error: ...`` line on stderr and exit status 2. The conversion of configs to and from
dicts is the library's (`mbrl_offline.config`; the library never imports this module).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from mbrl_offline import mkl_avx512
from mbrl_offline.config import check_writable_dir, config_to_dataclass, config_to_dict, did_you_mean
from mbrl_offline.errors import ConfigError, MbrlOfflineError

F = TypeVar("F", bound=Callable[..., Any])


def cli_main(fn: F) -> F:
    """Print library errors as one line and exit with status 2 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            mkl_avx512.check_environment()
            return fn(*args, **kwargs)
        except MbrlOfflineError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def register_config_defaults() -> None:
    """Put every config dataclass's defaults in Hydra's config store, so the YAML files extend them
    (``trainer: defaults``, ``algo/ravl.yaml`` -> ``ravl_defaults``, ``generator/ravl.yaml`` -> RAVL's published
    generator, ``generator/rollouts.yaml`` -> ``rollouts_defaults``, ``sweep/*.yaml`` -> ``sweep_defaults``)
    instead of repeating them."""
    from hydra.core.config_store import ConfigStore

    from mbrl_offline.algorithms import ALGORITHMS
    from mbrl_offline.generators import GENERATORS
    from mbrl_offline.trainer import TrainerConfig
    from mbrl_offline.tune import SweepConfig

    store = ConfigStore.instance()
    store.store(group="trainer", name="defaults", node=config_to_dict(TrainerConfig()))
    store.store(group="sweep", name="sweep_defaults", node=config_to_dict(SweepConfig()))
    for name, (agent_cls, config_cls) in ALGORITHMS.items():
        store.store(group="algo", name=f"{name}_defaults", node=config_to_dict(config_cls()))
        store.store(group="generator", name=f"{name}_defaults", node=config_to_dict(agent_cls.published_generator()))
    for kind, (config_cls, _) in GENERATORS.items():
        store.store(group="generator", name=f"{kind}_defaults", node=config_to_dict(config_cls()))


def compose(config_dir: str, config_name: str, overrides: list[str]):
    """Hydra's composition of ``config_name`` with command-line ``overrides``; every mistake in an
    override (unknown group option or key, unparsable value) becomes one `ConfigError` line.

    A budget (``configs/budget/``) may hold settings for some runs only, under ``budget.when``:
    ``"<key>=<value>": {settings}`` applies where the composed config has that value (e.g. the quick
    budget's rollout count where ``generator.kind=rollouts``, its update count where
    ``algo.name=td3bc``). They go in as overrides before the command line's, which win."""
    cfg = _compose(config_dir, config_name, overrides)
    extra = budget_overrides(cfg)
    return _compose(config_dir, config_name, extra + list(overrides)) if extra else cfg


def budget_overrides(cfg) -> list[str]:
    """The ``key=value`` overrides that ``cfg.budget.when`` holds for this config (see `compose`)."""
    import json

    from omegaconf import OmegaConf

    when = OmegaConf.select(cfg, "budget.when") or {}
    found = []
    for condition, settings in when.items():
        key, sep, value = condition.partition("=")
        if not sep:
            raise ConfigError(f"budget.when key '{condition}' must read '<setting>=<value>'.")
        if str(OmegaConf.select(cfg, key)) == value:
            flat = OmegaConf.to_container(settings, resolve=True)

            def walk(node, prefix):
                for k, v in node.items():
                    if isinstance(v, dict):
                        walk(v, f"{prefix}{k}.")
                    else:
                        found.append(f"{prefix}{k}={json.dumps(v)}")

            walk(flat, "")
    return found


def _compose(config_dir: str, config_name: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_config_defaults()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        try:
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
            # Resolved here, so that sub-trees handed to `config_to_dataclass` carry no interpolations.
            return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        except MissingConfigException as exc:
            group, _, option = (exc.missing_cfg_file or "").rpartition("/")
            options = [o for o in (exc.options or []) if not o.endswith("_defaults")]
            hint = did_you_mean(option, options)
            raise ConfigError(f"unknown {group or 'config'} '{option}'.{hint} Known: {', '.join(options)}.") from None
        except OverrideParseException as exc:
            raise ConfigError(f"cannot parse the override: {str(exc).splitlines()[0]} "
                              f"(write key=value, lists as key=[a,b]).") from None
        except ConfigCompositionException as exc:
            message = str(exc).splitlines()[0]
            if message.startswith("Could not override '"):
                key = message.split("'")[1]
                base = hydra_compose(config_name=config_name, overrides=[o for o in overrides if o.split("=")[0] != key])
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(base, parent) if parent else base
                valid = list(node.keys()) if OmegaConf.is_dict(node) else []
                hint = did_you_mean(leaf, valid, prefix=f"{parent}." if parent else "") or moved_setting_hint(key, base)
                raise ConfigError(f"unknown setting '{key}'.{hint}"
                                  + (f" Valid: {', '.join(valid)}." if valid else "")) from None
            raise ConfigError(message) from None
        except OmegaConfBaseException as exc:
            raise ConfigError(f"bad setting: {str(exc).splitlines()[0]}") from None


MOVED_TO_GENERATOR = {"rollout": "generator.rollout", "dynamics": "generator.dynamics",
                      "true_dynamics": "generator.true_dynamics", "real_ratio": "generator.mixing.real_ratio"}


def moved_setting_hint(key: str, cfg) -> str:
    """Where a setting that is not in the config lives instead: the generator's settings left ``algo.*``
    when generators became their own config group; ``generator=none`` has none."""
    from omegaconf import OmegaConf

    parts = key.split(".")
    if parts[0] == "algo" and len(parts) > 1 and parts[1] in MOVED_TO_GENERATOR:
        return (f" The generator's settings are under generator.*: write "
                f"{'.'.join([MOVED_TO_GENERATOR[parts[1]], *parts[2:]])}.")
    if parts[0] == "generator" and OmegaConf.select(cfg, "generator.kind") == "none":
        return " This run has no generator (generator=none); name one (e.g. generator=rollouts) to set its settings."
    return ""


def resolve_train_config(cfg):
    """The parts of a composed ``train`` config, each checked: ``(agent class, algorithm config,
    generator config, trainer config, env info)``. Raises `ConfigError` on any bad key or value, on
    a generator the agent cannot learn from, on a preset made for another algorithm or env, on a device
    this machine lacks and on a run folder or model cache that cannot be written (`check_run_settings`,
    `mbrl_offline.config.check_writable_dir`)."""
    from mbrl_offline.algorithms import get_algorithm
    from mbrl_offline.compose import check_pair
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.generators import generator_config
    from mbrl_offline.trainer import TrainerConfig

    agent_cls, config_cls = get_algorithm(cfg.algo.name)
    env = get_env_info(cfg.env.name)
    check_preset(cfg, env.name)
    check_run_settings(cfg)
    algo_config = config_to_dataclass(config_cls, {k: v for k, v in cfg.algo.items() if k != "name"}, "algo")
    gen_config = generator_config(cfg.generator)
    check_pair(agent_cls, gen_config)
    trainer_config = config_to_dataclass(TrainerConfig, cfg.trainer, "trainer")
    check_writable_dir(trainer_config.run_dir, "trainer.run_dir")
    if getattr(gen_config, "dynamics", None) is not None and not getattr(gen_config, "true_dynamics", False) \
            and not cfg.get("dynamics_path"):  # a model will be fitted and cached: its folder must take it
        from mbrl_offline.cache import cache_root

        # (a read-only cache may still hold the model: only a path that can never be a folder is refused)
        check_writable_dir(cfg.get("dynamics_cache") or cache_root() / "dynamics", "dynamics_cache",
                           permissions=False)
    return agent_cls, algo_config, gen_config, trainer_config, env


def check_preset(cfg, env_name: str) -> None:
    """Refuse a preset (configs/preset/) on a run it was not made for: each names the algorithm
    (``preset_for``) and the env (``preset_env``) whose published settings it holds; ``preset_dataset``
    says which of the env's datasets."""
    preset_for = cfg.get("preset_for")
    if preset_for is not None and preset_for != cfg.algo.name:
        raise ConfigError(f"that preset holds {preset_for} settings, not {cfg.algo.name}'s; "
                          f"use algo={preset_for} or a {cfg.algo.name}-... preset.")
    preset_env = cfg.get("preset_env")
    if preset_env is not None and preset_env != env_name:
        made_for = cfg.get("preset_dataset") or preset_env
        raise ConfigError(f"that preset holds the settings published for {made_for}, not for env {env_name}; "
                          f"use env={preset_env}, or a {cfg.algo.name}-{env_name}-... preset, or no preset.")


def check_run_settings(cfg) -> None:
    """The run-wide settings of a ``train`` config (outside the dataclasses): the seed, torch's thread
    count and the device (`mbrl_offline.config.check_device`), each refused in one line."""
    from types import SimpleNamespace

    from mbrl_offline.config import check_device, require_nonnegative

    top = SimpleNamespace(seed=cfg.get("seed", 0), torch_threads=cfg.get("torch_threads"))
    require_nonnegative(top, "seed", section="")
    threads = top.torch_threads
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        raise ConfigError(f"torch_threads = {top.torch_threads!r} must be a whole number (or null: torch's default).")
    require_nonnegative(top, "torch_threads", section="", hint=" (0 or null: torch's default)")
    check_device(cfg.get("device", "cpu"))


def build_trainer(cfg, callbacks=None):
    """The `Trainer` that a composed ``train`` config describes (``examples/train.py``): the dataset,
    the agent, its generator with its model (trained or from the cache) and the trainer settings
    (`mbrl_offline.build_run`)."""
    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.compose import build_run
    from mbrl_offline.trainer import check_run_dir
    from mbrl_offline.utils import keep_freed_memory

    agent_cls, algo_config, gen_config, trainer_config, env = resolve_train_config(cfg)
    # before the data is loaded and a model fitted: a folder holding an earlier run is refused now
    check_run_dir(trainer_config.run_dir, resume=cfg.get("resume", False), overwrite=cfg.get("overwrite", False))
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if cfg.keep_freed_memory and torch.device(cfg.device).type == "cpu":
        keep_freed_memory()
    dataset = load_dataset(cfg.env.dataset or env.default_dataset, env=env.name)
    print(f"{agent_cls.__name__} on {dataset.source} ({len(dataset)} transitions, data score "
          f"{dataset.summary()['normalized_score_mean']:.1f}), generator {gen_config.kind}; run folder "
          f"{trainer_config.run_dir}", flush=True)
    if torch.device(cfg.device).type == "cpu" and (advice := mkl_avx512.advice()):
        print(advice, flush=True)
    return build_run(agent_cls.name, dataset, algo_config, gen_config, trainer_config, cfg.device,
                     cache_dir=cfg.dynamics_cache, dynamics_path=cfg.dynamics_path, callbacks=callbacks)
