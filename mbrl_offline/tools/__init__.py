"""The library's command-line tools, one module each with ``main(argv=None)``; each module's docstring is
its ``--help`` text. `mbrl_offline.cli.TOOLS` lists them, with the experiments' (`mbrl_offline.experiments`):
each runs as a console script (``mbrl-train``), as ``python -m mbrl_offline train`` and, in a checkout, as
``python examples/train.py``.

The modules import torch and the library's models only inside ``main``, after the platform settings are
applied (`mbrl_offline.cli.cli_main`), so that ``MBRL_OFFLINE_MKL_AVX512=1`` acts before torch loads.
"""
