"""Files the library writes with ``torch.save`` (training checkpoints, cached models, the collector's
state) hold tensors and plain data only, and are read with ``torch.load(..., weights_only=True)``.

Plain data is what ``weights_only`` loading rebuilds without running any code: tensors, dicts
(``dict``, ``OrderedDict``), lists, tuples, ``str``, ``int``, ``float``, ``bool``, ``None``, and torch's
dtypes, devices and sizes. A general pickle can call any function while it is loaded, so a file
someone shares could run code; a file that needs more than plain data is refused (`load_plain`) with
one line that names it and says what to do, and is never unpickled.

`save_plain` writes atomically after `plain`, which turns numpy scalars into Python numbers and
refuses anything else that is not plain data: a saver that would write an unloadable file fails at
once, naming the entry, instead of the reader failing later.
"""
from __future__ import annotations

import copy
import os
import pickle
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mbrl_offline.errors import CheckpointError, InputTypeError, type_name
from mbrl_offline.utils import atomic_torch_save

_LEAVES = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.Size)
# torch's refusals that name a class or function the file would need (a GLOBAL of the pickle)
_GLOBAL = re.compile(r"GLOBAL (\S+)")


def plain(obj: Any, where: str = "state") -> Any:
    """``obj`` as plain data: numpy scalars become Python numbers, containers are copied only where
    an entry changed (a module's ``state_dict`` keeps its metadata). Raises ``TypeError`` naming the
    entry (``where`` and the keys down to it) for anything else, such as a numpy array or an object."""
    return _plain(obj, where, ())


def _plain(obj: Any, where: str, keys: tuple) -> Any:
    kind = type(obj)
    if kind in _LEAVES or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()
    if kind in (dict, OrderedDict):
        pairs = [(_plain(key, f"a key of {where}", keys), _plain(value, where, (*keys, key)))
                 for key, value in obj.items()]
        if all(new_key is key and new_value is value for (new_key, new_value), (key, value) in zip(pairs, obj.items())):
            return obj
        changed = copy.copy(obj)  # keeps the attributes of a state_dict (its ``_metadata``)
        changed.clear()
        changed.update(pairs)
        return changed
    if kind in (list, tuple):
        items = [_plain(value, where, (*keys, i)) for i, value in enumerate(obj)]
        return obj if all(a is b for a, b in zip(items, obj)) else kind(items)
    entry = where + "".join(f"[{key!r}]" for key in keys)
    raise TypeError(f"{entry} is a {kind.__module__}.{kind.__qualname__}, which a file loaded with "
                    f"weights_only=True cannot hold; store tensors and plain data (dicts, lists, numbers, str).")


def save_plain(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` of `plain` ``(obj)``, atomically (a whole file or the old one, never a partial one)."""
    atomic_torch_save(plain(obj, Path(path).name), path)


def load_plain(path: str | os.PathLike, map_location: Any = "cpu", refused_hint: str = "") -> Any:
    """``torch.load(path, weights_only=True)``, with one-line `CheckpointError`s: for a file that needs
    more than tensors and plain data (it is not unpickled; ``refused_hint`` says what to do, e.g. for
    files written by older versions) and for an unreadable one."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"a file path (str or pathlib.Path) is needed, got {type_name(path)}.")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        needed = _GLOBAL.search(str(exc))
        if needed:
            name = needed.group(1)
            raise CheckpointError(
                f"{path} holds more than tensors and plain data ({name}), so it is not loaded: unpickling it "
                f"could run code.{' ' + refused_hint if refused_hint else ''}") from None
        raise CheckpointError(f"{path} is not a readable checkpoint (not a file of tensors and plain data "
                              f"written by torch.save).") from None
    except Exception as exc:  # torch raises several types for truncated or foreign files
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(exc).__name__}: {first_line}).") from None
