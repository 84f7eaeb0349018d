"""Training checkpoints on disk: the format number `Trainer` writes and the one reader every tool uses
(`Trainer` to resume, `mbrl_offline.algorithms.load_policy` to load a policy), kept below both."""
from __future__ import annotations

from pathlib import Path

import torch

from mbrl_offline.errors import CheckpointError

CHECKPOINT_FORMAT = 2  # 2: the generator's settings are saved beside the agent's ("generator_config")
_MOVED_TO_GENERATOR = ("rollout", "dynamics", "true_dynamics", "real_ratio")  # agent settings in format 1


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by `Trainer`, with a clear error if it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; pass the checkpoint.pt of a run folder.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(exc).__name__}: {exc}).") from None
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
