"""The registries of agents, generators and experiment trackers, the one list of the library's families.

Every list of names in the library comes from here: the command line's config groups (``algo=<name>``,
``generator=<kind>``) and its help, the docs' tables (``python -m mbrl_offline.doc_tables``), the tests'
parametrisation, and ``build_run``'s lookups.

A family registers itself where it is defined, with a decorator on its class::

    @register_agent
    class MyAgent(FeedForwardAgent): ...          # meets mbrl_offline.roles.AgentClass

    @register_generator
    class MyGenerator: ...                        # meets mbrl_offline.roles.GeneratorClass

    @register_tracker
    class MyTracker(Tracker): ...                 # meets mbrl_offline.trackers.Tracker

The library's own families are the modules of `mbrl_offline.algorithms`, `mbrl_offline.generators` and
`mbrl_offline.trackers`,
each imported when its package is (`import_modules`): a new one is a new module there, and nothing
else lists it. Code outside the package registers the same way, by importing its module before use,
or, for the command line, through the entry-point group ``mbrl_offline.plugins`` of an installed
distribution (each entry names a module, imported once by `load_plugins`; ``docs/contributing.md``)::

    [options.entry_points]            # setup.cfg of the user's package
    mbrl_offline.plugins =
        my_agent = my_package.my_agent

Registration checks the class against the contract (`check_agent_class`, `check_generator_class`,
`check_tracker_class`)
and refuses a name already taken by another class, in one line each.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Optional

from mbrl_offline.errors import ConfigError
from mbrl_offline.roles import SEQUENCE_KINDS, GeneratorConfig

# name -> (agent class, config class): ``algo=<name>``
AGENTS: dict[str, tuple[type, type]] = {}
# kind -> (config class, generator class, or None for ``generator=none``): ``generator=<kind>``
GENERATORS: dict[str, tuple[type, Optional[type]]] = {}
# name -> tracker class: ``logger=<name>`` (mbrl_offline.trackers)
TRACKERS: dict[str, type] = {}

PLUGIN_GROUP = "mbrl_offline.plugins"
_plugins_loaded = False


def _where(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_agent_class(cls) -> None:
    """Refuse, in one line, an agent class that does not meet `mbrl_offline.roles.AgentClass`."""
    where = f"agent class {_where(cls)}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or "=" in name or " " in name:
        raise ConfigError(f"{where} needs a class attribute name: the registry's name (algo=<name>), one word.")
    config_cls = getattr(cls, "config_class", None)
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        raise ConfigError(f"{where} needs a class attribute config_class: the dataclass of its settings.")
    if "batch_size" not in {f.name for f in dataclasses.fields(config_cls)}:
        raise ConfigError(f"{where}'s config_class {config_cls.__name__} needs a batch_size field "
                          f"(rows per batch, or the tape's length).")
    if getattr(cls, "consumes", None) not in SEQUENCE_KINDS:
        raise ConfigError(f"{where} needs a class attribute consumes: one of {', '.join(SEQUENCE_KINDS)}.")
    for text in ("summary", "defaults_from"):
        if not isinstance(getattr(cls, text, None), str) or not getattr(cls, text).strip():
            raise ConfigError(f"{where} needs a class attribute {text}: one line for the docs' tables "
                              f"(mbrl_offline.roles.AgentClass).")
    for flag in ("recurrent", "needs_dynamics"):
        if not isinstance(getattr(cls, flag, None), bool):
            raise ConfigError(f"{where} needs a class attribute {flag}: True or False (mbrl_offline.roles.AgentClass).")
    if not (getattr(cls, "divergence_metric", 0) is None or isinstance(getattr(cls, "divergence_metric", 0), str)):
        raise ConfigError(f"{where} needs a class attribute divergence_metric: the name of an update metric the "
                          f"trainer's divergence guard watches (e.g. 'q_mean'), or None.")
    for method in ("published_generator", "for_dataset", "update", "act", "episode_policy", "state_dict",
                   "load_state_dict"):
        if not callable(getattr(cls, method, None)):
            raise ConfigError(f"{where} needs a method {method} (mbrl_offline.roles.AgentClass and Agent).")
    for flag in ("provides_value", "deterministic_policy", "on_policy"):
        value = getattr(cls, flag, False)
        if not (isinstance(value, bool) or (flag == "deterministic_policy" and isinstance(value, property))):
            raise ConfigError(f"{where}'s {flag} must be True or False (mbrl_offline.roles.AgentClass).")
    penalty_off = getattr(cls, "penalty_off", {})
    fields = {f.name for f in dataclasses.fields(config_cls)}
    if not (isinstance(penalty_off, dict) and all(isinstance(k, str) and k in fields for k in penalty_off)):
        raise ConfigError(f"{where}'s penalty_off must be a dict of its config's settings and the values that turn "
                          f"its penalty off (e.g. {{'cql_weight': 0.0}}), got {penalty_off!r} "
                          f"(mbrl_offline.roles.AgentClass).")
    if getattr(cls, "provides_value", False):
        for method in ("mode", "q_value"):
            if not callable(getattr(cls, method, None)):
                raise ConfigError(f"{where} declares provides_value True and needs a method {method} "
                                  f"(mbrl_offline.roles.ValueFunction).")


def check_generator_class(cls) -> None:
    """Refuse, in one line, a generator class that does not meet `mbrl_offline.roles.GeneratorClass`."""
    where = f"generator class {_where(cls)}"
    config_cls = getattr(cls, "config_class", None)
    if not (isinstance(config_cls, type) and issubclass(config_cls, GeneratorConfig)
            and dataclasses.is_dataclass(config_cls)):
        raise ConfigError(f"{where} needs a class attribute config_class: a dataclass subclassing "
                          f"mbrl_offline.roles.GeneratorConfig.")
    kind = config_cls.default_kind()
    if not isinstance(kind, str) or not kind or "=" in kind or " " in kind:
        raise ConfigError(f"{where}'s config_class {config_cls.__name__} must redeclare kind with its registry "
                          f"name as the default (generator=<kind>), one word.")
    if getattr(cls, "produces", None) not in SEQUENCE_KINDS:
        raise ConfigError(f"{where} needs a class attribute produces: one of {', '.join(SEQUENCE_KINDS)}.")
    if not isinstance(getattr(cls, "summary", None), str) or not cls.summary.strip():
        raise ConfigError(f"{where} needs a class attribute summary: one line for the docs' tables "
                          f"(mbrl_offline.roles.GeneratorClass).")
    for flag in ("recurrent_policy", "provides_dynamics"):
        if not isinstance(getattr(cls, flag, None), bool):
            raise ConfigError(f"{where} needs a class attribute {flag}: True or False "
                              f"(mbrl_offline.roles.GeneratorClass).")
    for method in ("for_dataset", "generate", "state_dict", "load_state_dict"):
        if not callable(getattr(cls, method, None)):
            raise ConfigError(f"{where} needs a method {method} (mbrl_offline.roles.GeneratorClass and Generator).")
    if config_cls.check_refit is not GeneratorConfig.check_refit and not callable(getattr(cls, "refit", None)):
        raise ConfigError(f"{where}'s config_class {config_cls.__name__} defines check_refit, and the class has no "
                          f"refit method; add refit(dataset, progress) or remove check_refit "
                          f"(mbrl_offline.roles.GeneratorClass).")
    if not (hasattr(cls, "model") or any("model" in vars(k).get("__annotations__", {}) for k in cls.__mro__)):
        raise ConfigError(f"{where} needs a model (a property, a class attribute or an annotated instance "
                          f"attribute): its fitted model (with state_dict()), or None (mbrl_offline.roles.GeneratorClass).")


def register_agent(cls):
    """Register agent class ``cls`` under its ``name`` (usable as a class decorator; returns ``cls``).
    Registering the same class again does nothing; another class under a taken name is refused."""
    check_agent_class(cls)
    taken = AGENTS.get(cls.name)
    if taken is not None and _where(taken[0]) != _where(cls):
        raise ConfigError(f"algo name '{cls.name}' is taken by {_where(taken[0])}; give {_where(cls)} another name.")
    AGENTS[cls.name] = (cls, cls.config_class)
    return cls


def register_generator(cls):
    """Register generator class ``cls`` under its config's ``kind`` (usable as a class decorator;
    returns ``cls``). Registering the same class again does nothing; another class under a taken kind
    is refused."""
    check_generator_class(cls)
    kind = cls.config_class.default_kind()
    taken = GENERATORS.get(kind)
    if taken is not None and (taken[1] is None or _where(taken[1]) != _where(cls)):
        raise ConfigError(f"generator kind '{kind}' is taken by {_where(taken[1] or taken[0])}; give "
                          f"{cls.config_class.__name__} another kind.")
    GENERATORS[kind] = (cls.config_class, cls)
    return cls


def check_tracker_class(cls) -> None:
    """Refuse, in one line, a tracker class that does not meet `mbrl_offline.trackers.Tracker`."""
    where = f"tracker class {_where(cls)}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or "=" in name or " " in name or name == "none":
        raise ConfigError(f"{where} needs a class attribute name: the registry's name (logger=<name>), one word "
                          f"other than none.")
    config_cls = getattr(cls, "config_class", None)
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        raise ConfigError(f"{where} needs a class attribute config_class: the dataclass of its settings.")
    if {f.name: f.default for f in dataclasses.fields(config_cls)}.get("name") != name:
        raise ConfigError(f"{where}'s config_class {config_cls.__name__} needs a field name with default '{name}'.")
    for text in ("folder", "summary"):
        if not isinstance(getattr(cls, text, None), str) or not getattr(cls, text).strip():
            raise ConfigError(f"{where} needs a class attribute {text} (mbrl_offline.trackers.Tracker).")
    from mbrl_offline.logging import RUN_FILES

    if "/" in cls.folder or cls.folder in RUN_FILES:
        raise ConfigError(f"{where}'s folder '{cls.folder}' must be one name of its own in the run folder.")
    if not (cls.package is None or isinstance(cls.package, str)):
        raise ConfigError(f"{where}'s package must be the module it imports, or None.")
    for method in ("log_scalars", "log_figures", "close"):
        if not callable(getattr(cls, method, None)):
            raise ConfigError(f"{where} needs a method {method} (mbrl_offline.trackers.Tracker).")


def register_tracker(cls):
    """Register tracker class ``cls`` under its ``name`` (usable as a class decorator; returns ``cls``).
    Registering the same class again does nothing; another class under a taken name is refused."""
    check_tracker_class(cls)
    taken = TRACKERS.get(cls.name)
    if taken is not None and _where(taken) != _where(cls):
        raise ConfigError(f"logger name '{cls.name}' is taken by {_where(taken)}; give {_where(cls)} another name.")
    TRACKERS[cls.name] = cls
    return cls


def import_modules(package) -> list:
    """Import every module of ``package`` (a package object) whose name does not start with ``_``, so
    that the classes they define register themselves; returns the modules, by name."""
    modules = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            modules.append(importlib.import_module(f"{package.__name__}.{info.name}"))
    return modules


def load_plugins() -> None:
    """Import, once, every module named in the entry-point group ``mbrl_offline.plugins`` of the
    installed distributions (and of ``*.dist-info`` folders on ``sys.path``), so that the agents and
    generators they define register themselves. (The library's own register when
    `mbrl_offline.algorithms` and `mbrl_offline.generators` are imported; this module imports neither,
    as they import it.) A plugin that fails to import is refused in one line naming it."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            entry.load()
        except Exception as exc:  # a plugin's own error: name the plugin, keep the cause
            raise ConfigError(f"plugin '{entry.name}' ({entry.value}, entry point group {PLUGIN_GROUP}) failed to "
                              f"load: {type(exc).__name__}: {exc}; fix or uninstall it.") from exc


def agents() -> dict[str, tuple[type, type]]:
    """The registered agents, plugins included, by name: name -> (agent class, config class) (a copy;
    the library's own are there once `mbrl_offline.algorithms` is imported)."""
    load_plugins()
    return dict(sorted(AGENTS.items()))


def generators() -> dict[str, tuple[type, Optional[type]]]:
    """The registered generators, plugins included, ``none`` first and then by kind: kind -> (config class,
    generator class or None) (a copy; the library's own are there once `mbrl_offline.generators` is
    imported)."""
    load_plugins()
    return dict(sorted(GENERATORS.items(), key=lambda item: (item[0] != "none", item[0])))


def trackers() -> dict[str, type]:
    """The registered trackers, plugins included, by name (a copy; the library's own are there once
    `mbrl_offline.trackers` is imported)."""
    load_plugins()
    return dict(sorted(TRACKERS.items()))
