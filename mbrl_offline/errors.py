"""The library's exceptions. Command-line entry points print these as one line and exit non-zero."""


class MbrlOfflineError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""


class DatasetError(MbrlOfflineError, ValueError):
    """A dataset that is missing, unreadable or malformed."""


class DatasetWarning(UserWarning):
    """A dataset that loads but looks wrong (actions far outside the env's bounds)."""


class ConfigError(MbrlOfflineError, ValueError):
    """An unknown name or a bad value in a configuration."""


class TrainingDiverged(MbrlOfflineError, RuntimeError):
    """Losses or values became non-finite or exploded; the last good checkpoint is kept."""


class CheckpointError(MbrlOfflineError, ValueError):
    """A checkpoint is missing, unreadable, or does not belong to the run being resumed."""


class InputError(MbrlOfflineError, ValueError):
    """An argument of a library call with the wrong shape or values (observations of the wrong width,
    a NaN observation)."""


class InputTypeError(MbrlOfflineError, TypeError):
    """An argument of a library call of the wrong type (a numpy array where a dataset is expected)."""


class FileWriteError(MbrlOfflineError):
    """A file the library writes could not be written (a full disk, a folder that cannot be written); the
    old file, if any, is kept and no partial file is left (`mbrl_offline.utils.atomic_path`). ``path``
    and ``reason`` say which file and why."""

    path = None
    reason = ""


class NotFittedError(MbrlOfflineError, RuntimeError):
    """A model asked to predict before it was fitted or loaded."""


def type_name(value) -> str:
    """``value``'s type as error messages name it: ``str``, ``numpy.ndarray``."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def read_library_text(path, error: type, fix: str, *, what: str = "", folder: str = "") -> str:
    """The text of a file the library wrote, or ``error`` raised in one line that names ``path`` and
    the problem, ending with ``fix``. A missing file raises ``FileNotFoundError`` unless ``what``
    names the thing the file completes (``"...is missing, so <parent> is not a complete <what>"``);
    ``folder`` is the message for a folder where the file should be (default: the OS's reason)."""
    from pathlib import Path

    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not what:
            raise
        raise error(f"{path} is missing, so {path.parent} is not a complete {what}; {fix}.") from None
    except UnicodeDecodeError:
        raise error(f"{path} is not text (not UTF-8); {fix}.") from None
    except IsADirectoryError as exc:
        if folder:
            raise error(f"{path} {folder}.") from None
        raise error(f"cannot read {path} ({exc.strerror or exc}); {fix}.") from None
    except OSError as exc:
        raise error(f"cannot read {path} ({exc.strerror or exc}); {fix}.") from None
