"""CDSA's effect, measured: agents trained as in the learning tests (`tests/test_learning.py`'s `CASES`),
then evaluated with and without CDSA's test-time adjustment (`mbrl_offline.adjust`) on the same episodes.

    python benchmarks/cdsa.py --agents td3bc iql --seeds 0 1 2 [--episodes 20] [--jobs 2] [--cdsa sigma=0.2 ...]
                              [--plot cdsa.png]

Each (agent, seed) trains with exactly its learning test's settings and ``trainer.adjust=cdsa``, so
every evaluation also runs the adjusted policy on the same episode seeds; the last evaluation uses
``--episodes`` episodes. CDSA's models are fitted once per dataset first (then loaded from a shared
cache by every run). Prints one markdown row per agent and seed: the normalised score, its value at
risk and conditional value at risk at the risk level 0.1, without and with the adjustment, and the
mean over seeds, and the wall-clock minutes. ``--plot`` also draws them (`plot`).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from learning_seeds import TEST_FILE, learning_cases  # beside this script: the learning tests' cases

MEASURES = ("normalized_score", "normalized_score_var", "normalized_score_cvar")


def _cdsa_config(settings: list[str]):
    import yaml

    from mbrl_offline.adjust import CDSAConfig
    from mbrl_offline.config import config_to_dataclass

    values = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --cdsa takes setting=value, got {item!r}")
        values[key] = yaml.safe_load(value)  # as the command line reads a value: 1 is a number, delta a word
    return config_to_dataclass(CDSAConfig, values, "cdsa")


def _run(name: str, seed: int, episodes: int, cdsa_settings: list[str], cache_dir: str, source: str | None = None):
    import torch

    torch.set_num_threads(1)
    cases = learning_cases(source)
    with tempfile.TemporaryDirectory() as run_dir:
        data, trainer = cases.learning_trainer(name, Path(run_dir) / "run", cache_dir, seed,
                                               eval_every=cases.CASES[name][3], eval_episodes=episodes,
                                               adjust="cdsa", cdsa=_cdsa_config(cdsa_settings))
        trainer.train()
    last = trainer.history[-1]
    return name, seed, data.summary()["normalized_score_mean"], {m: last[m] for m in MEASURES}, \
        {m: last["cdsa"][m] for m in MEASURES}


def plot(results, agents: list[str], path: str, title: str = "") -> None:
    """A PNG of one panel per agent: the mean over seeds of the score, the VaR and the CVaR without and with CDSA
    (bars), each seed's value a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mbrl_offline.utils import save_figure

    fig, axes = plt.subplots(1, len(agents), figsize=(5.0 * len(agents), 4.0), dpi=100, squeeze=False)
    for ax, name in zip(axes[0], agents):
        rows = [r for r in results if r[0] == name]
        for offset, (label, part) in zip((-0.2, 0.2), (("without CDSA", 3), ("with CDSA", 4))):
            values = [[r[part][m] for r in rows] for m in MEASURES]
            ax.bar([i + offset for i in range(len(MEASURES))], [statistics.mean(v) for v in values], width=0.4,
                   label=label, alpha=0.7)
            for i, v in enumerate(values):
                ax.plot([i + offset] * len(v), v, "k.", markersize=4)
        ax.axhline(rows[0][2], color="black", linestyle=":", linewidth=0.8, label="the data's score")
        ax.set_xticks(range(len(MEASURES)), ["score", "VaR (0.1)", "CVaR (0.1)"])
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("normalised score")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)


def refuse(message: str) -> None:
    """Stop with one line naming the problem (exit status 2), before any work."""
    print(f"{Path(__file__).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    source = TEST_FILE.read_text(encoding="utf-8")  # every run takes the cases as they are now (`learning_cases`)
    cases = learning_cases(source)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", default=["td3bc", "iql"], choices=list(cases.CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=20, help="episodes of the last evaluation")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one torch thread each)")
    parser.add_argument("--cdsa", nargs="*", default=[], help="CDSA settings, setting=value (CDSAConfig)")
    parser.add_argument("--plot", default=None, help="also write the results as this PNG")
    args = parser.parse_args()
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        refuse(f"--plot {args.plot} must name a .png file")
    if any(s < 0 for s in args.seeds) or args.episodes < 1 or args.jobs < 1:
        refuse("seeds must be >= 0, --episodes and --jobs at least 1")
    from mbrl_offline.errors import ConfigError

    try:
        config = _cdsa_config(args.cdsa)
    except ConfigError as error:
        refuse(str(error))

    import torch

    from mbrl_offline import load_dataset
    from mbrl_offline.adjust import CDSA
    from mbrl_offline.data.envs import get_env_info

    import time

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache_dir:
        torch.set_num_threads(args.jobs)
        for dataset in sorted({cases.CASES[name][2] for name in args.agents}):  # fitted once, loaded by every run
            data = load_dataset(dataset)
            low, high = get_env_info(data.env_name).action_bounds()
            CDSA.for_dataset(config, data, low, high)
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_run, *zip(*[(n, s, args.episodes, args.cdsa, cache_dir, source) for n in args.agents
                                                 for s in args.seeds])))

    from throughput import cpu_name  # the CPU's model, family and model number

    print(f"{cpu_name()}; CDSA {dataclasses.asdict(config) | {'dynamics': '(DynamicsConfig as set)'}}")
    print(f"Normalised score of the last evaluation ({args.episodes} episodes), its value at risk and conditional "
          f"value at risk at level 0.1, without / with CDSA:\n")
    print("| agent | dataset (score) | seed | score | VaR | CVaR | score, CDSA | VaR, CDSA | CVaR, CDSA |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.agents:
        rows = [r for r in results if r[0] == name]
        for _, seed, data_score, plain, adjusted in rows:
            cells = [f"{plain[m]:.1f}" for m in MEASURES] + [f"{adjusted[m]:.1f}" for m in MEASURES]
            print(f"| {name} | {cases.CASES[name][2]} ({data_score:.1f}) | {seed} | {' | '.join(cells)} |")
        means = [f"{statistics.mean(r[3][m] for r in rows):.1f}" for m in MEASURES] + \
                [f"{statistics.mean(r[4][m] for r in rows):.1f}" for m in MEASURES]
        print(f"| {name} | | mean | {' | '.join(means)} |")
    print(f"\n{(time.perf_counter() - start) / 60:.1f} min wall clock, models and training included")
    if args.plot:
        plot(results, args.agents, args.plot, f"CDSA {' '.join(args.cdsa) or 'at its defaults'}; {args.episodes} "
                                              f"episodes; seeds {', '.join(map(str, args.seeds))}")
        print(f"wrote {args.plot}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
