"""The inspect tool, run from a checkout: check and summarise a dataset, export it to D4RL HDF5.

The installed package runs the same tool as ``mbrl-inspect`` or ``python -m mbrl_offline inspect``;
its code and its ``--help`` text are in mbrl_offline/tools/inspect_dataset.py.
"""
from mbrl_offline.tools.inspect_dataset import main

if __name__ == "__main__":
    main()
