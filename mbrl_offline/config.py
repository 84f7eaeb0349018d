"""Configuration as plain data: the library's dataclass configs to and from dicts, and the one
"did you mean" helper every unknown name goes through.

This module is part of the library, not of the command line: `mbrl_offline.cli` (the Hydra edge)
and the library's own loaders (`mbrl_offline.algorithms.load_policy`) both build their configs here.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, Iterable, TypeVar

from mbrl_offline.errors import ConfigError

T = TypeVar("T")


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """`` Did you mean 'PREFIXclosest'?`` for the closest of ``choices`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""


def config_to_dict(config: Any) -> dict:
    """A dataclass config as a plain dict (nested configs as nested dicts, tuples as lists), which
    `config_to_dataclass` turns back into the same config."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise ConfigError(f"config_to_dict needs a dataclass config instance, got {type(config).__name__}.")
    return plain(dataclasses.asdict(config))


def plain(value):
    """Dicts, lists and tuples as nested dicts and lists (tuples become lists), for YAML and JSON."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def config_to_dataclass(cls: type[T], values: Any, prefix: str) -> T:
    """Build dataclass ``cls`` from a mapping; nested dataclass fields take nested mappings."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(values, (dict, DictConfig)):  # also converts OmegaConf nodes nested in a plain dict
        values = OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix} must be a mapping of settings, got {values!r}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            hint = did_you_mean(key, fields, prefix=f"{prefix}.")
            raise ConfigError(f"unknown setting '{prefix}.{key}'.{hint} Valid: {', '.join(fields)}.")
        kwargs[key] = _coerce(hints[key], value, f"{prefix}.{key}")
    return cls(**kwargs)


def _coerce(hint, value, name: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return config_to_dataclass(hint, value, name)
    if origin is typing.Union:  # Optional[X] and X | None
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, name)
            except ConfigError:
                pass
        raise ConfigError(f"{name} = {value!r} has the wrong type; expected {_type_name(hint)}.")
    if hint is typing.Any:
        return value
    if hint is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} = {value!r} must be a list, e.g. {name}=[a,b].")
        return tuple(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"{name} = {value!r} has the wrong type; expected {_type_name(hint)}.")


def _type_name(hint) -> str:
    if typing.get_origin(hint) is typing.Union:
        return " or ".join("null" if arg is type(None) else _type_name(arg) for arg in typing.get_args(hint))
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def require_positive(config, *names: str, section: str = "algo") -> None:
    """`ConfigError` naming the first of the integer settings ``names`` of ``config`` that is below 1."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ConfigError(f"{section}.{name} must be at least 1, got {value}.")
