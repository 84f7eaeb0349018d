"""The edge-of-reach comparison (Sims et al., NeurIPS 2024, Table 1) at a CPU-sized budget:
`mbrl-edge-of-reach [env=hopper] [budget=quick] [out=runs/edge-of-reach] [runs=[...]] [setting=value ...]`.

Trains MOPO and RAVL twice each on the env's default dataset: once with the learned dynamics
ensemble, once with the true dynamics (the simulator reset to each observed state,
`mbrl_offline.models.true_dynamics.TrueDynamics`). With the true model MOPO's penalty is exactly 0,
so MOPO becomes plain MBPO-style SAC on short rollouts: the paper finds it collapses there, with
values growing without bound at the states that k-step rollouts reach only at their last step,
while RAVL, whose pessimism comes from its critic ensemble, does not. ``runs`` picks some of the four
(mopo-learned, mopo-true, ravl-learned, ravl-true; default all). Any other setting is passed
to every run (e.g. ``trainer.epochs=100``; ``overwrite=true`` replaces the runs of an earlier call in
``out``).

Prints a table of what the runs measured: the final normalised score, the mean of the last
evaluations, the final mean Q of the training batches, the **Q bound** r_max / (1 - gamma) (no
policy's value can exceed it where every reward is at most the data's largest, r_max: a mean Q above
it is overestimation, whatever the policy) and the mean MOPO penalty of the last rollouts. Writes
``<out>/edge_of_reach.png``: each run's mean Q by epoch against its bound, and its scores against the
data's. `docs/findings.md` gives the command and settings at which MOPO collapses on pendulum-medium.

``--help`` lists the config groups and where each setting is documented; ``--cfg job`` prints the
runs' composed configs and trains nothing.
"""
from __future__ import annotations

from pathlib import Path

from mbrl_offline.cli import build_trainer, cli_main, parse_command_line, print_config
from mbrl_offline.config import CONFIG_DIR
from mbrl_offline.config_files import compose
from mbrl_offline.errors import ConfigError

RUNS = {"mopo-learned": ("mopo", False), "mopo-true": ("mopo", True), "ravl-learned": ("ravl", False),
        "ravl-true": ("ravl", True)}
OUT_HELP = "folder for the run folders and edge_of_reach.png (default: runs/edge-of-reach)"
RUNS_HELP = "which runs: a list from mopo-learned, mopo-true, ravl-learned, ravl-true (default: all four)"


def tool_arguments(argv: list[str]) -> tuple[Path, list[str], list[str]]:
    """``(out, runs, overrides)`` from the overrides: the tool's own ``out=`` and ``runs=`` (checked), and
    the settings passed to every run (``budget=quick`` added when none is given)."""
    out = Path(next((a.split("=", 1)[1] for a in argv if a.startswith("out=")), "runs/edge-of-reach"))
    given = next((a.split("=", 1)[1] for a in argv if a.startswith("runs=")), None)
    runs = list(RUNS) if given is None else [r.strip() for r in given.strip().strip("[]").split(",") if r.strip()]
    if not runs or any(r not in RUNS for r in runs) or len(set(runs)) != len(runs):
        raise ConfigError(f"runs={given} must list distinct runs from {', '.join(RUNS)}, "
                          f"e.g. runs=[mopo-true,ravl-true].")
    overrides = [a for a in argv if not a.startswith(("out=", "runs="))]
    if not any(a.startswith("budget=") for a in overrides):
        overrides.append("budget=quick")
    return out, [r for r in RUNS if r in runs], overrides


def run_configs(out: Path, runs: list[str], overrides: list[str]) -> dict:
    """Each run's composed ``train`` config, every one composed (and so checked) before any trains."""
    configs = {}
    for name in runs:
        algo, true_dynamics = RUNS[name]
        configs[name] = compose(CONFIG_DIR, "train", [
            f"algo={algo}", f"generator.true_dynamics={str(true_dynamics).lower()}",
            "generator.rollout.uncertainty=true", f"trainer.run_dir={out / name}", *overrides])
    return configs


def train_runs(configs: dict) -> list[dict]:
    """Train each run; one record per run: its name, algorithm and model, the data's score, its
    evaluations ``(epoch, score)``, its mean Q by epoch, its Q bound and the last rollouts' MOPO penalty."""
    from mbrl_offline.logging import read_metrics

    rows = []
    for name, cfg in configs.items():
        trainer = build_trainer(cfg)
        summary = trainer.train(overwrite=cfg.overwrite)
        records = read_metrics(trainer.run_dir)
        rewards = trainer.dataset.rewards
        q_bound = float(rewards.max()) / (1.0 - trainer.agent.config.gamma)
        rows.append({"name": name, "algo": RUNS[name][0], "model": "true" if RUNS[name][1] else "learned",
                     "data_score": float(trainer.dataset.summary()["normalized_score_mean"]),
                     "final": summary["final_score"], "last_mean": summary["last10_score"],
                     "last_count": min(10, summary["evaluations"]),
                     "evaluations": [(h["epoch"], h["normalized_score"]) for h in trainer.history],
                     "q": [(r["epoch"], r["train"]["q_mean"]) for r in records if "q_mean" in r.get("train", {})],
                     "q_bound": q_bound,
                     "penalty": records[-1].get("rollout", {}).get("aleatoric_mean", float("nan"))})
    return rows


def table(rows: list[dict]) -> str:
    """The printed table: one line per run."""
    lines = [f"{'algo':<6}{'dynamics':<10}{'final score':>12}{'last-evals mean':>17}{'final mean Q':>14}"
             f"{'Q bound':>10}{'MOPO penalty u':>16}"]
    for r in rows:
        lines.append(f"{r['algo']:<6}{r['model']:<10}{r['final']:>12.1f}{r['last_mean']:>12.1f} ({r['last_count']:>2})"
                     f"{r['q'][-1][1]:>14.1f}{r['q_bound']:>10.1f}{r['penalty']:>16.3f}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str = "") -> Path:
    """A PNG of two panels: each run's mean Q by epoch (symmetric-log scale) with its Q bound dashed, and
    its normalised scores by epoch with the data's dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mbrl_offline.utils import save_figure

    fig, (q_ax, score_ax) = plt.subplots(1, 2, figsize=(12.0, 4.2), dpi=100)
    for r in rows:
        label = f"{r['algo'].upper()}, {r['model']} dynamics"
        line, = q_ax.plot(*zip(*r["q"]), label=label)
        q_ax.axhline(r["q_bound"], color=line.get_color(), linestyle="--", linewidth=0.8)
        score_ax.plot(*zip(*r["evaluations"]), marker=".", label=label, color=line.get_color())
    score_ax.axhline(rows[0]["data_score"], color="black", linestyle=":", label="the data")
    q_ax.set_yscale("symlog", linthresh=10.0)
    q_ax.set_ylabel("mean Q of the training batches (dashed: r_max / (1 - γ))")
    score_ax.set_ylabel("normalised score")
    for ax in (q_ax, score_ax):
        ax.set_xlabel("epoch")
        ax.grid(True, which="both", alpha=0.3)
    score_ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)


@cli_main
def main(argv: list[str]) -> list[dict]:
    argv, cfg_job = parse_command_line(argv, __doc__, CONFIG_DIR, "train", {"out": OUT_HELP, "runs": RUNS_HELP})
    out, runs, overrides = tool_arguments(argv)
    configs = run_configs(out, runs, overrides)
    if cfg_job:
        print_config(configs)
    rows = train_runs(configs)
    print("\n" + table(rows))
    cfg = next(iter(configs.values()))
    title = (f"{cfg.env.name}, dataset score {rows[0]['data_score']:.1f}; rollout horizon "
             f"{cfg.generator.rollout.horizon}, gamma {cfg.algo.gamma}, seed {cfg.trainer.seed}")
    print(f"\nwrote {plot(rows, out / 'edge_of_reach.png', title)}")
    return rows


if __name__ == "__main__":
    main()
