"""The dynamics-error tool, run from a checkout: PGD's dynamics error against a world model's (an experiment).

The installed package runs the same tool as ``mbrl-dynamics-error`` or ``python -m mbrl_offline dynamics-error``;
its code and its ``--help`` text are in mbrl_offline/experiments/dynamics_error.py.
"""
from mbrl_offline.experiments.dynamics_error import main

if __name__ == "__main__":
    main()
