"""Load a dataset, check it, print its summary, optionally export it to D4RL HDF5.

    python examples/inspect_dataset.py dataset=hopper-medium
    python examples/inspect_dataset.py dataset=mbrl/hopper/medium-v0 out=hopper_medium.hdf5
"""
import json

import hydra
from omegaconf import DictConfig

from mbrl_offline import load_dataset, write_d4rl_hdf5
from mbrl_offline.cli import cli_main


@hydra.main(config_path="../configs", config_name="inspect_dataset", version_base="1.3")
@cli_main
def main(cfg: DictConfig) -> None:
    dataset = load_dataset(cfg.dataset, env=cfg.env)
    print(json.dumps(dataset.summary(), indent=2))
    if dataset.metadata:
        print("provenance:", json.dumps(dataset.metadata, indent=2, default=str))
    if cfg.out:
        path = write_d4rl_hdf5(dataset, cfg.out, overwrite=cfg.overwrite)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
