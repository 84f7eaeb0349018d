"""The bandit tool, run from a checkout: NEUBAY's bandit illustration (an experiment).

The installed package runs the same tool as ``mbrl-bandit`` or ``python -m mbrl_offline bandit``;
its code and its ``--help`` text are in mbrl_offline/experiments/bandit.py.
"""
from mbrl_offline.experiments.bandit import main

if __name__ == "__main__":
    main()
