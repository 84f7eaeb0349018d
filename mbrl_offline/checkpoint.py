"""Training checkpoints on disk: the format number `Trainer` writes and the one reader every tool uses
(`Trainer` to resume, `mbrl_offline.algorithms.load_policy` to load a policy), kept below both.

A checkpoint holds tensors and plain data only and is read with ``weights_only=True``
(`mbrl_offline.torch_files`): loading one never runs code. Checkpoints written before that (numpy's
random state was a pickled numpy array) are refused with a message that says so.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np

from mbrl_offline.errors import CheckpointError, InputTypeError, type_name
from mbrl_offline.torch_files import load_plain

CHECKPOINT_FORMAT = 2  # 2: the generator's settings are saved beside the agent's ("generator_config")
_MOVED_TO_GENERATOR = ("rollout", "dynamics", "true_dynamics", "real_ratio")  # agent settings in format 1
REFUSED_HINT = ("If it is a checkpoint written by an older version of mbrl_offline (which pickled numpy random "
                "states), it cannot be resumed or evaluated: start a new run_dir; otherwise load only files "
                "from a source you trust.")


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by `Trainer`, with a clear error if it is missing, unreadable, or holds more
    than tensors and plain data (it is then not unpickled)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"read_checkpoint needs the path of a checkpoint.pt (str or pathlib.Path), "
                             f"got {type_name(path)}.")
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; pass the checkpoint.pt of a run folder.")
    state = load_plain(path, "cpu", REFUSED_HINT)
    if not isinstance(state, dict) or state.get("format") not in (1, CHECKPOINT_FORMAT):
        raise CheckpointError(f"{path} is not a mbrl_offline training checkpoint.")
    return _from_format_1(state) if state["format"] == 1 else state


def _from_format_1(state: dict) -> dict:
    """A format-1 checkpoint (model-based agents held their generator's settings) in format 2: the
    rollout, dynamics and real-ratio settings move to ``generator_config``, with the one generation per
    epoch that format-1 runs had."""
    config = state["agent"]["config"]
    moved = {key: config.pop(key) for key in _MOVED_TO_GENERATOR if key in config}
    state["generator_config"] = None
    if "rollout" in moved:
        state["generator_config"] = {
            "kind": "rollouts", "every": state["trainer_config"]["updates_per_epoch"], "rollout": moved["rollout"],
            "dynamics": moved["dynamics"], "true_dynamics": moved.get("true_dynamics", False),
            "mixing": {"rule": "fraction", "real_ratio": moved.get("real_ratio", 0.05), "real_rows": 16}}
    state["format"] = CHECKPOINT_FORMAT
    return state


def numpy_rng_state() -> dict:
    """numpy's global random state (``np.random.get_state``) as plain data, for a checkpoint."""
    state = np.random.get_state(legacy=False)
    return {"bit_generator": state["bit_generator"], "key": state["state"]["key"].tolist(),
            "pos": int(state["state"]["pos"]), "has_gauss": int(state["has_gauss"]), "gauss": float(state["gauss"])}


def set_numpy_rng_state(state: dict) -> None:
    """Restore numpy's global random state from `numpy_rng_state`'s form."""
    np.random.set_state({"bit_generator": state["bit_generator"],
                         "state": {"key": np.asarray(state["key"], dtype=np.uint32), "pos": state["pos"]},
                         "has_gauss": state["has_gauss"], "gauss": state["gauss"]})


def python_rng_state() -> dict:
    """Python's global random state (``random.getstate``) as plain data, for a checkpoint."""
    version, internal, gauss_next = random.getstate()
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def set_python_rng_state(state: dict) -> None:
    """Restore Python's global random state from `python_rng_state`'s form."""
    random.setstate((state["version"], tuple(state["internal"]), state["gauss_next"]))
