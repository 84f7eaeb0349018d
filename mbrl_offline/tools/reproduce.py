"""Train a grid of algorithms x datasets x seeds at a named budget and write its results page:
`mbrl-reproduce [budget=cpu] [seeds=[0,1,2]] [algos=all] [datasets=[...]] [hydra/launcher=joblib]`.

The grid (mbrl_offline/configs/reproduce.yaml): every registered agent (``algos=all``, or a list) on each
of ``datasets``, the pairs under ``also`` (by default TD3+BC and IQL on the bundled MuJoCo medium
datasets), each with every seed of ``seeds``, at budget ``budget``; any other setting on the command line
is a train setting for every run (``device=cuda``, ``trainer.eval_episodes=20``). Each run is the train tool's single run
(``mbrl-train``), in its own folder ``<runs_dir>/<budget>/<algo>/<dataset>/seed<seed>``.

Run it again and it goes on where it stopped: finished runs are kept as they are, a run stopped after a
checkpoint resumes from it exactly, and the others start. Every run is composed and checked before the
first starts (a bad setting is one line, exit status 2). The runs go through Hydra's launcher as a grid
does (``hydra/launcher=joblib hydra.launcher.n_jobs=2`` on this machine's cores, ``submitit_slurm`` on a
cluster; see ``mbrl-train --help``); a run that fails is reported and the others go on (exit status 1).

Then it writes the results page ``out`` (docs/results.md): the machine, the budget's schedules, each run's
final score and wall time, the score table with bootstrap intervals, the aggregate over datasets,
performance profiles and learning curves (their PNGs beside the page). ``--cfg job`` prints the grid's
config and runs nothing; ``--help`` lists the settings.
"""
import shlex
import sys
import time
from pathlib import Path

from mbrl_offline.cli import (cli_main, compose_runs, invoked_as, is_hydra_override, launch_runs, parse_command_line,
                              print_config)
from mbrl_offline.config import CONFIG_DIR


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline import reproduce
    from mbrl_offline.config import check_writable_dir
    from mbrl_offline.config_files import compose
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.tools import train
    from mbrl_offline.trainer import earlier_run_files

    overrides, show = parse_command_line(argv, __doc__, CONFIG_DIR, "reproduce", launches=True)
    hydra_overrides = [o for o in overrides if is_hydra_override(o)]
    grid, settings = reproduce.split_overrides([o for o in overrides if not is_hydra_override(o)])
    cfg = compose(CONFIG_DIR, "reproduce", grid)
    if show:
        print_config(cfg)
    config = reproduce.reproduce_config(cfg, settings)
    check_writable_dir(config.runs_dir, "runs_dir")
    check_writable_dir(Path(config.out).parent, "out")
    planned = reproduce.plan_runs(config)
    labels = [run.label for run in planned]
    jobs = [run.overrides + [f"trainer.run_dir={run.run_dir}"] for run in planned]
    states = []

    def prepare(run_cfg) -> None:
        """A run's state (`run_state`): a finished one is kept; a stopped one resumes; a new one must find no
        other run's files; then every check the run makes (the train tool's)."""
        run_dir = Path(run_cfg.trainer.run_dir)
        states.append(reproduce.run_state(run_dir, run_cfg.trainer.epochs))
        if states[-1] == "finished":
            return
        run_cfg.resume = states[-1] == "stopped"
        if states[-1] == "new" and (found := earlier_run_files(run_dir)):
            raise ConfigError(f"{run_dir} holds another run's files ({', '.join(found)}) and no checkpoint to resume "
                              f"from; remove them or choose another runs_dir.")
        train.check(run_cfg)

    configs = compose_runs(CONFIG_DIR, "train", jobs, labels, hydra_overrides, prepare)  # a bad run: one line
    pending = [cfg for cfg, state in zip(configs, states) if state != "finished"]
    pending_labels = [label + (" (resumed)" if state == "stopped" else "")
                      for label, state in zip(labels, states) if state != "finished"]
    counts = {state: states.count(state) for state in reproduce.STATES}
    print(f"{len(planned)} runs at budget {config.budget}: {counts['finished']} finished earlier, "
          f"{counts['stopped']} to resume, {counts['new']} to start", flush=True)
    start = time.perf_counter()
    failed = launch_runs("reproduce", train.run, pending, pending_labels, hydra_overrides, False,
                         output=lambda c: c.trainer.run_dir)
    command = " ".join([invoked_as(), *(shlex.quote(a) for a in argv)])
    page = reproduce.write_results(config, planned, command, time.perf_counter() - start)
    print(f"wrote {page}", flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
