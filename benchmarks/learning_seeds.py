"""The learning tests (`tests/test_learning.py`) for any seeds: the seed tables of
docs/reproducibility.md.

    python benchmarks/learning_seeds.py --agents td3bc iql --seeds 0 1 2 [--threads 1] [--jobs 2]
    python benchmarks/learning_seeds.py --agents neubay --seeds 0 1 2 --refiner [--refiner-sigma-min 0.001]

Each (agent, seed) trains with exactly the test's settings (`CASES` there; the seed goes to
`TrainerConfig.seed`, which also seeds torch) in its own process with ``--threads`` torch threads,
``--jobs`` at a time; the model-based agents share one dynamics model, trained first. Prints one
markdown row per agent: each seed's final score (the mean of its last three evaluations, as the
test takes it), the data's score, whether every seed clears the test's bar (20 points above the
data) and the training minutes, with the machine's CPU. ``--refiner`` refines each model step of the
cases' generators (rollouts or NEUBAY's posterior) with the PDE-Refiner at its defaults
(`mbrl_offline.models.refiner.RefinerConfig`; ``--refiner-sigma-min`` sets its last noise level).
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

TEST_FILE = Path(__file__).resolve().parents[1] / "tests" / "test_learning.py"


def learning_cases():
    """`tests/test_learning.py` as a module (the tests are not a package): its `CASES` and their runs."""
    spec = importlib.util.spec_from_file_location("learning_cases", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name: str, seed: int, threads: int, cache_dir: str, refiner_sigma_min=None
         ) -> tuple[str, int, float, float, float]:
    import torch

    from mbrl_offline.models.refiner import RefinerConfig

    torch.set_num_threads(threads)
    cases = learning_cases()
    refiner = None if refiner_sigma_min is None else RefinerConfig(enabled=True, sigma_min=refiner_sigma_min)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        data_score, scores = cases.learning_run(name, Path(run_dir) / "run", cache_dir, seed=seed, refiner=refiner)
    return name, seed, data_score, sum(scores[-3:]) / 3, (time.perf_counter() - start) / 60


def main() -> None:
    cases = learning_cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", default=list(cases.CASES), choices=list(cases.CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--refiner", action="store_true", help="refine each model step with the PDE-Refiner")
    parser.add_argument("--refiner-sigma-min", type=float, default=None,
                        help="the refiner's last noise std (default: RefinerConfig's); implies --refiner")
    args = parser.parse_args()
    if any(s < 0 for s in args.seeds) or args.threads < 1 or args.jobs < 1:
        parser.error("seeds must be >= 0, --threads and --jobs at least 1")
    sigma_min = None
    if args.refiner or args.refiner_sigma_min is not None:
        from mbrl_offline.models.refiner import RefinerConfig

        sigma_min = args.refiner_sigma_min if args.refiner_sigma_min is not None else RefinerConfig().sigma_min
        if not 0 < sigma_min < 1:
            parser.error("--refiner-sigma-min must be in (0, 1)")
        for name in args.agents:
            try:
                cases.with_refiner(cases.CASES[name][1]()[1], RefinerConfig(enabled=True, sigma_min=sigma_min))
            except ValueError as error:
                parser.error(f"--refiner refines model steps, and {name}'s {error}")

    with tempfile.TemporaryDirectory() as cache_dir:
        if any(cases.uses_dynamics(name) for name in args.agents):
            import torch

            from mbrl_offline import load_dataset
            from mbrl_offline.models.dynamics import load_or_fit_dynamics

            torch.set_num_threads(args.threads * args.jobs)
            torch.manual_seed(0)  # as the test's fixture does
            load_or_fit_dynamics(load_dataset("pendulum-medium"), cases.DYNAMICS, cache_dir, progress=False)
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_run, *zip(*[(n, s, args.threads, cache_dir, sigma_min) for n in args.agents
                                                 for s in args.seeds])))

    refined = "" if sigma_min is None else f"; model steps refined (PDE-Refiner, sigma_min {sigma_min:g})"
    print(f"{cpu_name()}, {args.threads} thread(s) per run, {args.jobs} run(s) at a time{refined}")
    print("| agent | dataset (score) | seeds: final score | every seed >= data + 20 | minutes per run |")
    print("|---|---|---|---|---|")
    for name in args.agents:
        rows = [r for r in results if r[0] == name]
        data_score = rows[0][2]
        finals = ", ".join(f"{seed}: {final:.1f}" for _, seed, _, final, _ in rows)
        passed = all(final >= data_score + 20 for *_, final, _ in rows)
        minutes = f"{min(r[4] for r in rows):.1f}-{max(r[4] for r in rows):.1f}"
        print(f"| {name} | {cases.CASES[name][2]} ({data_score:.1f}) | {finals} | {'yes' if passed else 'no'} | {minutes} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
