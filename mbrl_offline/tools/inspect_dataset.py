"""Load a dataset, check it, print its summary, optionally export it to D4RL HDF5.

    mbrl-inspect dataset=hopper-medium
    mbrl-inspect dataset=mbrl/hopper/medium-v0 out=hopper_medium.hdf5
    mbrl-inspect dataset=data/my_run.hdf5 env=hopper
    mbrl-inspect env=walker2d

``dataset=`` is a bundled name, a D4RL .hdf5 file, a Minari id or a Minari dataset folder. ``env=`` picks
the env as for train.py (mbrl_offline/configs/env/): it says which env a D4RL file is for when its name
does not, and without ``dataset=`` the env's dataset (``env.dataset``, or its default) is inspected.
``out=`` also exports the dataset to a D4RL-format HDF5 file (``overwrite=true`` replaces one). Settings:
mbrl_offline/configs/inspect_dataset.yaml; ``--help`` lists them; ``--cfg job`` prints the composed config
and loads nothing. Paths may hold spaces and any characters: ``out='exports/données 1.hdf5'``.
"""
import json

from mbrl_offline.cli import cli_main, tool_config
from mbrl_offline.config import CONFIG_DIR


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline import load_dataset, write_d4rl_hdf5
    from mbrl_offline.data.envs import get_env_info
    from mbrl_offline.errors import ConfigError

    cfg = tool_config(argv, __doc__, CONFIG_DIR, "inspect_dataset")
    env = cfg.env.name if cfg.get("env") else None
    spec = cfg.dataset or (env and (cfg.env.dataset or get_env_info(env).default_dataset))
    if not spec:
        raise ConfigError("give the dataset to inspect: dataset=<bundled name, D4RL .hdf5 file, Minari id or "
                          "folder>, or env=<name> for the env's default dataset.")
    dataset = load_dataset(spec, env=env)
    print(json.dumps(dataset.summary(), indent=2))
    if dataset.metadata:
        print("provenance:", json.dumps(dataset.metadata, indent=2, default=str))
    if cfg.out:
        path = write_d4rl_hdf5(dataset, cfg.out, overwrite=cfg.overwrite)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
