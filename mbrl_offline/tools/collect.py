"""Make D4RL-style datasets for an env: `mbrl-collect env=hopper [collect.<setting>=<value> ...]`.

Trains a SAC behaviour policy online and writes random / medium / medium-replay / expert / medium-expert
datasets as Minari datasets (and D4RL HDF5 files in the run folder). Interrupt it at any time; the same
command resumes. Settings: mbrl_offline/configs/collect.yaml (``env=`` picks the env, as for train.py;
every ``collect.*`` setting is a field of CollectConfig in mbrl_offline/collect.py).

``--help`` lists them; ``--cfg job`` prints the composed config and collects nothing. Paths may hold
spaces and any characters: ``collect.run_dir='runs/données 1'``.
"""

from mbrl_offline.cli import cli_main, tool_config
from mbrl_offline.config import CONFIG_DIR


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline.collect import CollectConfig, collect
    from mbrl_offline.config import config_to_dataclass
    from mbrl_offline.data.minari_io import read_minari

    cfg = tool_config(argv, __doc__, CONFIG_DIR, "collect")
    config = config_to_dataclass(CollectConfig, {**cfg.collect, "env": cfg.env.name}, "collect")
    written = collect(config)
    print(f"\n{'level':<15} {'transitions':>11} {'episodes':>8} {'return':>9} {'score':>6}  location")
    for level, path in written.items():
        meta = read_minari(path).metadata
        print(f"{level:<15} {meta['transitions']:>11} {meta['episodes']:>8} {meta['data_return_mean']:>9.1f} "
              f"{meta['data_normalized_score_mean']:>6.1f}  {path}")


if __name__ == "__main__":
    main()
