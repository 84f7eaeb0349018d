"""``python -m mbrl_offline <tool> [setting=value ...]``: runs one of the command-line tools.

The tools are those of `mbrl_offline.cli.TOOLS` (the same as the ``mbrl-<tool>`` console scripts);
``python -m mbrl_offline --help`` lists them, and ``python -m mbrl_offline <tool> --help`` describes one.
A missing tool or a name that is not a tool is one ``error: ...`` line and exit status 2.
"""
from __future__ import annotations

import importlib
import sys

from mbrl_offline.cli import MODULE_PROG, TOOLS
from mbrl_offline.config import did_you_mean


def usage() -> str:
    """The list of tools, for ``--help`` and for a call without a tool."""
    width = max(len(name) for name in TOOLS)
    lines = [f"usage: {MODULE_PROG} <tool> [--help] [--cfg job] [setting=value ...]", "",
             "Tools (each also a console script, mbrl-<tool>):"]
    lines += [f"  {name:<{width}}  {tool.summary}" for name, tool in TOOLS.items()]
    lines += ["", f"{MODULE_PROG} <tool> --help describes a tool and its settings."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0)
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name not in TOOLS:
        problem = f"unknown tool '{name}'.{did_you_mean(name, TOOLS)}" if name else "name a tool to run."
        print(f"error: {problem} Tools: {', '.join(TOOLS)} (see {MODULE_PROG} --help).", file=sys.stderr)
        sys.exit(2)
    # the tool's usage line and messages name it as it was run (`mbrl_offline.cli.invoked_as`)
    sys.argv = [f"{MODULE_PROG} {name}", *rest]
    importlib.import_module(TOOLS[name].module).main(rest)


if __name__ == "__main__":
    main()
