"""Make D4RL-style datasets for an env: `python examples/collect.py env=hopper`.

Trains a SAC behaviour policy online and writes random / medium / medium-replay / expert /
medium-expert datasets as Minari datasets (and D4RL HDF5 files in the run folder). Interrupt it
at any time; the same command resumes. Settings: configs/collect.yaml.
"""
import hydra
from omegaconf import DictConfig

from mbrl_offline.cli import cli_main
from mbrl_offline.config import config_to_dataclass
from mbrl_offline.collect import CollectConfig, collect


@hydra.main(config_path="../configs", config_name="collect", version_base="1.3")
@cli_main
def main(cfg: DictConfig) -> None:
    config = config_to_dataclass(CollectConfig, {**cfg.collect, "env": cfg.env.name}, "collect")
    written = collect(config)
    print(f"\n{'level':<15} {'transitions':>11} {'episodes':>8} {'return':>9} {'score':>6}  location")
    from mbrl_offline.data.minari_io import read_minari

    for level, path in written.items():
        meta = read_minari(path).metadata
        print(f"{level:<15} {meta['transitions']:>11} {meta['episodes']:>8} {meta['data_return_mean']:>9.1f} "
              f"{meta['data_normalized_score_mean']:>6.1f}  {path}")


if __name__ == "__main__":
    main()
