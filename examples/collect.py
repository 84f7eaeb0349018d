"""The collect tool, run from a checkout: make D4RL-style datasets for an env.

The installed package runs the same tool as ``mbrl-collect`` or ``python -m mbrl_offline collect``;
its code and its ``--help`` text are in mbrl_offline/tools/collect.py.
"""
from mbrl_offline.tools.collect import main

if __name__ == "__main__":
    main()
