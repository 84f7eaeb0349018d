"""Helpers for the command-line entry points in ``examples/`` (Hydra stays at that edge).

`config_to_dataclass` turns a Hydra/OmegaConf node into the library's dataclass configs, rejecting
unknown keys and values of the wrong type with one clear message; `cli_main` makes every library
error a single ``error: ...`` line on stderr and exit status 2.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
import typing
from typing import Any, Callable, TypeVar

from mbrl_offline.errors import ConfigError, MbrlOfflineError

T = TypeVar("T")


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
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean '{prefix}.{close[0]}'?" if close else ""
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


F = TypeVar("F", bound=Callable[..., Any])


def cli_main(fn: F) -> F:
    """Print library errors as one line and exit with status 2 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MbrlOfflineError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]
