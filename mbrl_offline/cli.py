"""Helpers for the command-line tools in `mbrl_offline.tools` (Hydra stays at that edge).

The tools run as console scripts (``mbrl-train``), as ``python -m mbrl_offline train`` and as
``python examples/train.py``; their configs are the package's (`mbrl_offline.config.CONFIG_DIR`).

`compose` builds a run's config from Hydra's groups and the overrides; `cli_main` makes every library
error a single ``error: ...`` line on stderr and exit status 2. The conversion of configs to and from
dicts is the library's (`mbrl_offline.config`; the library never imports this module).

Every tool has the same command line (`tool_config`): ``--help``, ``--cfg job`` and Hydra overrides,
where a value Hydra's grammar cannot read, such as a file path with non-ASCII characters, is taken whole
as a string (`quote_overrides`).
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from mbrl_offline import mkl_avx512
from mbrl_offline.config import (check_writable_dir, config_path_shown, config_to_dataclass, config_to_dict,
                                 did_you_mean, unknown_settings, unknown_settings_message)
from mbrl_offline.errors import ConfigError, MbrlOfflineError

F = TypeVar("F", bound=Callable[..., Any])



def cli_main(fn: F) -> F:
    """A tool's ``main(argv=None)``: ``argv`` defaults to the process's arguments (``sys.argv[1:]``), as a
    console script calls it; library errors are printed as one line and exit with status 2 instead of a
    traceback."""

    @functools.wraps(fn)
    def wrapper(argv: "list[str] | None" = None):
        try:
            mkl_avx512.check_environment()
            return fn(list(sys.argv[1:] if argv is None else argv))
        except MbrlOfflineError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def register_config_defaults(config_dir: Optional[str | Path] = None) -> None:
    """Put every config dataclass's defaults in Hydra's config store, so that the YAML files extend them
    (``trainer: defaults``, ``algo/ravl.yaml`` -> ``ravl_defaults``, ``generator/ravl.yaml`` -> RAVL's published
    generator, ``generator/rollouts.yaml`` -> ``rollouts_defaults``, ``sweep/*.yaml`` -> ``sweep_defaults``)
    instead of repeating them, and so that every registered family (`mbrl_offline.registry`, plugins
    included) is a config group option: ``algo=<name>`` (its config's defaults and its name),
    ``generator=<name>`` (its published generator) and ``generator=<kind>`` (the generator's defaults),
    each from the registry wherever ``config_dir`` has no YAML file of that name."""
    from hydra.core.config_store import ConfigStore

    import mbrl_offline.algorithms  # noqa: F401  (importing registers the library's families)
    import mbrl_offline.generators  # noqa: F401
    from mbrl_offline import registry
    from mbrl_offline.trainer import TrainerConfig
    from mbrl_offline.tune import SweepConfig

    has_yaml = (lambda group, name: (Path(config_dir) / group / f"{name}.yaml").is_file()) if config_dir else (
        lambda group, name: False)
    store = ConfigStore.instance()
    store.store(group="trainer", name="defaults", node=config_to_dict(TrainerConfig()))
    store.store(group="sweep", name="sweep_defaults", node=config_to_dict(SweepConfig()))
    nodes = []  # (group, name, settings)
    for name, (agent_cls, config_cls) in registry.agents().items():
        nodes.append(("algo", name, {**config_to_dict(config_cls()), "name": name}))
        nodes.append(("generator", name, config_to_dict(agent_cls.published_generator())))
    for kind, (config_cls, _) in registry.generators().items():
        nodes.append(("generator", kind, config_to_dict(config_cls())))
    for group, name, node in nodes:
        store.store(group=group, name=f"{name}_defaults", node=node)
        if not has_yaml(group, name):
            store.store(group=group, name=name, node=node)


@dataclasses.dataclass
class TrainSettings:
    """The top-level settings of ``mbrl_offline/configs/train.yaml`` (and tune.yaml, which includes it): their types,
    which `compose` holds every value to (`mbrl_offline.config.parse_setting`: ``overwrite=no`` is refused,
    never read as true)."""

    seed: int = 0
    device: str = "cpu"
    torch_threads: Optional[int] = None
    keep_freed_memory: bool = True
    resume: bool = False
    overwrite: bool = False
    dynamics_path: Optional[str] = None
    dynamics_cache: Optional[str] = None


@dataclasses.dataclass
class InspectSettings:
    """The top-level settings of ``mbrl_offline/configs/inspect_dataset.yaml``."""

    dataset: Optional[str] = None
    out: Optional[str] = None
    overwrite: bool = False


@dataclasses.dataclass
class EvaluateSettings:
    """The top-level settings of ``mbrl_offline/configs/evaluate.yaml``."""

    checkpoint: Optional[str] = None
    episodes: int = 10
    seed: int = 0
    device: str = "cpu"


# The types of each tool config's top-level settings (its sections, such as trainer.* or collect.*, are
# dataclasses of the library, converted where the tool builds them).
TOOL_SETTINGS = {"train": TrainSettings, "tune": TrainSettings, "inspect_dataset": InspectSettings,
                 "evaluate": EvaluateSettings}


def compose(config_dir: str, config_name: str, overrides: list[str]):
    """Hydra's composition of ``config_name`` with command-line ``overrides``; every mistake in an
    override (unknown group option or key, unparsable value, a key missing: ``=5``) becomes one
    `ConfigError` line, which names every unknown setting at once (`_compose`).

    A budget (``mbrl_offline/configs/budget/``) may hold settings for some runs only, under ``budget.when``:
    ``"<key>=<value>": {settings}`` applies where the composed config has that value (e.g. the quick
    budget's rollout count where ``generator.kind=rollouts``, its update count where
    ``algo.name=td3bc``). They go in as overrides before the command line's, which win.

    A preset (``mbrl_offline/configs/preset/``) that sets a setting the run's generator or algorithm lacks is refused
    naming the preset (`check_preset_settings`). The top-level settings are held to their types
    (`TOOL_SETTINGS`): a boolean is true or false, nothing else.

    A value Hydra's grammar cannot read (a file path with non-ASCII characters, spaces, ``=`` or ``,``)
    is taken whole as a string (`quote_overrides`)."""
    for override in overrides:
        key, sep, _ = str(override).partition("=")
        if sep and not key.lstrip("+~").strip():
            raise ConfigError(f"override '{override}' names no setting; write setting=value, e.g. seed=5.")
    overrides = quote_overrides(list(overrides))
    cfg, choices, unknown = _compose(config_dir, config_name, overrides)
    extra = budget_settings(cfg)  # of the config without the unknown settings, so that all are found at once
    origins = {}
    if extra:
        budget = choices.get("budget") or "?"
        origins = {override: f"set by budget {budget} for runs with {condition}" for override, condition in extra}
        cfg, choices, unknown = _compose(config_dir, config_name, [o for o, _ in extra] + list(overrides))
    if unknown:
        raise ConfigError(unknown_settings_line(unknown, cfg, overrides, config_dir, origins))
    if choices.get("preset"):
        check_preset_settings(cfg, config_dir, choices["preset"])
    if config_name in TOOL_SETTINGS:
        top_level_settings(cfg, TOOL_SETTINGS[config_name])
    return cfg


def top_level_settings(cfg, schema: type):
    """The top-level settings of a composed config as dataclass ``schema`` (`TOOL_SETTINGS`), each held to
    its type by `mbrl_offline.config.parse_setting`; a setting ``cfg`` lacks keeps the schema's default."""
    return config_to_dataclass(schema, {f.name: cfg[f.name] for f in dataclasses.fields(schema) if f.name in cfg}, "")


def budget_overrides(cfg) -> list[str]:
    """The ``key=value`` overrides that ``cfg.budget.when`` holds for this config (see `compose`)."""
    return [override for override, _ in budget_settings(cfg)]


def budget_settings(cfg) -> list[tuple[str, str]]:
    """``(key=value override, its condition)`` for each setting ``cfg.budget.when`` holds for this config."""
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
                        found.append((f"{prefix}{k}={json.dumps(v)}", condition))

            walk(flat, "")
    return found


def _override_key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _compose(config_dir: str, config_name: str, overrides: list[str]):
    """``(config, group choices, unknown settings)``: the one composition every tool's config goes
    through. Settings that do not exist are all collected, as ``(key, the overrides that set it)``
    (Hydra stops at the first: each is taken out and the rest composed again), for `compose` to refuse
    together in one line (`unknown_settings_line`), and the config is composed without them. Any other
    mistake is one `ConfigError` line; no Hydra exception leaves this function."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import (ConfigCompositionException, HydraException, MissingConfigException,
                              OverrideParseException)
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    register_config_defaults(config_dir)
    unknown: list[tuple[str, list[str]]] = []  # (key, the overrides that set it)
    remaining = list(overrides)
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        while True:
            try:
                cfg = hydra_compose(config_name=config_name, overrides=remaining, return_hydra_config=True)
                choices = dict(OmegaConf.select(cfg, "hydra.runtime.choices") or {})
                with open_dict(cfg):
                    del cfg["hydra"]
                # Resolved here, so that sub-trees handed to `config_to_dataclass` carry no interpolations.
                cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
                break
            except MissingConfigException as exc:
                group, _, option = (exc.missing_cfg_file or "").rpartition("/")
                options = [o for o in (exc.options or []) if not o.endswith("_defaults")]
                hint = did_you_mean(option, options)
                raise ConfigError(f"unknown {group or 'config'} '{option}'.{hint} Known: {', '.join(options)}.") from None
            except OverrideParseException as exc:
                raise ConfigError(f"cannot parse the override: {str(exc).splitlines()[0]}{_parse_fix(remaining)}") from None
            except ConfigCompositionException as exc:
                message = str(exc).splitlines()[0]
                key = message.split("'")[1] if message.startswith("Could not override '") else ""
                setting = [o for o in remaining if _override_key(o) == key] if key else []
                if not setting:
                    raise ConfigError(added_group_message(message, remaining, config_dir) or message) from None
                unknown.append((key, setting))
                remaining = [o for o in remaining if o not in setting]
            except (HydraException, OmegaConfBaseException) as exc:
                raise ConfigError(f"bad setting: {str(exc).splitlines()[0]}") from None
    return cfg, choices, unknown


def unknown_settings_line(unknown: list, cfg, overrides: list[str], config_dir, origins: dict) -> str:
    """The one line for the settings `_compose` found missing from the config ``cfg`` (composed without
    them), each with its hint: did you mean, where it moved (`moved_setting_hint`), the config group it
    needs (`group_setting_hint`), or the budget that set it (``origins``: override -> the words that say)."""
    from omegaconf import OmegaConf

    found, valid, from_budget = [], [], {}
    for key, setting in unknown:
        origin = origins[setting[0]] if all(o in origins for o in setting) else ""
        if origin:  # a budget's setting (and not the user's too): where it came from is the hint
            from_budget.setdefault(origin, []).append(key)
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        keys = list(node.keys()) if OmegaConf.is_dict(node) else []
        valid.append(keys)
        hint = (did_you_mean(leaf, keys, prefix=f"{parent}." if parent else "")
                or moved_setting_hint(key, cfg) or group_setting_hint(key, overrides, config_dir, cfg))
        found.append((key, hint))
    shown = f" Valid: {', '.join(valid[0])}." if valid and valid[0] and all(v == valid[0] for v in valid) else ""
    found += [(key, "") for keys in from_budget.values() for key in keys]  # the user's own first
    message = unknown_settings_message(found, "" if from_budget else shown)
    for origin, keys in from_budget.items():
        names = ", ".join(keys)
        message += (f" {names} {'is' if len(keys) == 1 else 'are'} {origin}, but this run's config does not have "
                    f"{'it' if len(keys) == 1 else 'them'}{_choose_hint(origin)}.")
    return message


def _choose_hint(origin: str) -> str:
    """For a budget's setting whose condition names a generator or algorithm by a setting
    (``generator.kind=synther``): choose that one by its group instead."""
    condition = origin.rpartition(" ")[2]
    key, _, value = condition.partition("=")
    group, _, leaf = key.partition(".")
    if leaf in ("kind", "name") and group in ("generator", "algo"):
        return f": choose the {group} with {group}={value}, not {key}={value}"
    return ""


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


def check_preset_settings(cfg, config_dir, preset: str) -> None:
    """Refuse, naming the preset's file, a preset (``mbrl_offline/configs/preset/<preset>.yaml``) that sets a setting
    the run's generator or algorithm does not have (``generator.rollout.*`` of a MOPO preset on a run
    with ``generator=synther``). Without this the setting would be refused as the user's own mistake."""
    import yaml
    from omegaconf import OmegaConf

    from mbrl_offline.algorithms import ALGORITHMS
    from mbrl_offline.generators import GENERATORS

    path = Path(config_dir) / "preset" / f"{preset}.yaml"
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    kind, algo = OmegaConf.select(cfg, "generator.kind"), OmegaConf.select(cfg, "algo.name")
    if values.get("preset_for", algo) != algo or values.get("preset_env", cfg.env.name) != cfg.env.name:
        return  # a preset for another algorithm or env: `check_preset` says so
    where = f"preset {preset} ({config_path_shown('preset', f'{preset}.yaml')})"
    if isinstance(values.get("generator"), dict) and kind in GENERATORS:
        bad = unknown_settings(GENERATORS[kind][0], values["generator"], "generator")
        if bad:
            made_for = values.get("preset_for") or "its algorithm"
            raise ConfigError(f"{where} sets {', '.join(bad)}, which generator {kind} does not have: its values are for "
                              f"{made_for}'s own generator; leave generator= unset (or choose one with those settings), "
                              f"or drop preset={preset}.")
    if isinstance(values.get("algo"), dict) and algo in ALGORITHMS:
        settings = {k: v for k, v in values["algo"].items() if k != "name"}
        bad = unknown_settings(ALGORITHMS[algo][1], settings, "algo")
        if bad:
            raise ConfigError(f"{where} sets {', '.join(bad)}, which algo {algo} does not have; use the preset with "
                              f"algo={values.get('preset_for') or '<its algorithm>'}, or drop preset={preset}.")


def train_sections(cfg):
    """``(agent class, algorithm config, generator config, trainer config)`` of a composed ``train``
    config: each section converted to its dataclass, every setting held to its type; the checks of
    the sections together are `resolve_train_config`'s (and ``build_run``'s)."""
    from mbrl_offline.algorithms import get_algorithm
    from mbrl_offline.generators import generator_config
    from mbrl_offline.trainer import TrainerConfig

    agent_cls, config_cls = get_algorithm(cfg.algo.name)
    algo_config = config_to_dataclass(config_cls, {k: v for k, v in cfg.algo.items() if k != "name"}, "algo")
    return (agent_cls, algo_config, generator_config(cfg.generator),
            config_to_dataclass(TrainerConfig, cfg.trainer, "trainer"))


def resolve_train_config(cfg):
    """The parts of a composed ``train`` config, each checked: ``(agent class, algorithm config,
    generator config, trainer config, env info)``. Raises `ConfigError` on any bad key or value, on
    a generator the agent cannot learn from, on a preset made for another algorithm or env, on a device
    this machine lacks and on a run folder or model cache that cannot be written (`check_run_settings`,
    `mbrl_offline.config.check_writable_dir`)."""
    from mbrl_offline.compose import check_pair
    from mbrl_offline.data.envs import get_env_info

    env = get_env_info(cfg.env.name)
    check_preset(cfg, env.name, cfg.env.get("dataset") or env.default_dataset)
    check_run_settings(cfg)
    agent_cls, algo_config, gen_config, trainer_config = train_sections(cfg)
    check_pair(agent_cls, gen_config, algo_config)
    check_writable_dir(trainer_config.run_dir, "trainer.run_dir")
    fitted = gen_config.fitted_model()  # the cache folder of a model that will be fitted (declared)
    if fitted is not None and not cfg.get("dynamics_path"):
        from mbrl_offline.cache import cache_root

        # (a read-only cache may still hold the model: only a path that can never be a folder is refused)
        check_writable_dir(cfg.get("dynamics_cache") or cache_root() / fitted, "dynamics_cache", permissions=False)
    return agent_cls, algo_config, gen_config, trainer_config, env


def check_preset(cfg, env_name: str, dataset: "str | None" = None) -> None:
    """Refuse a preset (mbrl_offline/configs/preset/) on a run it was not made for: each names the algorithm
    (``preset_for``), the env (``preset_env``) and the dataset (``preset_dataset``) whose published
    settings it holds. ``dataset`` is the run's dataset as named (a bundled name, a D4RL file, a
    Minari id); ``preset_dataset=null`` applies the preset to other data on purpose."""
    preset_for = cfg.get("preset_for")
    if preset_for is not None and preset_for != cfg.algo.name:
        raise ConfigError(f"that preset holds {preset_for} settings, not {cfg.algo.name}'s; "
                          f"use algo={preset_for} or a {cfg.algo.name}-... preset.")
    preset_env = cfg.get("preset_env")
    made_for = cfg.get("preset_dataset")
    if preset_env is not None and preset_env != env_name:
        raise ConfigError(f"that preset holds the settings published for {made_for or preset_env}, not for env "
                          f"{env_name}; use env={preset_env}, or a {cfg.algo.name}-{env_name}-... preset, or no preset.")
    if made_for is not None and dataset is not None and dataset_name(dataset) != made_for:
        raise ConfigError(f"that preset holds the settings published for {made_for}, but the data is {dataset}; "
                          f"use env.dataset={made_for} (or its D4RL file), a {cfg.algo.name}-{dataset_name(dataset)} "
                          f"preset, or preset_dataset=null to apply these settings to this data.")


def dataset_name(spec: str) -> str:
    """The D4RL-style name (``hopper-medium-replay``) of a dataset as a run names it: a bundled name,
    a D4RL file (``hopper_medium_replay-v2.hdf5``) or a Minari id (``mujoco/hopper/medium-v0``)."""
    import re

    for prefix in ("bundled:", "d4rl:", "minari:"):
        if spec.startswith(prefix):
            spec = spec[len(prefix):]
    if spec.lower().endswith((".hdf5", ".h5")):
        spec = Path(spec).stem
    elif "/" in spec:  # a Minari id: namespace/env/level-vN
        spec = "-".join(spec.split("/")[-2:])
    return re.sub(r"-v\d+$", "", spec.lower().replace("_", "-"))


def check_run_settings(cfg) -> None:
    """The run-wide settings of a ``train`` config (outside the dataclasses): their types (`TrainSettings`,
    as `compose` checks them), the seed, torch's thread count and the device
    (`mbrl_offline.config.check_device`), each refused in one line."""
    from mbrl_offline.config import check_device, require_nonnegative

    top = top_level_settings(cfg, TrainSettings)
    require_nonnegative(top, "seed", section="")
    require_nonnegative(top, "torch_threads", section="", hint=" (0 or null: torch's default)")
    check_device(top.device)


def build_trainer(cfg, callbacks=None):
    """The `Trainer` that a composed ``train`` config describes (the train tool, `mbrl_offline.tools.train`): the
    dataset, the agent, its generator with its model (trained or from the cache) and the trainer settings
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


# ------------------------------------------------------------------------------------ the tools' command line
# Every tool (mbrl_offline/tools/) takes the same command line: ``--help``/``-h``, ``--cfg job`` and Hydra overrides
# (``group=option``, ``key=value``), parsed here once. `tool_config` is the whole of it for a tool with one
# config; `parse_command_line`, `print_config` and `tool_help` are its parts, for tools that compose several
# configs (edge_of_reach.py); `ToolArgumentParser` gives the tools that take options (report.py) the same habits.

@dataclasses.dataclass(frozen=True)
class Tool:
    """One command-line tool: its module, whose ``main(argv=None)`` runs it and whose docstring is its
    ``--help`` text; its script in a checkout's ``examples/``; and one line on what it does."""

    module: str
    example: str
    summary: str


# The command-line tools, the one list of them: ``python -m mbrl_offline <name>`` dispatches from it
# (mbrl_offline/__main__.py), and setup.cfg's console scripts are ``mbrl-<name>`` for each (a test checks
# that the two agree).
TOOLS = {
    "train": Tool("mbrl_offline.tools.train", "train.py", "train an agent (with its generator) on a dataset"),
    "sweep": Tool("mbrl_offline.tools.sweep", "sweep.py", "tune an agent's settings with Optuna"),
    "evaluate": Tool("mbrl_offline.tools.evaluate", "evaluate.py", "evaluate a trained policy in the real env"),
    "collect": Tool("mbrl_offline.tools.collect", "collect.py", "make D4RL-style datasets for an env"),
    "report": Tool("mbrl_offline.tools.report", "report.py", "score tables and learning curves of runs and sweeps"),
    "inspect": Tool("mbrl_offline.tools.inspect_dataset", "inspect_dataset.py",
                    "check and summarise a dataset, export it to D4RL HDF5"),
    "bandit": Tool("mbrl_offline.tools.bandit", "bandit.py", "NEUBAY's bandit illustration (an experiment)"),
    "dynamics-error": Tool("mbrl_offline.tools.dynamics_error", "dynamics_error.py",
                           "PGD's dynamics error against a world model's (an experiment)"),
    "edge-of-reach": Tool("mbrl_offline.tools.edge_of_reach", "edge_of_reach.py",
                          "MOPO and RAVL with learned and true dynamics (an experiment)"),
}
MODULE_PROG = "python -m mbrl_offline"  # how `python -m mbrl_offline <tool>` names itself in sys.argv[0]


def console_script(tool: str) -> str:
    """The console script of tool ``tool``: ``mbrl-train``."""
    return f"mbrl-{tool}"


def invoked_as(tool: str | None = None) -> str:
    """How the running tool was started, as its usage line and messages show it: ``mbrl-train`` (a
    console script), ``python -m mbrl_offline train`` or ``python examples/train.py``. With ``tool``, how
    to start that tool the same way (``invoked_as("report")`` in ``mbrl-sweep`` is ``mbrl-report``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = Path(argv0).name
    if argv0.startswith(MODULE_PROG + " "):  # set by mbrl_offline/__main__.py
        return f"{MODULE_PROG} {tool}" if tool else argv0
    if name.startswith("mbrl-") and not name.endswith(".py"):
        return console_script(tool) if tool else name
    return f"python examples/{TOOLS[tool].example if tool else (name or 'train.py')}"


HELP_FLAGS = ("-h", "--help")
CFG_FLAGS = ("-c", "--cfg")

# Where each config section's settings are documented: the dataclass they fill, or the config files.
# The algo and generator sections are written from the registries (`setting_docs`).
SETTING_DOCS = {
    "trainer": "the fields of TrainerConfig (mbrl_offline/trainer.py)",
    "env": "env.name and env.dataset (a bundled name, D4RL .hdf5 file or Minari id; null: the env's default), "
           f"{config_path_shown('env', '<name>.yaml')}; the env registry is mbrl_offline/data/envs.py",
    "budget": f"a training schedule, {config_path_shown('budget', '<name>.yaml')} (trainer.* settings, and under "
              "budget.when settings for some runs only)",
    "preset": f"published per-dataset settings, {config_path_shown('preset', '<algo>-<env>-<dataset>.yaml')}",
    "sweep": "the fields of SweepConfig (mbrl_offline/tune.py); the search space is sweep.space",
    "collect": "the fields of CollectConfig (mbrl_offline/collect.py)",
    "bandit": "the fields of BanditConfig (mbrl_offline/bandit.py); bandit=cpu (CPU sizes) or bandit=paper (the "
              f"official sizes), {config_path_shown('bandit', '<name>.yaml')}",
}


@functools.lru_cache(maxsize=None)
def setting_docs() -> dict[str, str]:
    """`SETTING_DOCS` with the ``algo`` and ``generator`` sections, each naming the config dataclass of
    every registered algorithm and generator kind and the module that holds it (so that a new one
    appears in every tool's ``--help`` without an edit here)."""
    import mbrl_offline.algorithms  # noqa: F401  (importing registers the library's families)
    import mbrl_offline.generators  # noqa: F401
    from mbrl_offline import registry

    def where(cls) -> str:  # the class's file, from the package's folder on (a plugin's: its module)
        path = Path(sys.modules[cls.__module__].__file__).resolve()
        root = Path(__file__).resolve().parent.parent
        if not path.is_relative_to(root):
            return f"{cls.__module__}.{cls.__name__}"
        return f"{path.relative_to(root).as_posix()}: {cls.__name__}"

    def fields(cls) -> str:  # generator.<name>, and generator.<name>.* for a nested config
        defaults = cls()
        return ", ".join(f"generator.{f.name}{'.*' if dataclasses.is_dataclass(getattr(defaults, f.name)) else ''}"
                         for f in dataclasses.fields(cls) if f.name != "kind")

    algos = "; ".join(f"algo={name}: {where(config)}" for name, (_, config) in registry.agents().items())
    kinds = "; ".join(f"generator={kind}: {where(config)} ({fields(config) or 'no settings'})"
                      for kind, (config, _) in registry.generators().items())
    return {**SETTING_DOCS,
            "algo": f"the fields of the algorithm's config dataclass ({algos})",
            "generator": f"the fields of the generator kind's config dataclass ({kinds}); generator=<algo> starts "
                         "from that algorithm's published generator (its published_generator())"}

QUOTING_NOTE = ("Values are read as Hydra overrides (lists key=[a,b], interpolations ${...}, quotes 'a b'); a "
                "value Hydra's grammar cannot read as written, such as a file path with spaces, non-ASCII "
                "characters, '=' or ',' (in the shell: key='/tmp/runs/été 1'), is taken "
                "whole as a string.")


def tool_config(argv: list[str], doc: str, config_dir, config_name: str, extra_settings: dict | None = None):
    """A tool's command line, the same for every tool: ``--help`` prints `tool_help` and
    exits 0; ``--cfg job`` prints the composed config (`compose`: budget settings applied) as YAML and
    exits 0; anything else is Hydra overrides, and the composed config is returned."""
    overrides, show = parse_command_line(argv, doc, config_dir, config_name, extra_settings)
    cfg = compose(config_dir, config_name, overrides)
    if show:
        print_config(cfg)
    return cfg


def parse_command_line(argv: list[str], doc: str, config_dir, config_name: str,
                       extra_settings: dict | None = None) -> tuple[list[str], bool]:
    """``(overrides, cfg_job)``: the Hydra overrides of ``argv`` and whether ``--cfg job`` (also
    ``-c job``, ``--cfg=job``) asked for the composed config. ``--help``/``-h`` prints `tool_help` and
    exits 0 before anything else; ``--resolve`` is accepted (the config is always resolved); any other
    ``-option`` is a `ConfigError`."""
    if any(a in HELP_FLAGS for a in argv):
        print(tool_help(doc, config_dir, config_name, extra_settings))
        sys.exit(0)
    overrides, cfg_job, rest = [], False, list(argv)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name in CFG_FLAGS:
            if not eq:
                value = rest.pop(0) if rest else ""
            if value != "job":
                raise ConfigError(f"{name} {value or '(nothing)'}: these tools print only the job's config "
                                  f"(they have no Hydra settings of their own); write {name} job.")
            cfg_job = True
        elif arg == "--resolve":
            continue
        elif arg in ("-m", "--multirun"):
            raise ConfigError(f"{arg}: the tools run one job; for a search over settings use the sweep tool "
                              f"({invoked_as('sweep')}).")
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option '{arg}'; the tools take --help, --cfg job and setting=value "
                              f"overrides (see --help).")
        else:
            overrides.append(arg)
    return overrides, cfg_job


def print_config(cfg) -> None:
    """Print a config (a composed DictConfig or a plain dict) as YAML and exit 0: ``--cfg job``."""
    from omegaconf import OmegaConf

    print(OmegaConf.to_yaml(OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg), end="", flush=True)
    sys.exit(0)


def tool_help(doc: str, config_dir, config_name: str, extra_settings: dict | None = None) -> str:
    """A tool's ``--help``: its purpose (the first paragraph of its module docstring), its config groups
    and their options (read from ``config_dir``), and where each setting is documented."""
    groups, settings = config_layout(config_dir, config_name)
    lines = [purpose(doc), "",
             f"usage: {invoked_as()} [--help] [--cfg job] [group=option ...] [setting=value ...]", ""]
    if groups:
        lines.append(f"Config groups ({config_path_shown('<group>')}/); choose one option with group=option:")
        for group, options, default in groups:
            if default is None:
                shown = "none"
            elif "${" in str(default):
                shown = f"as {str(default).strip('${}')}"  # e.g. the generator follows the algo
            else:
                shown = str(default)
            lines.append(f"  {group}: {', '.join(options)} (default: {shown})")
    else:
        lines.append("Config groups: none.")
    lines += ["", f"Settings ({config_path_shown(config_name + '.yaml')} and the files it includes), where each is "
                  "documented:"]
    section_names = {name for name, _, _ in settings}
    for group, _, _ in groups:
        if group in setting_docs() and group not in section_names:
            lines.append(f"  {group}{'.*' if group in ('algo', 'generator', 'env') else ''}: {setting_docs()[group]}")
    for name, default, comment in settings:
        if name in setting_docs():
            lines.append(f"  {name}.*: {setting_docs()[name]}")
        else:
            lines.append(f"  {name}={default}" + (f"  # {comment}" if comment else ""))
    for name, text in (extra_settings or {}).items():
        lines.append(f"  {name}: {text}")
    lines += ["", "--cfg job prints the composed config (what the tool would run with) as YAML and runs nothing.",
              QUOTING_NOTE]
    return "\n".join(_wrap(line) for line in lines)


def _wrap(line: str, width: int = 110) -> str:
    """A help line wrapped at ``width``, continuation lines indented under its text."""
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) or line


def purpose(doc: str) -> str:
    """The first paragraph of a module docstring."""
    return (doc or "").strip().split("\n\n")[0].strip()


def config_layout(config_dir, config_name: str) -> tuple[list, list]:
    """What ``<config_dir>/<config_name>.yaml`` is made of, read from the files (nothing composed):
    ``(groups, settings)``, groups as ``(group, options, default option)`` for each config group
    (a folder of ``config_dir``) its defaults list names, settings as ``(name, default, comment)`` for
    each top-level key of it and of the configs it includes (a section such as ``trainer`` with the
    default and comment empty)."""
    import re

    import yaml

    root = Path(config_dir)
    groups: dict = {}
    settings: dict = {}

    def visit(name: str) -> None:
        path = root / f"{name}.yaml"
        text = path.read_text(encoding="utf-8")
        for entry in (yaml.safe_load(text) or {}).get("defaults", []):
            if isinstance(entry, str) and entry != "_self_" and (root / f"{entry}.yaml").exists():
                visit(entry)
            elif isinstance(entry, dict):
                for key, default in entry.items():
                    group = key.replace("optional ", "").split("@")[0].strip()
                    if (root / group).is_dir():
                        groups.setdefault(group, default)
                    elif group in setting_docs():  # a group of the config store (trainer: defaults)
                        settings.setdefault(group, ("", ""))
        for line in text.splitlines():
            match = re.match(r"^([A-Za-z_]\w*):\s*(.*?)\s*(?:#\s*(.*))?$", line)
            if match and match[1] not in ("defaults", "hydra"):
                key, value, comment = match[1], match[2], match[3] or ""
                settings.setdefault(key, ("", "") if value == "" else (value, comment))

    visit(config_name)
    group_rows = [(g, sorted(p.stem for p in (root / g).glob("*.yaml")), d) for g, d in groups.items()]
    return group_rows, [(k, v, c) for k, (v, c) in settings.items() if k not in groups or k in setting_docs()]


class ToolArgumentParser:
    """``argparse`` for the tools that take options rather than settings (report.py,
    dynamics_in_pytorch.py), with the other tools' habits: ``--help`` shows the module docstring's first
    paragraph, ``--cfg job`` prints the parsed options as YAML and exits 0, and a mistake is one
    `ConfigError` line (exit status 2 under `cli_main`)."""

    def __init__(self, prog: str, doc: str):
        import argparse

        class _Parser(argparse.ArgumentParser):
            def error(self, message):  # argparse prints usage and exits; the tools print one line
                raise ConfigError(f"{message} (see {self.prog} --help).")

        self.parser = _Parser(prog=prog, description=purpose(doc),
                              epilog="--cfg job prints the parsed options as YAML and runs nothing.",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_argument = self.parser.add_argument

    def parse_args(self, argv: list[str]):
        rest, cfg_job = [], False
        args = list(argv)
        while args:
            arg = args.pop(0)
            name, eq, value = arg.partition("=")
            if name in CFG_FLAGS:
                value = value if eq else (args.pop(0) if args else "")
                if value != "job":
                    raise ConfigError(f"{name} {value or '(nothing)'}: write {name} job to print the options.")
                cfg_job = True
            else:
                rest.append(arg)
        parsed = self.parser.parse_args(rest)
        if cfg_job:
            print_config({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(parsed).items()})
        return parsed


def group_setting_hint(key: str, overrides: list[str], config_dir, cfg) -> str:
    """Where a config group's choice was written as a setting, ``collect.env=hopper``, or ``env.name=hopper``
    in a config ``cfg`` without an env: the env is the ``env`` group, chosen with ``env=hopper`` as in
    train.py."""
    root = Path(config_dir)
    parts = key.split(".")
    if len(parts) < 2:
        return ""
    if (root / parts[-1]).is_dir():
        group = parts[-1]
    elif (root / parts[0]).is_dir() and parts[0] not in cfg:
        group = parts[0]
    else:
        return ""
    value = next((o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+~") == key), "")
    options = ", ".join(sorted(p.stem for p in (root / group).glob("*.yaml")))
    if parts[-1] == group or parts[-1] == "name":
        return f" The {group} is a config group: choose it with {group}={value or '<option>'} ({options})."
    return f" {group}.* settings need the {group} group chosen: {group}=<option> ({options})."


def added_group_message(message: str, overrides: list[str], config_dir) -> str:
    """Hydra's "Multiple values for env" (``+env=hopper`` where the config already has an env) as the
    command line to write instead; empty for any other message."""
    group = message.removeprefix("Multiple values for ").split(".")[0].strip()
    if not message.startswith("Multiple values for ") or not (Path(config_dir) / group).is_dir():
        return ""
    value = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] in (f"+{group}", f"++{group}")),
                 "<option>")
    return (f"+{group}={value}: {group} is already chosen by this config; choose another with {group}={value} "
            f"(without '+').")


def _parse_fix(overrides: list[str]) -> str:
    """The end of the message for an override Hydra cannot parse: which one, and how to write it (a
    value that starts as Hydra syntax but is a file path needs Hydra's quotes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except Exception:
            key, sep, value = override.partition("=")
            if sep and value[:1] in ("[", "{", "'", '"'):
                quoted = QuotedString(text=value, quote=Quote.single).with_quotes()
                return (f" in {override} (lists are written key=[a,b]; a file path that starts with "
                        f"{value[0]} needs quotes: \"{key}={quoted}\").")
            return f" in {override} (write key=value, lists as key=[a,b])."
    return " (write key=value, lists as key=[a,b])."


def quote_overrides(overrides: list[str]) -> list[str]:
    """The overrides with every value that Hydra's grammar would reject, or read as a sweep (which a
    single run cannot do), quoted as one string: file paths with spaces, non-ASCII characters (Hydra's
    unquoted values are ASCII only), ``=``, ``,``, brackets or quotes work as written. Values Hydra reads
    (numbers, lists ``[a,b]``, dicts, interpolations ``${...}``, quoted strings) are unchanged, and so is
    a value that starts as Hydra syntax (``[``, ``{``, a quote, a call of one of Hydra's functions such as
    ``choice(``), so that its mistake gets Hydra's own message. A path that starts with ``[``, ``{`` or a
    quote needs Hydra's quotes, ``key='[draft] run'``, and the parse error for it says so (`_parse_fix`)."""
    return [_quoted(o) for o in overrides]


def _quoted(override: str) -> str:
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString

    key, sep, value = override.partition("=")
    if not sep or not value:
        return override
    parser = OverridesParser.create()
    start = value.lstrip()
    call = re.match(r"([A-Za-z_]\w*)\s*\(", start)
    # Hydra syntax: a list, a dict, a quoted string or a call of one of its functions (choice(a,b), int(3), ...)
    if start[:1] in ("[", "{", "'", '"') or (call and call[1] in parser.functions.definitions):
        return override
    try:
        if not parser.parse_override(override).is_sweep_override():
            return override  # Hydra reads it: a number, a word, a path of ASCII characters, an interpolation
    except Exception:  # any failure to parse: Hydra cannot read the value as written
        pass
    quoted = f"{key}={QuotedString(text=value, quote=Quote.single).with_quotes()}"
    try:
        parser.parse_override(quoted)
    except Exception:  # the key itself is wrong: Hydra's message names it
        return override
    return quoted
