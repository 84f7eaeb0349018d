"""The evaluate tool, run from a checkout: evaluate a trained policy in the real env.

The installed package runs the same tool as ``mbrl-evaluate`` or ``python -m mbrl_offline evaluate``;
its code and its ``--help`` text are in mbrl_offline/tools/evaluate.py.
"""
from mbrl_offline.tools.evaluate import main

if __name__ == "__main__":
    main()
