"""Read back what W&B wrote offline: the records of a ``run-<id>.wandb`` file, for the tracker's tests.

The file is W&B's header (``:W&B``, a 2-byte magic, a version byte) and then records in LevelDB's log
format: 32 KiB blocks, each record a 7-byte header (CRC-32C, little-endian length, type: 1 full, 2 first,
3 middle, 4 last) and its bytes; a block's tail shorter than a header is zero padding. Each record is a
``wandb_internal_pb2.Record`` protobuf message. (W&B's own reader left its Python package in 0.2x.)"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
HEADER = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, position = [], b"", HEADER
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        if kind == 0 and length == 0:  # the rest of the block is padding
            position += left
            continue
        if position + HEADER + length > len(data):  # a record still being written
            break
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def finished_records(path: Path, wait: float = 60.0) -> list:
    """The records of a finished run's file, ending with its ``exit`` record. W&B's service process writes
    the file, and ``run.finish()`` can return before it has written the last records (the last step's
    history and the exit record; seen once in the test suite as a missing last step): so this reads the
    file again, for up to ``wait`` seconds, until the exit record is there."""
    deadline = time.monotonic() + wait
    while True:
        found = records(path)
        if (found and found[-1].WhichOneof("record_type") == "exit") or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def run_contents(run_dir: Path) -> dict:
    """Every offline W&B run under ``run_dir/wandb``, oldest first, each as ``{"id", "config", "history",
    "files"}``: ``history`` maps a step to its logged values (JSON-decoded), ``config`` is the run's config
    (W&B's ``value`` wrappers removed), ``files`` the media files saved. Each run's file is read once W&B
    has written its exit record (`finished_records`)."""
    runs = []
    for folder in sorted((Path(run_dir) / "wandb").glob("offline-run-*")):
        (wandb_file,) = folder.glob("run-*.wandb")
        run = {"id": None, "config": {}, "history": {}, "files": sorted(p.name for p in folder.rglob("media/**/*")
                                                                        if p.is_file())}
        for record in finished_records(wandb_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
                for item in record.run.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "config":
                for item in record.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "history":
                values = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                          for item in record.history.item}
                run["history"].setdefault(values.get("_step"), {}).update(values)
        run["config"] = {k: v.get("value", v) if isinstance(v, dict) else v for k, v in run["config"].items()
                         if not k.startswith("_")}
        runs.append(run)
    return runs
