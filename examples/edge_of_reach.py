"""The edge-of-reach tool, run from a checkout: MOPO and RAVL with learned and true dynamics (an experiment).

The installed package runs the same tool as ``mbrl-edge-of-reach`` or ``python -m mbrl_offline edge-of-reach``;
its code and its ``--help`` text are in mbrl_offline/experiments/edge_of_reach.py.
"""
from mbrl_offline.experiments.edge_of_reach import main

if __name__ == "__main__":
    main()
