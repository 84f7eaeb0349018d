"""mbrl_offline: offline model-based reinforcement learning in PyTorch.

>>> import mbrl_offline as m
>>> d = m.load_dataset("hopper-medium")      # bundled; also D4RL .hdf5 files and Minari ids
>>> d.normalized_score(d.episode_returns()).mean()
"""

__version__ = "0.1.0"

# before anything loads torch: MBRL_OFFLINE_MKL_AVX512=1 must act before MKL is linked (see the module)
from mbrl_offline import mkl_avx512 as _mkl_avx512  # noqa: E402

_mkl_avx512.apply_environment()

from mbrl_offline.data import (  # noqa: E402
    ENVS,
    OfflineDataset,
    bundled_datasets,
    get_env_info,
    load_dataset,
    write_d4rl_hdf5,
    write_minari,
)
from mbrl_offline.errors import ConfigError, DatasetError, MbrlOfflineError  # noqa: E402



def __getattr__(name: str):
    """``build_run`` (`mbrl_offline.compose`), loaded on first use: the agents and torch load with it."""
    if name == "build_run":
        from mbrl_offline.compose import build_run

        return build_run
    raise AttributeError(f"module 'mbrl_offline' has no attribute '{name}'")


__all__ = ["__version__", "build_run", "load_dataset", "bundled_datasets", "OfflineDataset", "get_env_info", "ENVS",
           "write_d4rl_hdf5", "write_minari", "MbrlOfflineError", "DatasetError", "ConfigError"]
