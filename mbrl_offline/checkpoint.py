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

# 2: the generator's settings are saved beside the agent's ("generator_config"); 3: the generator's section
# is {"state": its state_dict(), "model": its model's fingerprint}, never the model's weights
CHECKPOINT_FORMAT = 3
_MOVED_TO_GENERATOR = ("rollout", "dynamics", "true_dynamics", "real_ratio")  # agent settings in format 1
REFUSED_HINT = ("If it is a checkpoint written by an older version of mbrl_offline (which pickled numpy random "
                "states), it cannot be resumed, evaluated, exported or fine-tuned: start a new run_dir; otherwise load only files "
                "from a source you trust.")


def read_checkpoint(path: str | Path, sections=None) -> dict:
    """A checkpoint written by `Trainer`, with a clear error if it is missing, unreadable, holds more
    than tensors and plain data (it is then not unpickled) or lacks one of ``sections`` (`SECTIONS`;
    default `RESUME_SECTIONS`, all that resuming needs)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"read_checkpoint needs the path of a checkpoint.pt (str or pathlib.Path), "
                             f"got {type_name(path)}.")
    path = Path(path)
    sections = RESUME_SECTIONS if sections is None else sections
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; pass the checkpoint.pt of a run folder.")
    state = load_plain(path, "cpu", REFUSED_HINT)
    if not isinstance(state, dict) or state.get("format") not in (1, 2, CHECKPOINT_FORMAT):
        raise CheckpointError(f"{path} is not a mbrl_offline training checkpoint.")
    _check_sections(state, path, ("agent", "trainer_config") if state["format"] == 1 else ())
    state = _from_format_1(state) if state["format"] == 1 else state
    state = _from_format_2(state) if state["format"] == 2 else state
    _check_sections(state, path, sections)
    return state


# What a checkpoint holds (`Trainer.save_checkpoint`): section -> its type and the keys it needs.
SECTIONS = {"epoch": (int, ()), "algorithm": (str, ()), "env": (str, ()), "agent": (dict, ("config",)),
            "generator_config": ((dict, type(None)), ()), "generator": ((dict, type(None)), ()),
            "synthetic_buffer": ((dict, type(None)), ()), "trainer_config": (dict, ()),
            "dataset": (dict, ("source", "fingerprint")), "history": (list, ()),
            "rng": (dict, ("trainer", "torch", "cuda", "numpy", "python"))}
RESUME_SECTIONS = tuple(SECTIONS)  # resuming a run needs all of them
POLICY_SECTIONS = ("epoch", "algorithm", "env", "agent")  # loading its policy needs these


def _check_sections(state: dict, path, sections) -> None:
    """Refuse, in one `CheckpointError` line naming the file and the section, a checkpoint that lacks
    one of ``sections`` (`SECTIONS`) or holds it in the wrong form: a damaged or edited file."""
    fix = "it is damaged or was edited: use an intact checkpoint, or start a new run_dir"
    for name in sections:
        kind, keys = SECTIONS[name]
        if name not in state:
            raise CheckpointError(f"{path} has no '{name}' section; {fix}.")
        value = state[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(f"{path} has a '{name}' section of the wrong form ({type_name(value)}); {fix}.")
        missing = [key for key in keys if key not in value]
        if missing:
            raise CheckpointError(f"{path} has a '{name}' section without '{missing[0]}'; {fix}.")
    if "generator" in sections and state.get("generator_config") is not None and not isinstance(
            state.get("generator"), dict):
        raise CheckpointError(f"{path} holds the generator's settings but not its state ('generator'); {fix}.")


def saved_settings(config_class, saved, path, section: str):
    """The settings dataclass ``config_class`` from a checkpoint's ``saved`` dict; settings this version
    does not know (the file was written by a newer version, or another one) are one `CheckpointError`
    line that names the checkpoint, the setting and the fix."""
    from mbrl_offline.config import config_to_dataclass
    from mbrl_offline.errors import ConfigError

    try:
        return config_to_dataclass(config_class, saved, section)
    except ConfigError as exc:
        raise CheckpointError(f"{path} was written by another version of mbrl_offline: its settings do not fit this "
                              f"version's ({str(exc).split('. ')[0].rstrip('.')}). Use the version that wrote it, or "
                              f"start a new run.") from None


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
    state["format"] = 2
    return state


def model_fingerprint(state: dict) -> str:
    """A hash of a model's ``state_dict()`` (tensors by their values, anything else by its ``repr``), the
    same on every device: what a checkpoint keeps of a generator's model (`mbrl_offline.roles.GeneratorClass`)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for key, value in state.items():
        digest.update(str(key).encode())
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, dict):
            digest.update(model_fingerprint(value).encode())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()[:20]


def _from_format_2(state: dict) -> dict:
    """A format-2 checkpoint in format 3: the generator's section held its model's weights (rollouts and
    the posterior: ``dynamics``; SynthER: ``diffusion``) or, for PGD, its generation count and the
    fingerprint of the same hash; it becomes the state without the weights and their fingerprint."""
    old = state.get("generator")
    if isinstance(old, dict) and "model" not in old:
        if "model_fingerprint" in old:
            state["generator"] = {"state": {k: v for k, v in old.items() if k != "model_fingerprint"},
                                  "model": old["model_fingerprint"]}
        else:
            weights = next((old[k] for k in ("dynamics", "diffusion") if isinstance(old.get(k), dict)), None)
            state["generator"] = {"state": {}, "model": model_fingerprint(weights) if weights is not None else None}
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
