"""Training checkpoints on disk: the format number `Trainer` writes and the one reader every tool uses
(`Trainer` to resume, `mbrl_offline.algorithms.load_policy` to load a policy), kept below both."""
from __future__ import annotations

from pathlib import Path

import torch

from mbrl_offline.errors import CheckpointError

CHECKPOINT_FORMAT = 1


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by `Trainer`, with a clear error if it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; pass the checkpoint.pt of a run folder.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(exc).__name__}: {exc}).") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a mbrl_offline training checkpoint.")
    return state
