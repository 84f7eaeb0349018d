"""Run logs: a ``metrics.jsonl`` file (one record per epoch) in the run folder, and the same scalars to the
run's experiment trackers (`mbrl_offline.trackers`: TensorBoard by default, W&B with ``logger=wandb``).

The JSON lines are what reports and tests read; the trackers are for watching a run. On resume the
JSON lines drop whatever was written after the checkpoint being resumed, and so does TensorBoard, so a
resumed run's logs read as if it had never stopped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from mbrl_offline.errors import MbrlOfflineError, read_library_text
from mbrl_offline.utils import atomic_write_bytes

# What every run writes in its run_dir (the trainer's run.json and checkpoint, this module's metrics.jsonl);
# the trackers' folders join them (`mbrl_offline.trainer.run_files`).
RUN_FILES = ("run.json", "metrics.jsonl", "checkpoint.pt")


class LogError(MbrlOfflineError, ValueError):
    """A run's log file (``metrics.jsonl``) that is damaged: truncated, not JSON, or with wrong types."""


class RunLogger:
    """Writes a run's logs: ``metrics.jsonl``, and each epoch's scalars to the run's trackers
    (`mbrl_offline.trackers`: TensorBoard, W&B, ...). ``metrics.jsonl`` is rewritten whole through
    `mbrl_offline.utils.atomic_write_bytes` at each record (a few kilobytes to a few megabytes), so a
    full disk fails in one line and leaves the log as it was, never a truncated last line."""

    def __init__(self, run_dir: str | Path, resume_epoch: Optional[int] = None, trackers: Sequence = ()):
        self.run_dir = Path(run_dir)
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.lines: list[str] = []
        if resume_epoch is not None and self.jsonl.exists():
            self.lines = [json.dumps(record) + "\n" for record in read_jsonl(self.jsonl)
                          if record["epoch"] <= resume_epoch]
        atomic_write_bytes(self.jsonl, "".join(self.lines))
        self.trackers = list(trackers)

    def log(self, epoch: int, step: int, metrics: dict[str, dict[str, float]]) -> None:
        """``metrics`` maps a group (``train``, ``rollout``, ``eval``, ``eval_cdsa``, ``speed``) to scalars."""
        scalars = {f"{group}/{name}": value for group, values in metrics.items() for name, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        for tracker in self.trackers:
            tracker.log_scalars(step, scalars)
        line = json.dumps({"epoch": epoch, "step": step, **metrics}) + "\n"
        atomic_write_bytes(self.jsonl, "".join(self.lines) + line)
        self.lines.append(line)

    def close(self, quiet: bool = False) -> None:
        """Close the trackers; ``quiet``: after another error, ignore a failed last write."""
        trackers, self.trackers = self.trackers, []
        failure = None
        for tracker in trackers:
            try:
                tracker.close(quiet=quiet)
            except MbrlOfflineError as exc:
                failure = failure or exc
        if failure is not None and not quiet:
            raise failure


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
    for group, values in record.items():  # every group (train, rollout, eval, eval_cdsa, speed, ...) is an object
        if group not in ("epoch", "step") and not isinstance(values, dict):
            return f"has '{group}' = {values!r}, not an object of metrics"
    if "eval" in record:
        score = record["eval"].get("normalized_score")
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            return f"has no number 'eval.normalized_score' (got {score!r})"
    return None
