"""The fine-tuning tool, run from a checkout: a trained agent trained further on new data.

The installed package runs the same tool as ``mbrl-finetune`` or ``python -m mbrl_offline finetune``;
its code and its ``--help`` text are in mbrl_offline/tools/finetune.py.
"""
from mbrl_offline.tools.finetune import main

if __name__ == "__main__":
    main()
