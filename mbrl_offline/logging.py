"""Run logs: TensorBoard scalars and a ``metrics.jsonl`` file (one record per epoch) in the run folder.

The JSON lines are what reports and tests read; TensorBoard is for watching a run. On resume both
drop whatever was written after the checkpoint being resumed, so a resumed run's logs read as if it
had never stopped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


class RunLogger:
    def __init__(self, run_dir: str | Path, resume_epoch: Optional[int] = None, resume_step: Optional[int] = None,
                 tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        if resume_epoch is None:
            self.jsonl.write_text("")
        elif self.jsonl.exists():
            kept = [line for line in self.jsonl.read_text().splitlines()
                    if line.strip() and json.loads(line)["epoch"] <= resume_epoch]
            self.jsonl.write_text("".join(line + "\n" for line in kept))
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resume_step)

    def log(self, epoch: int, step: int, metrics: dict[str, dict[str, float]]) -> None:
        """``metrics`` maps a group (``train``, ``rollout``, ``eval``, ``speed``) to scalars."""
        if self.writer is not None:
            for group, values in metrics.items():
                for name, value in values.items():
                    if isinstance(value, (int, float)):
                        self.writer.add_scalar(f"{group}/{name}", value, step)
            self.writer.flush()
        with open(self.jsonl, "a") as f:
            f.write(json.dumps({"epoch": epoch, "step": step, **metrics}) + "\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The epoch records of a run, oldest first."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
