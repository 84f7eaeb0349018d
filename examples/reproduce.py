"""The reproduce tool, run from a checkout: train algorithms x datasets x seeds at a budget and write the results page.

The installed package runs the same tool as ``mbrl-reproduce`` or ``python -m mbrl_offline reproduce``;
its code and its ``--help`` text are in mbrl_offline/tools/reproduce.py.
"""
from mbrl_offline.tools.reproduce import main

if __name__ == "__main__":
    main()
