"""The report tool, run from a checkout: score tables and learning curves of runs and sweeps.

The installed package runs the same tool as ``mbrl-report`` or ``python -m mbrl_offline report``;
its code and its ``--help`` text are in mbrl_offline/tools/report.py.
"""
from mbrl_offline.tools.report import main

if __name__ == "__main__":
    main()
