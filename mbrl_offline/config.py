"""Configuration as plain data: the library's dataclass configs to and from dicts, the one
"did you mean" helper every unknown name goes through, and the validation helpers every config
dataclass checks its settings with (`require_positive`, `require_nonnegative`, `require_above_zero`,
`require_fraction`, `require_in_range`), as do the tools for their devices (`check_device`) and output
folders (`check_writable_dir`): a bad value is one `ConfigError` line that names the setting.

This module is part of the library, not of the command line: `mbrl_offline.cli` (the Hydra edge)
and the library's own loaders (`mbrl_offline.algorithms.load_policy`) both build their configs here.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import typing
from pathlib import Path
from typing import Any, Iterable, TypeVar

from mbrl_offline.errors import ConfigError

T = TypeVar("T")

# The command-line tools' Hydra configs (train.yaml, algo/, generator/, env/, budget/, preset/, sweep/, ...),
# shipped inside the package as package data: every tool, test and message finds them here.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def config_path_shown(*parts: str) -> str:
    """A file or folder of `CONFIG_DIR` as messages and ``--help`` name it, from the package's folder on:
    ``config_path_shown("preset", "x.yaml")`` is ``mbrl_offline/configs/preset/x.yaml``, the same in a checkout
    and in an installed package."""
    return "/".join(["mbrl_offline", "configs", *parts])


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
    """Build dataclass ``cls`` from a mapping; nested dataclass fields take nested mappings. Every value
    goes through `parse_setting` (a boolean must be true or false, never 'no' or 1); every unknown key
    is refused, all of them in one line. ``prefix`` is the section the user writes (``algo``,
    ``trainer``; ``""`` for a tool's top-level settings)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(values, (dict, DictConfig)):  # also converts OmegaConf nodes nested in a plain dict
        values = OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'the settings'} must be a mapping of settings, got {values!r}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [key for key in values if key not in fields]
    if unknown:
        dotted = f"{prefix}." if prefix else ""
        raise ConfigError(unknown_settings_message(
            [(f"{dotted}{key}", did_you_mean(str(key), fields, prefix=dotted)) for key in unknown],
            f" Valid: {', '.join(fields)}."))
    hints = typing.get_type_hints(cls)
    kwargs = {key: parse_setting(hints[key], value, f"{prefix}.{key}" if prefix else key)
              for key, value in values.items()}
    return cls(**kwargs)


def unknown_settings_message(unknown: list[tuple[str, str]], valid: str = "") -> str:
    """The one line for settings that do not exist, each ``(name, hint)`` with its hint (`did_you_mean`,
    or where the setting lives now): ``unknown setting 'a'. Did you mean 'b'?`` for one, ``unknown
    settings 'a' (Did you mean 'b'?); 'c' (...)`` for several; ``valid`` (`` Valid: x, y.``) ends it."""
    if len(unknown) == 1:
        name, hint = unknown[0]
        return f"unknown setting '{name}'.{hint}{valid}"
    named = "; ".join(f"'{name}'" + (f" ({hint.strip()})" if hint.strip() else "") for name, hint in unknown)
    return f"{len(unknown)} unknown settings: {named}.{valid}"


def unknown_settings(cls: type, values: Any, prefix: str) -> list[str]:
    """The dotted names (``generator.rollout``) of the keys of mapping ``values`` that dataclass ``cls``
    (and its nested dataclass fields) does not have; ``[]`` where all are known."""
    if not isinstance(values, dict):
        return []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    found = []
    for key, value in values.items():
        if key not in fields:
            found.append(f"{prefix}.{key}" if prefix else str(key))
            continue
        hint = hints[key]
        nested = [a for a in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(a)]
        if nested and isinstance(value, dict):
            found += unknown_settings(nested[0], value, f"{prefix}.{key}" if prefix else key)
    return found


def parse_setting(hint, value, name: str):
    """``value`` as a setting of type ``hint`` (bool, int, float, str, tuples, dicts, lists, Optional of
    them, nested dataclasses), or one `ConfigError` line naming setting ``name``. The one strict parser
    every config value goes through, from the command line, a YAML file, a checkpoint or Python (each
    config dataclass's ``__post_init__``, `check_field_types`): a bool is only a real true or false
    (never 'no', 'yes', 'False' as text, 0 or 1); an int is a whole number (2.0 too, never a bool); a
    float any real number but a bool; a str only text; a tuple a list or tuple; a nested config an
    instance of it or a mapping of its settings (`config_to_dataclass`: unknown keys refused); None only
    where ``hint`` allows it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict) or type(value).__name__ == "DictConfig":
            return config_to_dataclass(hint, value, name)
        raise ConfigError(f"{name} = {value!r} has the wrong type; expected a {hint.__name__} or a mapping of "
                          f"its settings, e.g. {name}={{...}}.")
    if origin is typing.Union or type(hint).__name__ == "UnionType":  # Optional[X], X | None
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_setting(arg, value, name)
            except ConfigError:
                pass
        raise ConfigError(f"{name} = {value!r} has the wrong type; expected {_type_name(hint)}{_fix(hint, name)}.")
    if hint is typing.Any:
        return value
    if hint is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)) and type(value).__name__ != "ListConfig":
            raise ConfigError(f"{name} = {value!r} must be a list or tuple, e.g. {name}=[a,b].")
        return tuple(value)
    if hint is bool:
        if _is_bool(value):
            return bool(value)
    elif hint is int:
        if _is_whole(value):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if _is_number(value):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is dict or origin is dict:
        if isinstance(value, dict) or type(value).__name__ == "DictConfig":
            return value
    elif hint is list or origin is list:
        if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
            return value
    else:
        return value
    raise ConfigError(f"{name} = {value!r} has the wrong type; expected {_type_name(hint)}{_fix(hint, name)}.")


_coerce = parse_setting  # its former name


def _fix(hint, name: str) -> str:
    """How to write a setting of type ``hint`` on the command line, where the type name does not say it."""
    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    if bool in args:
        return f" (write {name}=true or {name}=false" + (f", or {name}=null)" if type(None) in args else ")")
    if str in args:
        return f" (text: write {name}='...' to give a number or a bool as text)"
    return ""


def check_field_types(config, section: str) -> None:
    """Check, in place, that every field of dataclass ``config`` holds a value of its declared type, the
    one check every config dataclass makes first in ``__post_init__`` (so a config built in Python is
    held to what `config_to_dataclass` enforces when it is read from a file or the command line).

    The rule for nested configs: a nested dataclass field given a mapping (a ``dict`` or OmegaConf node)
    is converted with `config_to_dataclass` (unknown keys refused); a tuple field takes a list or tuple
    (stored as a tuple); ``Optional`` fields take None. A value of another type (a scalar for a tuple, a
    string for a number, a number for a nested config) is a `ConfigError` naming ``section.field``, the
    value and the type expected (`parse_setting`, the same parser as for every other value: a whole
    number for an int). Range checks are the ``require_*`` helpers' (called after this)."""
    for name, hint in _field_hints(type(config)):
        value = getattr(config, name)
        checked = parse_setting(hint, value, _setting(section, name))
        if checked is not value:
            object.__setattr__(config, name, checked)  # frozen dataclasses too


_HINTS: dict = {}


def _field_hints(cls) -> list:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init]
    return _HINTS[cls]


def config_argument(value, cls: type[T], where: str, section: str = "algo", example: str = "") -> T:
    """The rule for a config handed to a library call as an argument (``build_run``'s ``algo_config``,
    ``generator_config`` and ``trainer_config``, every agent's ``for_dataset``, `Trainer`): a ``cls``
    instance is used as it is, None means ``cls()``, and anything else, a dict of settings included, is
    refused in one line (`InputTypeError` naming ``where``) that shows how to build one. Arguments are
    never converted, so a misspelt name cannot slip by as a dict key; inside a config, a nested config
    field does take a mapping (`check_field_types`)."""
    from mbrl_offline.errors import InputTypeError, type_name

    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    example = example or f"{cls.__name__}()"
    hint = (f"; build one with {example}, or from a dict of settings with "
            f"mbrl_offline.config.config_to_dataclass({cls.__name__}, settings, '{section}')"
            if isinstance(value, dict) else f"; e.g. {example}")
    raise InputTypeError(f"{where} must be a {cls.__name__}, got {type_name(value)}{hint}.")


def _type_name(hint) -> str:
    if typing.get_origin(hint) is typing.Union:
        return " or ".join("null" if arg is type(None) else _type_name(arg) for arg in typing.get_args(hint))
    if hint is bool:
        return "true or false"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


# ---------------------------------------------------------------------------------- validation
# Every config dataclass checks its settings in ``__post_init__`` with these helpers, so that a value
# out of range is refused in one line where the config is built (from the command line, a checkpoint
# or Python), never deep inside torch or numpy. ``section`` is the prefix the user writes (``algo``,
# ``trainer``, ``generator.rollout`` ...); None values of optional settings are skipped.


def _setting(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def _declared_int(config, name: str) -> bool:
    """Whether dataclass ``config`` declares field ``name`` as ``int`` (or ``Optional[int]``)."""
    if not dataclasses.is_dataclass(config):
        return False
    field = next((f for f in dataclasses.fields(config) if f.name == name), None)
    if field is None:
        return False
    hint = field.type  # a string under ``from __future__ import annotations``
    if isinstance(hint, str):
        return hint.replace(" ", "") in ("int", "Optional[int]", "int|None", "None|int")
    return hint is int or (typing.get_origin(hint) is typing.Union and int in typing.get_args(hint))


def _is_number(value) -> bool:
    """A real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not _is_bool(value)


def _is_whole(value) -> bool:
    """A whole number (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's, without importing numpy here


def require_positive(config, *names: str, section: str = "algo") -> None:
    """`ConfigError` naming the first of the integer settings ``names`` of ``config`` that is below 1."""
    for name in names:
        value = getattr(config, name)
        if value is None:
            continue
        if not _is_whole(value):
            raise ConfigError(f"{_setting(section, name)} = {value!r} must be a whole number of at least 1.")
        if value < 1:
            raise ConfigError(f"{_setting(section, name)} must be at least 1, got {value}.")


def require_nonnegative(config, *names: str, section: str = "algo", hint: str = "") -> None:
    """`ConfigError` naming the first of the settings ``names`` (integers or floats) that is negative or
    not a finite number; ``hint`` (e.g. ``" (0: torch's default)"``) follows the range in the message."""
    for name in names:
        require_in_range(config, name, low=0.0, section=section, hint=hint)


def require_above_zero(config, *names: str, section: str = "algo", hint: str = "") -> None:
    """`ConfigError` naming the first of the float settings ``names`` (learning rates, scales) that is
    not a finite number above 0."""
    for name in names:
        require_in_range(config, name, low=0.0, low_open=True, section=section, hint=hint)


def require_fraction(config, *names: str, section: str = "algo", hint: str = "") -> None:
    """`ConfigError` naming the first of the settings ``names`` (probabilities, ratios) outside [0, 1]."""
    for name in names:
        require_in_range(config, name, low=0.0, high=1.0, section=section, hint=hint)


def require_in_range(config, name: str, low: float | None = None, high: float | None = None, *,
                     low_open: bool = False, high_open: bool = False, finite: bool = True,
                     section: str = "algo", hint: str = "") -> None:
    """`ConfigError` unless setting ``name`` of ``config`` is a number in the range from ``low`` to
    ``high`` (either end open or absent), finite unless ``finite=False`` (NaN never passes), and a whole
    number where the dataclass declares the field ``int``. The message names the setting, its value and
    the range, e.g. ``algo.gamma must be in (0, 1], got 99.0.``"""
    value = getattr(config, name)
    if value is None:
        return
    setting = _setting(section, name)
    if _declared_int(config, name) and not _is_whole(value):
        raise ConfigError(f"{setting} = {value!r} must be a whole number{_range_text(low, high, low_open, high_open)}.")
    if not _is_number(value):
        raise ConfigError(f"{setting} = {value!r} must be a number{_range_text(low, high, low_open, high_open)}.")
    ok = value == value and (not finite or math.isfinite(value))  # NaN != NaN
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        expected = _range_text(low, high, low_open, high_open).strip() or "a finite number"
        raise ConfigError(f"{setting} must be {expected}{hint}, got {value}.")


def _range_text(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"
    if low is not None:
        return f" {'above' if low_open else 'at least'} {_num(low)}"
    if high is not None:
        return f" {'below' if high_open else 'at most'} {_num(high)}"
    return ""


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def check_device(device, setting: str = "device"):
    """The `torch.device` that ``device`` names, refused in one line (`ConfigError`) when it is not a
    device torch knows (``device=nonsense``) or not on this machine (``device=cuda`` without a CUDA
    GPU, ``cuda:3`` with two GPUs, ``mps`` off Apple silicon). Every tool that takes a device calls it
    before any work."""
    import torch

    text = str(device)
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{setting}={text} is not a device; write cpu, cuda, cuda:<index> or mps.") from None
    if parsed.type == "cpu":
        return parsed
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{setting}={text}, but torch finds no CUDA GPU on this machine (torch "
                              f"{torch.__version__}, CUDA {torch.version.cuda or 'not built in'}); use {setting}=cpu.")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(f"{setting}={text}, but this machine has {count} CUDA GPU(s) (cuda:0 to "
                              f"cuda:{count - 1}); choose one of them.")
        return parsed
    if parsed.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError(f"{setting}={text}, but torch finds no Apple GPU (MPS) on this machine; use {setting}=cpu.")
        return parsed
    raise ConfigError(f"{setting}={text}: the library runs on cpu, cuda and mps devices only; use one of them.")


def check_writable_dir(path, setting: str, permissions: bool = True) -> None:
    """Refuse, in one line (`ConfigError` naming ``setting``), a folder that could not be created or
    written: one below a regular file, one that is itself a file, or one whose nearest existing folder
    cannot be written (read-only, or another user's, or one that takes no folders such as /proc: a
    folder is made there and removed at once to see). Nothing is left behind: tools call this before they
    load data or train, so that a run never fails at its first write after minutes of work. With
    ``permissions=False`` only the structural problems are refused (for a cache that may be read-only
    and still serve a model it already holds)."""
    import os
    from pathlib import Path

    if path is None or not str(path).strip():
        raise ConfigError(f"{setting} is empty; name a folder, e.g. {setting}=runs/my-run.")
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.is_symlink():  # a dangling link: nothing can be made through it
            raise ConfigError(f"{setting}={path}: {probe} is a broken symbolic link; remove it or choose another folder.")
        parent = probe.parent
        if parent == probe:
            break
        probe = parent
    if probe.exists() and not probe.is_dir():
        where = "is a file" if probe == path else f"is inside {probe}, which is a file, not a folder"
        raise ConfigError(f"{setting}={path} {where}; choose another folder.")
    if permissions and not os.access(probe, os.W_OK | os.X_OK):
        where = "it" if probe == path else f"{probe}, the nearest folder of it that exists"
        raise ConfigError(f"{setting}={path}: cannot write to {where} (permission denied or a read-only file "
                          f"system); choose a folder you can write to.")
    if permissions and probe.is_dir():
        # Permission bits do not show every folder that takes no files (/proc, /sys, some mounts; root
        # passes os.access): make a folder there and remove it at once, as the run would make its own.
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".mbrl_offline-probe-", dir=probe))
        except OSError as exc:
            where = "it" if probe == path else f"{probe}, the nearest folder of it that exists"
            raise ConfigError(f"{setting}={path}: cannot make folders in {where} ({exc.strerror or exc}; a "
                              f"system folder such as /proc, or a read-only file system); choose a folder you "
                              f"can write to.") from None
