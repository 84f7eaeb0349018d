"""The train tool, run from a checkout: train an agent (with its generator) on a dataset.

The installed package runs the same tool as ``mbrl-train`` or ``python -m mbrl_offline train``;
its code and its ``--help`` text are in mbrl_offline/tools/train.py.
"""
from mbrl_offline.tools.train import main

if __name__ == "__main__":
    main()
