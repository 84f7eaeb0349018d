"""Train an agent: `mbrl-train algo=ravl env=hopper [generator=NAME] [budget=quick] [setting=value ...]`.

Trains on the env's default dataset (bundled hopper-medium for hopper) unless ``env.dataset=`` names
another (a bundled name, a D4RL .hdf5 file or a Minari id), with the algorithm's published generator
unless ``generator=`` names another (``none``, ``rollouts``, or another algorithm's:
mbrl_offline/configs/generator/). Writes TensorBoard logs, metrics.jsonl and checkpoint.pt to
``trainer.run_dir``; ``resume=true`` continues a stopped run. A run folder that holds an earlier run's
files (run.json, metrics.jsonl, checkpoint.pt, tensorboard/) is refused before anything is loaded unless
``resume=true`` or ``overwrite=true`` (delete that run's files and start afresh) is given; these are true
or false only (``overwrite=no`` is refused, never read as true). Settings are checked before any work
(ranges, the device, the preset's env, that the run folder can be written). Settings:
mbrl_offline/configs/train.yaml.

``--help`` lists the config groups and where each setting is documented; ``--cfg job`` prints the
composed config and trains nothing. Paths may hold spaces and any characters:
``trainer.run_dir='runs/été 1'``.

``-m`` (``--multirun``) runs a grid, as Hydra's multirun does: ``-m seed=0,1,2 algo=td3bc,iql`` runs every
combination, each a full run with its own run folder, through Hydra's launcher ``hydra/launcher=``
(basic: one after another; joblib: side by side on this machine, ``hydra.launcher.n_jobs=2``;
submitit_local or submitit_slurm; ray). Every run is checked before the first starts; a run that fails
is reported and the others go on (exit status 1 if any failed).
"""

from mbrl_offline.cli import build_trainer, cli_main, resolve_train_config, tool_runs
from mbrl_offline.config import CONFIG_DIR


def check(cfg) -> None:
    """Every check a run makes before any work: the settings, the pairing, the device, the folders, and a
    run folder that holds an earlier run (refused unless resume=true or overwrite=true)."""
    from mbrl_offline.trainer import check_run_dir

    trainer_config = resolve_train_config(cfg)[3]
    check_run_dir(trainer_config.run_dir, resume=cfg.get("resume", False), overwrite=cfg.get("overwrite", False))


def run(cfg) -> None:
    """One training run of a composed ``train`` config."""
    trainer = build_trainer(cfg)
    summary = trainer.train(resume=cfg.resume, overwrite=cfg.overwrite)
    print(f"final normalised score {summary['final_score']:.1f} (return {summary['final_return']:.1f}); "
          f"mean of the last {min(10, summary['evaluations'])} evaluations {summary['last10_score']:.1f}")


@cli_main
def main(argv: list[str]) -> None:
    tool_runs("train", argv, __doc__, CONFIG_DIR, "train", run, check, output=lambda cfg: cfg.trainer.run_dir)


if __name__ == "__main__":
    main()
