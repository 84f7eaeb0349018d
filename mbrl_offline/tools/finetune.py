"""Fine-tune a trained agent: `mbrl-finetune checkpoint=runs/td3bc-pendulum-seed0/checkpoint.pt dataset=pendulum-medium`.

Trains the checkpoint's agent further (its weights, optimiser states and settings) in a new run folder
(``trainer.run_dir``; by default the checkpoint's folder with ``-finetune`` after its name), on
``data=append`` (the default: the checkpoint's own dataset with the rows of ``dataset=`` after it) or
``data=replace`` (``dataset=`` alone). ``dataset=`` is a bundled name, a D4RL .hdf5 file or a Minari id,
of the checkpoint's env and widths. ``online=true`` also has the agent act in the real env, each step's
transition added to the real data (``trainer.online.*``: mbrl_offline/online.py). The agent's generator keeps its settings; its model is fitted on the
fine-tuning data (``model=refit``, the default) or is the checkpoint's (``model=keep``). ``penalty=off`` turns
the agent's and the generator's conservatism off (CQL's term, MOBILE's and MOPO's penalties, MOReL's halts,
RAMBO's adversary: mbrl_offline/finetune.py's without_penalty); ``penalty=keep`` (the default) keeps them. ``trainer.*``
settings left null keep the checkpoint's (``trainer.epochs=``: the fine-tuning run's epochs, from 0).
``run.json`` records the checkpoint, the data and the rules (``finetuned_from``). The run folder is an
ordinary run's: ``resume=true`` continues a stopped fine-tuning run, a folder holding an earlier run is
refused unless ``overwrite=true``, and reports read it. ``logger=wandb`` adds Weights & Biases. Every
setting is checked before the checkpoint is read (mbrl_offline/configs/finetune.yaml); the
checkpoint's own settings and the new data are checked before any training. ``--help`` lists the
settings; ``--cfg job`` prints the composed config and trains nothing (mbrl_offline/finetune.py). ``-m``
runs a grid of fine-tuning runs through Hydra's launchers, as the train tool's does
(``-m trainer.online.offline_ratio=0,0.5 trainer.seed=0,1,2 trainer.run_dir='runs/ft-${trainer.seed}-...'``).
"""
from pathlib import Path

from mbrl_offline.cli import cli_main, tool_runs
from mbrl_offline.config import CONFIG_DIR


def run_dir_of(cfg) -> Path:
    """The fine-tuning run's folder: ``trainer.run_dir``, or the checkpoint's folder with ``-finetune``."""
    if cfg.trainer.get("run_dir"):
        return Path(cfg.trainer.run_dir)
    folder = Path(cfg.checkpoint).resolve().parent
    return folder.with_name(folder.name + "-finetune")


def given_settings(settings: dict) -> dict:
    """The trainer settings given on the command line: those not null, sections (``online``) likewise."""
    given = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            value = given_settings(value)
        if value is not None and value != {}:
            given[key] = value
    return given


def check_checkpoint(checkpoint) -> None:
    """``checkpoint=`` names a file (the fine-tuning tool, and the sweep tool's fine-tuning sweeps)."""
    from mbrl_offline.errors import ConfigError

    if not checkpoint:
        raise ConfigError("give the checkpoint to fine-tune: checkpoint=runs/<run>/checkpoint.pt")
    if not Path(checkpoint).is_file():
        raise ConfigError(f"checkpoint={checkpoint}: no such file; give a run's checkpoint.pt.")


def check(cfg) -> Path:
    """The settings, before the checkpoint is read; returns the run folder."""
    from mbrl_offline.config import check_device, check_writable_dir
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.finetune import check_finetune_settings
    from mbrl_offline.trainer import check_run_dir

    check_checkpoint(cfg.checkpoint)
    check_finetune_settings(cfg.data, cfg.model, cfg.penalty)
    check_device(cfg.device, "device")
    run_dir = run_dir_of(cfg)
    if run_dir.resolve() == Path(cfg.checkpoint).resolve().parent:
        raise ConfigError(f"trainer.run_dir={run_dir} is the checkpoint's own run; fine-tuning writes a new run "
                          f"folder: choose another trainer.run_dir (resume=true with the train tool continues that run).")
    check_run_dir(run_dir, resume=cfg.resume, overwrite=cfg.overwrite)
    check_writable_dir(run_dir, "trainer.run_dir")
    return run_dir


def trainer_settings(cfg) -> dict:
    """The trainer settings the fine-tuning run gets over the checkpoint's: those given, the run folder,
    and ``online.enabled`` from ``online=true``."""
    from omegaconf import OmegaConf

    settings = given_settings(OmegaConf.to_container(cfg.trainer, resolve=True))
    settings["run_dir"] = str(run_dir_of(cfg))
    if cfg.online:
        settings["online"] = {**settings.get("online", {}), "enabled": True}
    return settings


def check_settings(cfg) -> list[str]:
    """`check`, then the checkpoint's settings with these over them (`mbrl_offline.finetune.finetune_settings`),
    without loading data or fitting a model. Returns the settings ``penalty=off`` changes (none with
    ``penalty=keep``). A fine-tuning sweep checks its search space with it."""
    from mbrl_offline.finetune import finetune_settings

    check(cfg)
    return finetune_settings(cfg.checkpoint, cfg.data, cfg.model, trainer_settings(cfg), cfg.penalty)[-1]


def build(cfg, callbacks: list | None = None):
    """The fine-tuning `Trainer` of a composed and checked config (``callbacks`` go to it)."""
    import torch

    from mbrl_offline import platform
    from mbrl_offline.finetune import build_finetune

    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if cfg.keep_freed_memory and torch.device(cfg.device).type == "cpu":
        platform.keep_freed_memory()
    trainer = build_finetune(cfg.checkpoint, cfg.dataset, cfg.data, cfg.model, trainer_settings(cfg), cfg.device,
                             cache_dir=cfg.dynamics_cache, dynamics_path=cfg.dynamics_path, callbacks=callbacks,
                             penalty=cfg.penalty)
    origin = trainer.origin["finetuned_from"]
    print(f"fine-tuning {trainer.agent.name} from {cfg.checkpoint} (epoch {origin['epoch']}) on {trainer.dataset.source} "
          f"({len(trainer.dataset)} transitions; data={cfg.data}"
          + (f", model={cfg.model}" if trainer.generator is not None else "")
          + (", online" if trainer.online is not None else "")
          + (f", penalty off: {', '.join(origin['penalty_off']) or 'none to turn off'}" if cfg.penalty == "off" else "")
          + f"); run folder {run_dir_of(cfg)}", flush=True)
    return trainer


def run(cfg) -> None:
    """One fine-tuning run of a composed and checked config."""
    summary = build(cfg).train(resume=cfg.resume, overwrite=cfg.overwrite)
    print(f"final normalised score {summary['final_score']:.1f} (return {summary['final_return']:.1f}); "
          f"mean of the last {min(10, summary['evaluations'])} evaluations {summary['last10_score']:.1f}")


@cli_main
def main(argv: list[str]) -> None:
    tool_runs("finetune", argv, __doc__, CONFIG_DIR, "finetune", run, check, output=run_dir_of)


if __name__ == "__main__":
    main()
