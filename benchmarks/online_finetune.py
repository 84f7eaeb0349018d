"""The learning test of online fine-tuning (`tests/test_online.py`'s `online_fine_tuning_run`) for any
seeds, online and, as the control, the same updates on the offline data alone: the table of
docs/after-training.md.

    python benchmarks/online_finetune.py --seeds 0 1 2 [--arms online offline] [--threads 1] [--jobs 2]

Each (seed, arm) runs in its own process with ``--threads`` torch threads, ``--jobs`` at a time: EDAC
trained for 500 updates on pendulum-medium, then fine-tuned for 12 epochs of 500 updates, online (one
env step per update) or offline. Prints one markdown row per run: the base agent's score, the
fine-tuning's evaluations (every 1000 updates), their last three's mean (what the test takes), whether it
clears the test's bar (40 points above the base and 20 above the data) and the minutes, with the CPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from mbrl_offline.platform import cpu_name

TEST_FILE = Path(__file__).resolve().parents[1] / "tests" / "test_online.py"


def _run(seed: int, arm: str, threads: int) -> tuple[int, str, float, float, list[float], float]:
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(TEST_FILE.parent))  # the tests are not a package: their conftest is a plain module
    spec = importlib.util.spec_from_file_location("online_case", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        data_score, before, scores = module.online_fine_tuning_run(root, seed, online=arm == "online")
    return seed, arm, data_score, before, scores, (time.perf_counter() - start) / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--arms", nargs="+", default=["online", "offline"], choices=["online", "offline"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    args = parser.parse_args()
    if any(s < 0 for s in args.seeds) or args.threads < 1 or args.jobs < 1:
        parser.error("seeds must be >= 0, --threads and --jobs at least 1")
    runs = [(seed, arm, args.threads) for seed in args.seeds for arm in args.arms]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_run, *zip(*runs)))
    print(f"{cpu_name()}, {args.threads} thread(s) per run, {args.jobs} run(s) at a time; "
          f"EDAC on pendulum-medium (score {results[0][2]:.1f})")
    print("| seed | fine-tuning | base score | evaluations (every 1000 updates) | last three | bar met | minutes |")
    print("|---|---|---|---|---|---|---|")
    for seed, arm, data_score, before, scores, minutes in results:
        final = sum(scores[-3:]) / 3
        passed = final >= max(before + 40, data_score + 20)
        evaluations = ", ".join(f"{s:.1f}" for s in scores)
        print(f"| {seed} | {arm} | {before:.1f} | {evaluations} | {final:.1f} | {'yes' if passed else 'no'} | "
              f"{minutes:.1f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
