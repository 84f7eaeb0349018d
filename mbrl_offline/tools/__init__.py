"""The command-line tools, one module each with ``main(argv=None)``; each module's docstring is its
``--help`` text. `mbrl_offline.cli.TOOLS` lists them: each runs as a console script (``mbrl-train``), as
``python -m mbrl_offline train`` and, in a checkout, as ``python examples/train.py``.
"""
