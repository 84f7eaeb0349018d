"""What the side-by-side benchmarks (``vs_pgd.py``, ``vs_synther.py``, ``vs_neubay.py``) share: each
measurement runs as a child process of the script itself (``--side official|ours --measure M``),
which prints one ``RESULT <json>`` line; the driver runs the two sides one after the other and
compares what each reports it did. The standard library only: an official side's environment may
have no torch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Iterable, Mapping, Optional


def pin_threads(threads: int) -> None:
    """Run this process on its first ``threads`` allowed cores (XLA sizes its pool by the affinity)."""
    allowed = sorted(os.sched_getaffinity(0))
    if threads < len(allowed):
        os.sched_setaffinity(0, allowed[:threads])


def work_differences(official: Mapping, ours: Mapping, keys: Iterable[str]) -> list[str]:
    """The quantities of ``keys`` in which the two sides' reports differ, as lines."""
    return [f"{key}: official {official.get(key)}, ours {ours.get(key)}" for key in keys
            if official.get(key) != ours.get(key)]


def child_or_driver(args, official_child: Callable, our_child: Callable) -> bool:
    """A script's start after its own checks: in a child process (``args.side`` set) pin the threads, run
    that side's measurement and return True; in the driver, check that ``args.python`` (the official
    side's Python) is a file, exiting with one line if not, and return False."""
    if args.side:
        pin_threads(args.threads)
        official_child(args) if args.side == "official" else our_child(args)
        return True
    if not args.python.is_file():
        sys.exit(f"error: --python {args.python} is not a file; give the Python of the environment with the "
                 "official code's packages (see the docstring).")
    return False


def run_child(script: str, python: str, side: str, measure: str, argv: list[str], cpu_only: bool = True,
              env: Optional[Mapping[str, str]] = None) -> dict:
    """Run ``python script *argv --side side --measure measure`` and return its last ``RESULT`` line's
    JSON; exit with the child's error output if it failed. ``cpu_only`` hides every GPU from the child
    (a CPU comparison: neither side may pick one by itself); ``env`` adds variables."""
    command = [python, script, *argv, "--side", side, "--measure", measure]
    child_env = dict(os.environ, **(env or {}))
    if cpu_only:
        child_env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(command, capture_output=True, text=True, env=child_env)
    results = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        sys.exit(f"error: the {side} {measure} measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(results[-1])


def _number(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def compare(script: str, official_python: str, measures, pairs: int, argv: list[str], same_work: Mapping,
            units: Mapping, official_env: Optional[Mapping[str, str]] = None, cpu_only: bool = True,
            summary_extra: Optional[Callable[[dict], str]] = None) -> None:
    """Run each measure's ``pairs`` pairs (the official side, then ours), print a markdown row per pair
    with both rates, their ratio and each side's matmul peak, stop if the two sides did different work
    (``same_work[measure]``: the keys of the children's ``work`` reports), then the official side's
    versions, what both sides agreed on, and per measure the range of the ratios (``summary_extra``
    adds to that line from our last report)."""
    print("| measure | pair | official | ours | ours / official | peak GFLOP/s (official / ours) |")
    print("|---|---:|---:|---:|---:|---:|")
    summary, checked, versions = [], [], {}
    for measure in measures:
        ratios = []
        for pair in range(1, pairs + 1):
            official = run_child(script, official_python, "official", measure, argv, cpu_only, official_env)
            ours = run_child(script, sys.executable, "ours", measure, argv, cpu_only)
            differences = work_differences(official.get("work", {}), ours.get("work", {}), same_work[measure])
            if differences:
                sys.exit(f"error: the two sides did different {measure} work: " + "; ".join(differences))
            versions = official.get("versions", {})
            ratios.append(ours["rate"] / official["rate"])
            print(f"| {measure} ({units[measure]}) | {pair} | {official['rate']:,.1f} | {ours['rate']:,.1f} | "
                  f"{ratios[-1]:.2f}x | {official['peak']:.0f} / {ours['peak']:.0f} |", flush=True)
        if same_work[measure]:
            checked.append(f"{measure}: " + ", ".join(f"{k} {_number(ours['work'][k])}" for k in same_work[measure]))
        extra = f"; {summary_extra(ours)}" if summary_extra else ""
        summary.append(f"{measure}: ours / official = {min(ratios):.2f}-{max(ratios):.2f}x ({units[measure]}){extra}")
    print()
    if versions:
        print("official side: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    if checked:
        print("the same on both sides (each read off its own objects): " + "; ".join(checked))
    print("\n".join(summary))
