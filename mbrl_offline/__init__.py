"""mbrl_offline: offline model-based reinforcement learning in PyTorch.

>>> import mbrl_offline as m
>>> d = m.load_dataset("hopper-medium")      # bundled; also D4RL .hdf5 files and Minari ids
>>> d.normalized_score(d.episode_returns()).mean()

``import mbrl_offline`` loads neither torch nor any part of the library: the names below and the
sub-packages (``mbrl_offline.data``, ``mbrl_offline.models``, ...) load on first use. So a process can
apply its platform settings before torch loads (`mbrl_offline.platform`), as the command-line tools do.
"""

import importlib
import importlib.util

from mbrl_offline.errors import ConfigError, DatasetError, MbrlOfflineError

__version__ = "0.1.0"

# public name -> the module that defines it, imported on first use
_LAZY = {
    "ENVS": "mbrl_offline.data",
    "OfflineDataset": "mbrl_offline.data",
    "bundled_datasets": "mbrl_offline.data",
    "get_env_info": "mbrl_offline.data",
    "load_dataset": "mbrl_offline.data",
    "write_d4rl_hdf5": "mbrl_offline.data",
    "write_minari": "mbrl_offline.data",
    "build_run": "mbrl_offline.compose",
}


def __getattr__(name: str):
    """The public names of `_LAZY` and the package's modules (``mbrl_offline.utils``), loaded on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mbrl_offline' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["__version__", "build_run", "load_dataset", "bundled_datasets", "OfflineDataset", "get_env_info", "ENVS",
           "write_d4rl_hdf5", "write_minari", "MbrlOfflineError", "DatasetError", "ConfigError"]
