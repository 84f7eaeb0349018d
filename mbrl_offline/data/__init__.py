"""Datasets: sources, the env registry (with termination functions) and export. Collecting new datasets
with a trained SAC is `mbrl_offline.collect`, a layer above the agents."""
from mbrl_offline.data.d4rl_hdf5 import read_d4rl_hdf5, write_d4rl_hdf5
from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.data.envs import ENVS, EnvInfo, get_env_info
from mbrl_offline.data.minari_io import read_minari, write_minari
from mbrl_offline.data.sources import bundled_datasets, load_dataset

__all__ = ["OfflineDataset", "load_dataset", "bundled_datasets", "read_d4rl_hdf5", "write_d4rl_hdf5",
           "read_minari", "write_minari", "ENVS", "EnvInfo", "get_env_info"]
