"""Experiment trackers: where a run's scalars, settings and figures go besides ``metrics.jsonl``.

A tracker is one class behind one small interface (`Tracker`), registered with
`mbrl_offline.registry.register_tracker` where it is defined, with a dataclass of its settings and a
config file ``mbrl_offline/configs/logger/<name>.yaml``; each module here is one tracker, imported when
this package is. The library's own:

- ``tensorboard`` (`mbrl_offline.trackers.tensorboard`): event files in ``<run_dir>/tensorboard``, on by
  default (``trainer.tensorboard``);
- ``wandb`` (`mbrl_offline.trackers.wandb`): Weights & Biases, in offline mode by default, its files in
  ``<run_dir>/wandb`` (``logger=wandb``; ``pip install mbrl_offline[wandb]``).

A run's trackers are TensorBoard when ``trainer.tensorboard`` is true, plus the one ``trainer.logger``
names (``logger=wandb`` on the command line; ``{"name": "none"}`` by default). Each gets the same scalars
at each epoch (``group/name``: ``train/critic_loss``, ``eval/normalized_score``, ...; the step is the
update count), the run's settings (``run.json``) when it opens, and, for a tracker that takes figures
(``takes_figures``), the report's figures of the run when training ends (`mbrl_offline.report.plot_curves`).

Adding one (MLflow, say) is a module here, or in a plugin (`mbrl_offline.registry`), and its config file::

    @dataclass
    class MLflowConfig:
        name: str = "mlflow"
        experiment: str = "mbrl_offline"

    @register_tracker
    class MLflowTracker(Tracker):
        name, config_class, folder, package = "mlflow", MLflowConfig, "mlruns", "mlflow"
        summary = "MLflow tracking, in <run_dir>/mlruns"

        def __init__(self, config, run_dir, run_info, resume_step): ...
        def log_scalars(self, step, scalars): ...
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import ClassVar, Optional

from mbrl_offline import registry
from mbrl_offline.config import config_to_dataclass, did_you_mean
from mbrl_offline.errors import ConfigError


class Tracker:
    """The tracker role. Class attributes: ``name`` (``logger=<name>``), ``config_class`` (the dataclass of
    its settings, ``trainer.logger.*``, with a ``name`` field defaulting to ``name``), ``folder`` (what it
    writes in the run folder: deleted with the run's other files by ``overwrite=true``, and refused as an
    earlier run's like them), ``package`` (the module it imports, for the one-line error when it is not
    installed; None: none) and ``summary`` (one line for the docs). ``takes_figures``: whether it wants the
    run's figures at the end.

    Built once per training session, when the run's files are written (``resume_step``: the update count
    of the checkpoint being resumed, after which it should drop what it had logged, where it can; None
    for a new run). Each call may raise `mbrl_offline.errors.FileWriteError` for a failed write (a full
    disk), in one line."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    folder: ClassVar[str]
    package: ClassVar[Optional[str]] = None
    summary: ClassVar[str]
    takes_figures: ClassVar[bool] = False

    def __init__(self, config, run_dir: Path, run_info: dict, resume_step: Optional[int]):
        raise NotImplementedError

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """One epoch's scalars, ``group/name`` -> value, at update count ``step``."""
        raise NotImplementedError

    def log_figures(self, step: int, figures: list[Path]) -> None:
        """PNG files, named by their stem, at update count ``step`` (called only if ``takes_figures``)."""

    def close(self, quiet: bool = False) -> None:
        """Finish writing; ``quiet``: after another error, ignore a failed last write."""


registry.import_modules(__import__(__name__, fromlist=["_"]))  # every tracker module registers itself
TRACKERS = registry.TRACKERS


def tracker_config(settings) -> Optional[object]:
    """``trainer.logger``'s settings as the named tracker's config (None for ``{"name": "none"}``); an
    unknown name, an unknown or bad setting, or a tracker whose package is not installed is one
    `ConfigError` line that names the fix."""
    settings = dict(settings or {})
    name = settings.get("name", "none")
    known = registry.trackers()
    if name in (None, "none"):
        if set(settings) - {"name"}:
            raise ConfigError(f"trainer.logger has settings {sorted(set(settings) - {'name'})} but no tracker; "
                              f"choose one with logger=NAME ({', '.join(known)}).")
        return None
    if not isinstance(name, str) or name not in known:
        raise ConfigError(f"logger={name} is not a tracker; choose one of none, {', '.join(known)}"
                          f".{did_you_mean(str(name), list(known))}")
    cls = known[name]
    if cls.package is not None:
        try:
            importlib.import_module(cls.package)
        except ImportError:
            raise ConfigError(f"logger={name} needs the {cls.package} package, which is not installed; install it "
                              f"with pip install 'mbrl_offline[{name}]' (or pip install {cls.package}), or drop "
                              f"logger={name}.") from None
    return config_to_dataclass(cls.config_class, settings, "trainer.logger")


def run_trackers(tensorboard: bool, logger) -> list[tuple[type, object]]:
    """The trackers of a run, each as ``(class, its config)``: TensorBoard when ``tensorboard``, and
    ``logger``'s (`tracker_config`), once each."""
    chosen = [(TRACKERS["tensorboard"], TRACKERS["tensorboard"].config_class())] if tensorboard else []
    config = tracker_config(logger)
    if config is not None:
        chosen = [(cls, c) for cls, c in chosen if cls.name != config.name] + [(TRACKERS[config.name], config)]
    return chosen


def open_trackers(tensorboard: bool, logger, run_dir: Path, run_info: dict, resume_step: Optional[int]) -> list:
    """The run's trackers (`run_trackers`), open; if one fails to open, those opened are closed first."""
    opened = []
    try:
        for cls, config in run_trackers(tensorboard, logger):
            opened.append(cls(config, Path(run_dir), run_info, resume_step))
    except BaseException:
        for tracker in opened:
            tracker.close(quiet=True)
        raise
    return opened


def send_figures(trackers: list, run_dir: Path, step: int) -> None:
    """The report's figures of the run in ``run_dir`` (its learning curves, `mbrl_offline.report.plot_curves`)
    to those of ``trackers`` that take figures, at update count ``step``; made in a temporary folder, and
    only if one does."""
    takers = [tracker for tracker in trackers if tracker.takes_figures]
    if not takers:
        return
    import tempfile

    from mbrl_offline.report import plot_curves, read_run

    with tempfile.TemporaryDirectory() as folder:
        figures = plot_curves([read_run(Path(run_dir))], Path(folder), prefix="curves")
        for tracker in takers:
            tracker.log_figures(step, figures)


def tracker_folders() -> tuple[str, ...]:
    """What every registered tracker writes in a run folder (`Tracker.folder`)."""
    return tuple(cls.folder for cls in registry.trackers().values())


__all__ = ["Tracker", "TRACKERS", "tracker_config", "run_trackers", "open_trackers", "send_figures", "tracker_folders"]
