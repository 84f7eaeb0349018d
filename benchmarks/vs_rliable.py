"""The report's statistics (`mbrl_offline.statistics`) against the rliable library on the same scores.

    # outside this repository: rliable in an environment of its own
    python -m venv /work/rl_venv && /work/rl_venv/bin/pip install rliable "pandas<3"   # rliable 1.2.0
    python benchmarks/vs_rliable.py --python /work/rl_venv/bin/python [--reps 50000] [--profile-reps 2000]

(``pandas<3``: rliable 1.2.0 pulls arch 7.2.0, whose import failed under pandas 3.1.1 with "deprecate_kwarg()
missing 1 required positional argument".)

Score sets (each a runs x tasks matrix, the only shape rliable takes), drawn here with a seeded NumPy
generator and given to both sides: ``normal`` (5 runs x 4 tasks, normal scores with task offsets),
``ties`` (10 x 3, whole numbers 0-4, so that comparisons tie often) and ``skewed`` (3 x 6, lognormal
scores, an outlier run per task). Two algorithms per set, ``A`` and ``B`` (B's scores shifted down by
a set amount), so the probability of improvement has a pair.

For each set and algorithm both sides compute, with the bootstrap replicates given by the flags:
the IQM and the mean with 95% stratified bootstrap intervals (rliable: ``get_interval_estimates`` with
``metrics.aggregate_iqm`` and ``metrics.aggregate_mean``), P(A > B) with its interval
(``metrics.probability_of_improvement``), and the performance profile at 11 thresholds with its
bands (``create_performance_profile``). The point estimates are deterministic and must agree to float
rounding; the intervals come from each side's own random draws, so they agree only to the Monte Carlo
error of the replicates, which the table shows beside them. The script exits with status 1 if a point
estimate differs by more than 1e-9 or an interval end by more than ``--tolerance`` (default 0.05: of the
set's score range for the IQM and the mean, absolute for P(A > B) and the profiles; a profile's share
moves in steps of 1 / (runs x tasks), so one step is always allowed there).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

THRESHOLDS = 11


def score_sets() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(2021)
    normal = rng.normal(50.0, 10.0, size=(5, 4)) + np.array([0.0, 20.0, -10.0, 5.0])
    ties = rng.integers(0, 5, size=(10, 3)).astype(float)
    skewed = rng.lognormal(3.0, 0.6, size=(3, 6))
    skewed[0] *= 4.0  # an outlier run on every task
    shifts = {"normal": 8.0, "ties": 1.0, "skewed": 5.0}
    sets = {"normal": normal, "ties": ties, "skewed": skewed}
    return {name: {"A": scores, "B": scores - shifts[name] + rng.normal(0.0, shifts[name], size=scores.shape)
                   * (name != "ties")} for name, scores in sets.items()}


def thresholds_of(algorithms: dict[str, np.ndarray]) -> np.ndarray:
    every = np.concatenate([a.ravel() for a in algorithms.values()])
    return np.linspace(every.min() - 1.0, every.max() + 1.0, THRESHOLDS)


def rliable_side(sets: dict, reps: int, profile_reps: int) -> dict:
    from rliable import library as rly
    from rliable import metrics

    out = {}
    for name, algorithms in sets.items():
        algorithms = {k: np.asarray(v) for k, v in algorithms.items()}
        point, interval = rly.get_interval_estimates(
            algorithms, lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)]), reps=reps)
        poi, poi_interval = rly.get_interval_estimates(
            {"A,B": (algorithms["A"], algorithms["B"])}, metrics.probability_of_improvement, reps=profile_reps)
        profiles, profile_bands = rly.create_performance_profile(algorithms, thresholds_of(algorithms),
                                                                 reps=profile_reps)
        out[name] = {
            **{f"{a} {stat}": [float(point[a][i]), float(interval[a][0][i]), float(interval[a][1][i])]
               for a in algorithms for i, stat in enumerate(("IQM", "mean"))},
            "P(A > B)": [float(poi["A,B"]), *np.asarray(poi_interval["A,B"], dtype=float).ravel().tolist()],
            **{f"{a} profile": [np.asarray(profiles[a]).tolist(), np.asarray(profile_bands[a][0]).tolist(),
                                np.asarray(profile_bands[a][1]).tolist()] for a in algorithms},
        }
    return out


def our_side(sets: dict, reps: int, profile_reps: int) -> dict:
    from mbrl_offline import statistics

    out = {}
    for name, algorithms in sets.items():
        algorithms = {k: np.asarray(v) for k, v in algorithms.items()}
        tasks = {a: list(scores.T) for a, scores in algorithms.items()}  # one array of runs per task
        result = {}
        for a in algorithms:
            for stat, estimate in (("IQM", statistics.iqm_estimate(tasks[a], reps)),
                                   ("mean", statistics.mean_estimate(tasks[a], reps))):
                result[f"{a} {stat}"] = [estimate.value, estimate.low, estimate.high]
        poi = statistics.probability_of_improvement(tasks["A"], tasks["B"], profile_reps)
        result["P(A > B)"] = [poi.value, poi.low, poi.high]
        for a in algorithms:
            point, low, high = statistics.performance_profile(tasks[a], thresholds_of(algorithms), profile_reps)
            result[f"{a} profile"] = [point.tolist(), low.tolist(), high.tolist()]
        out[name] = result
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, help="the Python of an environment with rliable installed")
    parser.add_argument("--reps", type=int, default=50_000, help="replicates of the IQM's and mean's intervals")
    parser.add_argument("--profile-reps", type=int, default=2_000,
                        help="replicates of the profiles' and P(A > B)'s intervals")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest difference of an interval end, as a share of the set's score range")
    parser.add_argument("--side", choices=["rliable"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = score_sets()
    if args.side == "rliable":  # the child, in rliable's environment
        print("RESULT " + json.dumps(rliable_side(sets, args.reps, args.profile_reps)))
        return
    if args.python is None or not args.python.is_file():
        sys.exit(f"error: --python {args.python} is not a file; give the Python of an environment with rliable "
                 "installed (see the docstring).")
    child = subprocess.run([str(args.python), __file__, "--side", "rliable", "--reps", str(args.reps),
                            "--profile-reps", str(args.profile_reps)], capture_output=True, text=True)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    if child.returncode != 0 or not lines:
        sys.exit(f"error: the rliable side failed (exit {child.returncode}): {child.stderr.strip().splitlines()[-1:]}")
    theirs = json.loads(lines[-1][len("RESULT "):])
    version = subprocess.run([str(args.python), "-c", "import importlib.metadata as m; print(m.version('rliable'))"],
                             capture_output=True, text=True).stdout.strip()
    ours = our_side(sets, args.reps, args.profile_reps)
    print(f"rliable {version}; {args.reps:,} replicates for the IQM and the mean, {args.profile_reps:,} for "
          f"P(A > B) and the profiles\n")
    print("| scores | statistic | rliable | ours | point difference | largest interval-end difference |")
    print("|---|---|---:|---:|---:|---:|")
    failed = []
    for name, results in ours.items():
        scale = float(np.ptp(np.concatenate([np.asarray(v).ravel() for v in sets[name].values()])))
        for stat, (value, low, high) in results.items():
            their_value, their_low, their_high = theirs[name][stat]
            if stat.endswith("profile"):  # arrays over the thresholds: shares in [0, 1]
                point_diff = float(np.max(np.abs(np.subtract(value, their_value))))
                end_diff = float(max(np.max(np.abs(np.subtract(low, their_low))),
                                     np.max(np.abs(np.subtract(high, their_high)))))
                text = (f"{THRESHOLDS} thresholds", f"{THRESHOLDS} thresholds")
                runs, tasks = sets[name]["A"].shape  # a share moves in steps of 1 / (runs x tasks)
                limit = max(args.tolerance, 1.0 / (runs * tasks) + 1e-9)
            else:
                point_diff, end_diff = abs(value - their_value), max(abs(low - their_low), abs(high - their_high))
                text = (f"{their_value:.3f} [{their_low:.3f}, {their_high:.3f}]", f"{value:.3f} [{low:.3f}, {high:.3f}]")
                limit = args.tolerance * (1.0 if stat.startswith("P(") else scale)
            print(f"| {name} | {stat} | {text[0]} | {text[1]} | {point_diff:.1e} | {end_diff:.3f} |")
            if point_diff > 1e-9 or end_diff > limit:
                failed.append(f"{name} {stat}")
    if failed:
        sys.exit(f"\nerror: beyond the tolerances: {', '.join(failed)}")
    print("\nEvery point estimate agrees to 1e-9, and every interval end within the tolerance.")


if __name__ == "__main__":
    main()
