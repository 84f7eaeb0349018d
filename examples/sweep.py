"""The sweep tool, run from a checkout: tune an agent's settings with Optuna.

The installed package runs the same tool as ``mbrl-sweep`` or ``python -m mbrl_offline sweep``;
its code and its ``--help`` text are in mbrl_offline/tools/sweep.py.
"""
from mbrl_offline.tools.sweep import main

if __name__ == "__main__":
    main()
