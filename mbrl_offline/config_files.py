"""The config files (`mbrl_offline.config.CONFIG_DIR`), composed by Hydra: the one composition that every
tool's command line and `mbrl_offline.compose.run_configs` (budgets from Python) go through.

`compose` builds a config from Hydra's groups and the overrides. Every mistake in an override becomes
one `ConfigError` line that names every unknown setting at once, with its hint (did you mean, where it
moved, the group it needs, the budget or preset that set it). Budgets (``budget/*.yaml``) may hold
settings for some runs only (``budget.when``, `budget_settings`): Hydra cannot choose a group's option
by another group's *value* (the quick budget's rollout count applies where ``generator.kind=rollouts``,
whichever ``generator=`` choice gave that kind), so this is the one mechanism for it. The top-level
settings are held to their types (`TOOL_SETTINGS`), and a value Hydra's grammar cannot read, such as a
file path with spaces, is taken whole as a string (`quote_overrides`).

Every registered family is a config group option (`register_config_defaults`): ``algo=<name>``,
``generator=<name>`` (its published generator) and ``generator=<kind>``, from the registries
(`mbrl_offline.registry`) where the config folder has no YAML of that name. Hydra is imported inside
the functions, so importing this module costs nothing. The command line's own layer (`mbrl_offline.cli`:
``--help``, ``--cfg job``, one-line errors and exit status 2) builds on this module.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from mbrl_offline.config import (config_path_shown, config_to_dataclass, config_to_dict, did_you_mean,
                                 unknown_settings, unknown_settings_message)
from mbrl_offline.errors import ConfigError


def registered_families() -> tuple[dict, dict]:
    """``(agents, generators)``: `mbrl_offline.registry.agents` and ``generators`` with the library's own
    families registered (importing their packages registers them; the registry cannot import them, as
    they import it) and the plugins loaded."""
    import mbrl_offline.algorithms  # noqa: F401
    import mbrl_offline.generators  # noqa: F401
    from mbrl_offline import registry

    return registry.agents(), registry.generators()


def register_config_defaults(config_dir: Optional[str | Path] = None) -> None:
    """Put every config dataclass's defaults in Hydra's config store, so that the YAML files extend them
    (``trainer: defaults``, ``algo/ravl.yaml`` -> ``ravl_defaults``, ``generator/ravl.yaml`` -> RAVL's published
    generator, ``generator/rollouts.yaml`` -> ``rollouts_defaults``, ``sweep/*.yaml`` -> ``sweep_defaults``)
    instead of repeating them, and so that every registered family (`mbrl_offline.registry`, plugins
    included) is a config group option: ``algo=<name>`` (its config's defaults and its name),
    ``generator=<name>`` (its published generator) and ``generator=<kind>`` (the generator's defaults),
    each from the registry wherever ``config_dir`` has no YAML file of that name."""
    from hydra.core.config_store import ConfigStore

    from mbrl_offline.adjust import CDSAConfig
    from mbrl_offline.trainer import TrainerConfig
    from mbrl_offline.tune import SweepConfig

    has_yaml = (lambda group, name: (Path(config_dir) / group / f"{name}.yaml").is_file()) if config_dir else (
        lambda group, name: False)
    nodes = [("trainer", "defaults", config_to_dict(TrainerConfig())),
             ("sweep", "sweep_defaults", config_to_dict(SweepConfig())),
             ("cdsa", "defaults", config_to_dict(CDSAConfig()))]  # the evaluate tool's cdsa.*
    agents, generators = registered_families()
    families = []  # (group, name, settings)
    for name, (agent_cls, config_cls) in agents.items():
        families.append(("algo", name, {**config_to_dict(config_cls()), "name": name}))
        families.append(("generator", name, config_to_dict(agent_cls.published_generator())))
    for kind, (config_cls, _) in generators.items():
        families.append(("generator", kind, config_to_dict(config_cls())))
    for group, name, node in families:
        nodes.append((group, f"{name}_defaults", node))
        if not has_yaml(group, name):
            nodes.append((group, name, node))
    # Storing a node converts it to a structured config, most of a composition's time; the store keeps what
    # it holds for the process, so the same nodes (every tool call after the first) are not stored again.
    global _STORED
    if _STORED == nodes:
        return
    store = ConfigStore.instance()
    # an option stored earlier whose family has left the registry (a plugin taken out again) leaves the store
    # too, so that no composition offers it or lists it among the known options
    for group, name in {(g, n) for g, n, _ in _STORED} - {(g, n) for g, n, _ in nodes}:
        store.repo.get(group, {}).pop(f"{name}.yaml", None)
    for group, name, node in nodes:
        store.store(group=group, name=name, node=node)
    _STORED = nodes


_STORED: list = []  # the nodes `register_config_defaults` last put in Hydra's config store


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
    risk_level: float = 0.1
    adjust: str = "none"
    device: str = "cpu"


@dataclasses.dataclass
class ExportSettings:
    """The top-level settings of ``mbrl_offline/configs/export.yaml``."""

    checkpoint: Optional[str] = None
    format: str = "torchscript"
    out: Optional[str] = None
    overwrite: bool = False


@dataclasses.dataclass
class FinetuneSettings:
    """The top-level settings of ``mbrl_offline/configs/finetune.yaml``."""

    checkpoint: Optional[str] = None
    dataset: Optional[str] = None
    data: str = "append"
    model: str = "refit"
    online: bool = False
    device: str = "cpu"
    torch_threads: Optional[int] = None
    keep_freed_memory: bool = True
    dynamics_cache: Optional[str] = None
    dynamics_path: Optional[str] = None
    resume: bool = False
    overwrite: bool = False


# The types of each tool config's top-level settings (its sections, such as trainer.* or collect.*, are
# dataclasses of the library, converted where the tool builds them).
TOOL_SETTINGS = {"train": TrainSettings, "tune": TrainSettings, "inspect_dataset": InspectSettings,
                 "evaluate": EvaluateSettings, "export": ExportSettings, "finetune": FinetuneSettings}


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
