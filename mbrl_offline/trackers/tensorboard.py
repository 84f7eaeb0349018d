"""TensorBoard: event files in ``<run_dir>/tensorboard``, on by default (``trainer.tensorboard``).

On resume the writer purges what the stopped session logged after the checkpoint being resumed
(``purge_step``), so the curves read as if the run had never stopped. It takes no figures: TensorBoard
draws its own curves from the scalars."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mbrl_offline.config import check_field_types
from mbrl_offline.errors import FileWriteError, MbrlOfflineError
from mbrl_offline.registry import register_tracker
from mbrl_offline.trackers import Tracker
from mbrl_offline.utils import write_failure_reason


@dataclass
class TensorBoardConfig:
    """No settings: the event files go to ``<run_dir>/tensorboard``."""

    name: str = "tensorboard"

    def __post_init__(self):
        check_field_types(self, "trainer.logger")


@register_tracker
class TensorBoardTracker(Tracker):
    """TensorBoard's ``SummaryWriter``. It writes its event files from a thread; a failed write there (a
    full disk) is the same one-line `FileWriteError`, raised in the training thread, and the thread prints
    no traceback of its own."""

    name = "tensorboard"
    config_class = TensorBoardConfig
    folder = "tensorboard"
    package = "tensorboard"
    summary = "TensorBoard event files in <run_dir>/tensorboard (on by default: trainer.tensorboard)"

    def __init__(self, config: TensorBoardConfig, run_dir: Path, run_info: dict, resume_step: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        _quiet_tensorboard_threads()
        self.writer = self._write(SummaryWriter, str(self.run_dir / self.folder), purge_step=resume_step)

    def _write(self, call, *args, **kwargs):
        """``call(*args, **kwargs)``, a TensorBoard write, with a failed write as one `FileWriteError` line."""
        try:
            return call(*args, **kwargs)
        except (OSError, RuntimeError) as exc:
            reason = write_failure_reason(exc, self.run_dir if self.run_dir.exists() else None)
            if reason is None:
                raise
            raise FileWriteError(f"cannot write the TensorBoard log in {self.run_dir / self.folder}: {reason}. "
                                 f"Check the free disk space, or set trainer.tensorboard=false.") from None

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self._write(self.writer.add_scalar, tag, value, step)
        self._write(self.writer.flush)

    def close(self, quiet: bool = False) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                self._write(writer.close)
            except MbrlOfflineError:
                if not quiet:
                    raise


def _quiet_tensorboard_threads() -> None:
    """Let TensorBoard's writer thread fail without printing a traceback: it keeps the exception, and
    the training thread raises it at its next write (`TensorBoardTracker._write`). Other threads' errors
    are printed as before."""
    import threading

    previous = threading.excepthook
    if getattr(previous, "_mbrl_offline", False):
        return

    def hook(args):
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, (OSError, RuntimeError)):
            return
        previous(args)

    hook._mbrl_offline = True
    threading.excepthook = hook


__all__ = ["TensorBoardConfig", "TensorBoardTracker"]
