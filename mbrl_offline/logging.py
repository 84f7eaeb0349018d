"""Run logs: TensorBoard scalars and a ``metrics.jsonl`` file (one record per epoch) in the run folder.

The JSON lines are what reports and tests read; TensorBoard is for watching a run. On resume both
drop whatever was written after the checkpoint being resumed, so a resumed run's logs read as if it
had never stopped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from mbrl_offline.errors import MbrlOfflineError, read_library_text


class LogError(MbrlOfflineError, ValueError):
    """A run's log file (``metrics.jsonl``) that is damaged: truncated, not JSON, or with wrong types."""


class RunLogger:
    def __init__(self, run_dir: str | Path, resume_epoch: Optional[int] = None, resume_step: Optional[int] = None,
                 tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        if resume_epoch is None:
            self.jsonl.write_text("")
        elif self.jsonl.exists():
            kept = [json.dumps(record) for record in read_jsonl(self.jsonl) if record["epoch"] <= resume_epoch]
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
    """The epoch records of a run, oldest first (`read_jsonl`)."""
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


DAMAGED = "the run's log is damaged: delete that line (or the run folder) and run the command again"


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` file, checked: each line a JSON object with a whole-number
    ``epoch`` and ``step`` and, where present, ``eval``/``train``/``rollout``/``speed`` objects of
    numbers (``eval`` with its ``normalized_score``). A damaged file is refused in one line that names
    the file, the line and the problem (`LogError`); a missing one raises `FileNotFoundError`."""
    path = Path(path)
    text = read_library_text(path, LogError, DAMAGED,
                             folder="is a folder, not a log file; remove it or the run folder")
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise LogError(f"{path} line {number} is not valid JSON (truncated?); {DAMAGED}.") from None
        problem = _record_problem(record)
        if problem:
            raise LogError(f"{path} line {number} {problem}; {DAMAGED}.")
        records.append(record)
    return records


def _record_problem(record) -> Optional[str]:
    if not isinstance(record, dict):
        return f"holds a {type(record).__name__}, not an epoch record (a JSON object)"
    for key in ("epoch", "step"):
        if not isinstance(record.get(key), int) or isinstance(record.get(key), bool):
            return f"has no whole-number '{key}' (got {record.get(key)!r})"
    for group in ("train", "rollout", "eval", "speed"):
        if group in record and not isinstance(record[group], dict):
            return f"has '{group}' = {record[group]!r}, not an object of metrics"
    if "eval" in record:
        score = record["eval"].get("normalized_score")
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            return f"has no number 'eval.normalized_score' (got {score!r})"
    return None
