"""The library's exceptions. Command-line entry points print these as one line and exit non-zero."""


class MbrlOfflineError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""


class DatasetError(MbrlOfflineError, ValueError):
    """A dataset that is missing, unreadable or malformed."""


class ConfigError(MbrlOfflineError, ValueError):
    """An unknown name or a bad value in a configuration."""


class TrainingDiverged(MbrlOfflineError, RuntimeError):
    """Losses or values became non-finite or exploded; the last good checkpoint is kept."""


class CheckpointError(MbrlOfflineError, ValueError):
    """A checkpoint is missing, unreadable, or does not belong to the run being resumed."""
