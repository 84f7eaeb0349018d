"""Weights & Biases (``logger=wandb``; ``pip install 'mbrl_offline[wandb]'``), beside TensorBoard.

Each training run is one W&B run: its config is the run's settings (``run.json``), its history the same
scalars as TensorBoard's (``train/critic_loss``, ``eval/normalized_score``, ... at the update count), and
when training ends, the report's learning-curve figure of the run (`mbrl_offline.report.plot_curves`) as
an image under ``figures/``. Its files go to ``<run_dir>/wandb``.

``mode: offline`` (the default) needs no account or network: ``wandb sync <run_dir>/wandb/offline-run-*``
uploads a run later. ``mode: online`` logs as it goes, after ``wandb login`` (or with ``WANDB_API_KEY``
set); ``disabled`` turns it off. The W&B run's id is kept in ``<run_dir>/wandb/run-id``, so a resumed
run (``resume=true``) continues the same W&B run. Unlike TensorBoard, W&B cannot drop what a stopped
session logged after its last checkpoint; those epochs then appear twice in its history, and
``metrics.jsonl`` stays the run's record. As in d3rlpy's and CORL's loggers, one W&B run per training
run, grouped by ``group`` (e.g. a sweep's name)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mbrl_offline.config import check_field_types
from mbrl_offline.errors import ConfigError
from mbrl_offline.registry import register_tracker
from mbrl_offline.trackers import Tracker

MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    """``trainer.logger`` for ``logger=wandb`` (mbrl_offline/configs/logger/wandb.yaml)."""

    name: str = "wandb"
    project: str = "mbrl_offline"  # the W&B project
    entity: Optional[str] = None  # the W&B user or team; null: the account's default
    group: Optional[str] = None  # groups runs in W&B's interface (e.g. a sweep or a grid)
    tags: tuple[str, ...] = ()
    run_name: Optional[str] = None  # the W&B run's display name; null: the run folder's name
    mode: str = "offline"  # offline (files only; `wandb sync` uploads them), online (after `wandb login`), disabled

    def __post_init__(self):
        check_field_types(self, "trainer.logger")
        if self.name != "wandb":
            raise ConfigError(f"a WandbConfig has name 'wandb', not '{self.name}'.")
        if self.mode not in MODES:
            raise ConfigError(f"trainer.logger.mode must be one of {', '.join(MODES)}, got '{self.mode}'.")
        if not self.project.strip():
            raise ConfigError("trainer.logger.project must name a W&B project, e.g. trainer.logger.project=hopper.")


@register_tracker
class WandbTracker(Tracker):
    name = "wandb"
    config_class = WandbConfig
    folder = "wandb"
    package = "wandb"
    summary = "Weights & Biases, offline by default, in <run_dir>/wandb (logger=wandb)"
    takes_figures = True

    def __init__(self, config: WandbConfig, run_dir: Path, run_info: dict, resume_step: Optional[int]):
        import wandb

        self.wandb = wandb
        folder = Path(run_dir) / self.folder
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run-id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        try:
            self.run = wandb.init(project=config.project, entity=config.entity, group=config.group,
                                  tags=list(config.tags) or None, name=config.run_name or Path(run_dir).name,
                                  mode=config.mode, dir=str(run_dir), id=run_id, resume="allow", config=run_info,
                                  settings=wandb.Settings(silent=True, console="off", save_code=False))
        except Exception as exc:  # W&B's own errors (no login for online mode, a bad entity): one line
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"logger=wandb could not start its run ({message}); for mode=online log in with "
                              f"`wandb login` (or set WANDB_API_KEY), or use trainer.logger.mode=offline.") from None
        id_file.write_text(run_id)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def log_figures(self, step: int, figures: list[Path]) -> None:
        self.run.log({f"figures/{Path(path).stem}": self.wandb.Image(str(path)) for path in figures}, step=step)

    def close(self, quiet: bool = False) -> None:
        run, self.run = getattr(self, "run", None), None
        if run is not None:
            try:
                run.finish(exit_code=1 if quiet else 0)
            except Exception:
                if not quiet:
                    raise


__all__ = ["WandbConfig", "WandbTracker"]
