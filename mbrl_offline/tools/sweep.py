"""Tune an agent with Optuna: `mbrl-sweep algo=ravl env=hopper [sweep=ravl] [budget=quick] [...]`.

The search space, sampler, pruner, trials, seeds per trial and storage come from
mbrl_offline/configs/sweep/<algo>.yaml (fields: SweepConfig in mbrl_offline/tune.py); every other override
is a training setting, as for train.py, and applies to every trial. Run the same command again to resume
an interrupted study, or on other machines with ``sweep.storage=postgresql://...`` to add workers to it.
At the end it prints the best parameters; ``mbrl-report <sweep.dir>`` writes the sweep's report.

``--help`` lists the config groups and where each setting is documented; ``--cfg job`` prints the
composed config (training settings and the sweep section) and runs no trial.
"""
import sys
from pathlib import Path

from mbrl_offline.cli import build_trainer, cli_main, invoked_as, parse_command_line, print_config, resolve_train_config
from mbrl_offline.config_files import compose
from mbrl_offline.config import CONFIG_DIR, check_writable_dir, config_to_dataclass
from mbrl_offline.errors import ConfigError


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline.tune import SweepConfig, check_storage, extreme_values, override, run_sweep, summarize_study

    argv, cfg_job = parse_command_line(argv, __doc__, CONFIG_DIR, "tune")  # --help, --cfg job: as every tool
    cfg = compose(CONFIG_DIR, "tune", argv)
    if cfg_job:
        print_config(cfg)
    sweep = config_to_dataclass(SweepConfig, cfg.sweep, "sweep")
    if sweep.for_algo is not None and sweep.for_algo != cfg.algo.name:
        raise ConfigError(f"that search space is written for {sweep.for_algo}, not {cfg.algo.name}; "
                          f"use sweep={cfg.algo.name} or algo={sweep.for_algo}.")
    check_writable_dir(sweep.dir, "sweep.dir")
    check_storage(sweep.storage)
    # the training overrides every trial shares: the command line without the sweep's own settings
    # (nor resume/overwrite: each trial's folder decides those)
    train_overrides = [a for a in argv if not a.lstrip("+~").startswith(("sweep.", "sweep=", "resume=", "overwrite="))]

    def train_config(params: dict, seed: int, run_dir: Path, resume: bool = False):
        # The sweep owns its trials' folders: a run with a checkpoint resumes, one stopped before its
        # first checkpoint starts again over what it left.
        return compose(CONFIG_DIR, "train", train_overrides + [override(k, v) for k, v in params.items()]
                       + [f"seed={seed}", f"trainer.run_dir={run_dir}", f"resume={str(resume).lower()}",
                          f"overwrite={str(not resume).lower()}"])

    for values in extreme_values(sweep.parameters):  # a typo in the space fails here, not in every trial
        try:
            resolve_train_config(train_config(values, sweep.seeds[0], Path(sweep.dir)))
        except ConfigError as exc:
            raise ConfigError(f"the search space sets {', '.join(values)}: {exc}") from None

    def run_trial(params: dict, seed: int, run_dir: Path, callbacks: list) -> dict:
        resume = (run_dir / "checkpoint.pt").exists()
        trainer = build_trainer(train_config(params, seed, run_dir, resume), callbacks)
        return trainer.train(resume=resume, overwrite=not resume)

    print(f"study '{sweep.study_name}' in {sweep.dir}: {sweep.n_trials} trials x {len(sweep.seeds)} seed(s), "
          f"{sweep.sampler.name} sampler, {sweep.pruner.name} pruner", flush=True)
    try:
        study = run_sweep(sweep, run_trial)
    except KeyboardInterrupt:
        print("interrupted; the stopped trial is queued again. Run the same command to resume.", file=sys.stderr)
        sys.exit(130)
    print(summarize_study(study, sweep.objective))
    print(f"report: {invoked_as('report')} {sweep.dir}")


if __name__ == "__main__":
    main()
