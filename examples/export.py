"""The export tool, run from a checkout: a trained policy as a TorchScript or ONNX file.

The installed package runs the same tool as ``mbrl-export`` or ``python -m mbrl_offline export``;
its code and its ``--help`` text are in mbrl_offline/tools/export.py.
"""
from mbrl_offline.tools.export import main

if __name__ == "__main__":
    main()
