"""The edge-of-reach comparison (Sims et al., NeurIPS 2024, Table 1) at a CPU-sized budget:
`mbrl-edge-of-reach [env=hopper] [budget=quick] [out=runs/edge-of-reach] [setting=value ...]`.

Trains MOPO and RAVL twice each on the env's default dataset: once with the learned dynamics
ensemble, once with the true dynamics (the simulator reset to each observed state,
`mbrl_offline.models.true_dynamics.TrueDynamics`). With the true model MOPO's penalty is exactly 0,
so MOPO becomes plain MBPO-style SAC on short rollouts: the paper finds it collapses there, with
values growing without bound at the states that k-step rollouts reach only at their last step,
while RAVL, whose pessimism comes from its critic ensemble, does not. Any other setting is passed
to every run (e.g. ``trainer.epochs=100``; ``overwrite=true`` replaces the runs of an earlier call in
``out``). Prints a table of what the runs measured: the final normalised score, the mean of the last
evaluations, the final mean Q of the training batches and the mean MOPO penalty of the last rollouts.

``--help`` lists the config groups and where each setting is documented; ``--cfg job`` prints the four
runs' composed configs and trains nothing.
"""
from pathlib import Path

from mbrl_offline.cli import build_trainer, cli_main, parse_command_line, print_config
from mbrl_offline.config_files import compose
from mbrl_offline.config import CONFIG_DIR

RUNS = [("mopo", False), ("mopo", True), ("ravl", False), ("ravl", True)]
OUT_HELP = "folder for the four run folders (default: runs/edge-of-reach)"


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline.logging import read_metrics

    argv, cfg_job = parse_command_line(argv, __doc__, CONFIG_DIR, "train", {"out": OUT_HELP})
    out = Path(next((a.split("=", 1)[1] for a in argv if a.startswith("out=")), "runs/edge-of-reach"))
    overrides = [a for a in argv if not a.startswith("out=")]
    if not any(a.startswith("budget=") for a in overrides):
        overrides.append("budget=quick")
    rows, configs = [], {}
    for algo, true_dynamics in RUNS:  # every config composed (and so checked) before the first run trains
        model = "true" if true_dynamics else "learned"
        configs[f"{algo}-{model}"] = compose(CONFIG_DIR, "train", [
            f"algo={algo}", f"generator.true_dynamics={str(true_dynamics).lower()}",
            "generator.rollout.uncertainty=true", f"trainer.run_dir={out / f'{algo}-{model}'}", *overrides])
    if cfg_job:
        print_config(configs)
    for (algo, true_dynamics), cfg in zip(RUNS, configs.values()):
        model = "true" if true_dynamics else "learned"
        trainer = build_trainer(cfg)
        summary = trainer.train(overwrite=cfg.overwrite)
        last = read_metrics(trainer.run_dir)[-1]
        rows.append((algo, model, summary["final_score"], summary["last10_score"], min(10, summary["evaluations"]),
                     last["train"]["q_mean"], last.get("rollout", {}).get("aleatoric_mean", float("nan"))))
    print(f"\n{'algo':<6}{'dynamics':<10}{'final score':>12}{'last-evals mean':>17}{'final mean Q':>14}"
          f"{'MOPO penalty u':>16}")
    for algo, model, final, last_mean, count, q_mean, penalty in rows:
        print(f"{algo:<6}{model:<10}{final:>12.1f}{last_mean:>12.1f} ({count:>2}){q_mean:>14.1f}{penalty:>16.3f}")


if __name__ == "__main__":
    main()
