"""Tune an agent with Optuna: `mbrl-sweep algo=ravl env=hopper [sweep=ravl] [budget=quick] [...]`, or its
fine-tuning: `mbrl-sweep checkpoint=runs/<run>/checkpoint.pt online=true [sweep=finetune] [...]`.

The search space, sampler, pruner, trials, seeds per trial and storage come from
mbrl_offline/configs/sweep/<algo>.yaml (fields: SweepConfig in mbrl_offline/tune.py); every other override
is a training setting, as for train.py, and applies to every trial. Run the same command again to resume
an interrupted study, or on other machines with ``sweep.storage=postgresql://...`` to add workers to it.
At the end it prints the best parameters; ``mbrl-report <sweep.dir>`` writes the sweep's report.

With ``checkpoint=``, every trial is a fine-tuning run of that checkpoint (as ``mbrl-finetune`` runs it,
mbrl_offline/tools/finetune.py): the command's other settings are the fine-tuning tool's (``dataset=``,
``online=true``, ``trainer.epochs=``, ...), the search space is a ``job: finetune`` file
(mbrl_offline/configs/sweep/finetune*.yaml: ``sweep=finetune``, the default, searches
``trainer.online.offline_ratio``; ``sweep=finetune-penalty`` adds ``penalty``; ``sweep=finetune-mbpo``
searches the model's ``trainer.online.refit_every`` and ``penalty``), and the sweep's folder defaults to
``sweeps/<the checkpoint's run>-finetune``. A study keeps its checkpoint: resuming it with another is refused.

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

    finetuning = any(a.partition("=")[0].lstrip("+") == "checkpoint" for a in argv)
    config_name = "tune_finetune" if finetuning else "tune"
    argv, cfg_job = parse_command_line(argv, __doc__, CONFIG_DIR, config_name)  # --help, --cfg job: as every tool
    cfg = compose(CONFIG_DIR, config_name, argv)
    if cfg_job:
        print_config(cfg)
    if finetuning:
        from mbrl_offline.tools import finetune

        finetune.check_checkpoint(cfg.checkpoint)  # before the space is checked with it
        name = Path(cfg.checkpoint).resolve().parent.name + "-finetune"  # the defaults of study_name and dir
        cfg.sweep.study_name = cfg.sweep.study_name or name
        cfg.sweep.dir = cfg.sweep.dir or f"sweeps/{name}"
    sweep = config_to_dataclass(SweepConfig, cfg.sweep, "sweep")
    if finetuning and sweep.job != "finetune":
        raise ConfigError(f"that search space is for training runs (sweep.job={sweep.job}), and checkpoint= makes every "
                          f"trial a fine-tuning run; use sweep=finetune (or another job: finetune space).")
    if not finetuning and sweep.job == "finetune":
        raise ConfigError("that search space is for fine-tuning runs (sweep.job=finetune); give the checkpoint to "
                          "fine-tune: checkpoint=runs/<run>/checkpoint.pt")
    if not finetuning and sweep.for_algo is not None and sweep.for_algo != cfg.algo.name:
        raise ConfigError(f"that search space is written for {sweep.for_algo}, not {cfg.algo.name}; "
                          f"use sweep={cfg.algo.name} or algo={sweep.for_algo}.")
    check_writable_dir(sweep.dir, "sweep.dir")
    check_storage(sweep.storage)
    # the settings every trial shares: the command line without the sweep's own settings
    # (nor resume/overwrite: each trial's folder decides those)
    shared = [a for a in argv if not a.lstrip("+~").startswith(("sweep.", "sweep=", "resume=", "overwrite="))]

    def trial_config(params: dict, seed: int, run_dir: Path, resume: bool = False):
        # The sweep owns its trials' folders: a run with a checkpoint resumes, one stopped before its
        # first checkpoint starts again over what it left.
        own = ([f"trainer.seed={seed}", f"trainer.run_dir={run_dir}"] if finetuning
               else [f"seed={seed}", f"trainer.run_dir={run_dir}"])
        return compose(CONFIG_DIR, "finetune" if finetuning else "train",
                       shared + [override(k, v) for k, v in params.items()] + own
                       + [f"resume={str(resume).lower()}", f"overwrite={str(not resume).lower()}"])

    for values in extreme_values(sweep.parameters):  # a typo in the space fails here, not in every trial
        try:
            if finetuning:
                trial = trial_config(values, sweep.seeds[0], Path(sweep.dir))
                online_only = [k for k in values if k.startswith("trainer.online.")]
                if online_only and not trial.online:
                    raise ConfigError(f"{', '.join(online_only)} {'acts' if len(online_only) == 1 else 'act'} only "
                                      f"online; add online=true")
                if not finetune.check_settings(trial) and values.get("penalty") == "off":
                    raise ConfigError("penalty=off turns nothing off for this checkpoint's agent and generator; "
                                      "use a space without penalty (sweep=finetune)")
            else:
                resolve_train_config(trial_config(values, sweep.seeds[0], Path(sweep.dir)))
        except ConfigError as exc:
            raise ConfigError(f"the search space sets {', '.join(values)}: {exc}") from None

    def run_trial(params: dict, seed: int, run_dir: Path, callbacks: list) -> dict:
        resume = (run_dir / "checkpoint.pt").exists()
        config = trial_config(params, seed, run_dir, resume)
        trainer = finetune.build(config, callbacks) if finetuning else build_trainer(config, callbacks)
        return trainer.train(resume=resume, overwrite=not resume)

    print(f"study '{sweep.study_name}' in {sweep.dir}: {sweep.n_trials} trials x {len(sweep.seeds)} seed(s), "
          f"{sweep.sampler.name} sampler, {sweep.pruner.name} pruner"
          + (f", fine-tuning {cfg.checkpoint}" if finetuning else ""), flush=True)
    defines = {"checkpoint": str(Path(cfg.checkpoint).resolve())} if finetuning else None
    try:
        study = run_sweep(sweep, run_trial, defines=defines)
    except KeyboardInterrupt:
        print("interrupted; the stopped trial is queued again. Run the same command to resume.", file=sys.stderr)
        sys.exit(130)
    print(summarize_study(study, sweep.objective))
    print(f"report: {invoked_as('report')} {sweep.dir}")


if __name__ == "__main__":
    main()
