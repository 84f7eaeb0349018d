"""The docs' tables of agents and generators, written from the registries (`mbrl_offline.registry`).

    python -m mbrl_offline.doc_tables            # rewrite the generated parts of README.md and docs/*.md
    python -m mbrl_offline.doc_tables --check    # exit 1, naming the files, where one is stale

A generated part sits between ``<!-- generated: NAME -->`` and ``<!-- /generated -->`` lines; the rest
of each file is left as written. ``tests/test_docs_tables.py`` fails when a generated part is stale,
so a new family's row appears in the docs the day it is registered, from its class's ``summary``,
``defaults_from`` and declarations.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from mbrl_offline.config_files import registered_families

ROOT = Path(__file__).resolve().parent.parent  # the repository (README.md, docs/)
PATTERN = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


def agents_table() -> str:
    """One row per registered agent: its name, what it is, where its defaults come from, what it
    learns from and the generator it was published with."""
    rows = ["| `algo=` | what it is | defaults from | learns from | published generator |", "|---|---|---|---|---|"]
    for name, (agent_cls, _) in registered_families()[0].items():
        kind = agent_cls.published_generator().kind
        generator = "none (the dataset alone)" if kind == "none" else f"`{kind}`"
        rows.append(f"| `{name}` | {agent_cls.summary} | {agent_cls.defaults_from} | {agent_cls.consumes} | {generator} |")
    return "\n".join(rows) + "\n"


def generators_table() -> str:
    """One row per way to choose a generator: unset, none, each algorithm's published one, each kind."""
    agents, generators = registered_families()
    names = ", ".join(f"`{name}`" for name in agents)
    rows = ["| `generator=` | what it gives | produces |", "|---|---|---|",
            "| (not set) | the generator the algorithm was published with | |",
            "| `none` | no synthetic data: every batch is real | |",
            f"| {names} | that algorithm's published generator, for another agent | |"]
    for kind, (_, generator_cls) in generators.items():
        if generator_cls is not None:
            rows.append(f"| `{kind}` | {generator_cls.summary} | {generator_cls.produces} |")
    return "\n".join(rows) + "\n"


def registry_lists() -> str:
    """The registries' names, for the architecture page."""
    agents, generators = registered_families()
    return (f"- `ALGORITHMS` (`algo=`): {', '.join(f'`{n}`' for n in agents)}\n"
            f"- `GENERATORS` (`generator=`): {', '.join(f'`{k}`' for k in generators)}\n")


TABLES = {"agents": agents_table, "generators": generators_table, "registries": registry_lists}


def documents(root: Path = ROOT) -> list[Path]:
    """The files that may hold generated parts: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(text: str) -> str:
    """``text`` with every generated part rewritten; an unknown part's name raises `KeyError`."""
    return PATTERN.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(4), text)


def stale(root: Path = ROOT) -> list[Path]:
    """The documents whose generated parts differ from what the registries give now."""
    return [path for path in documents(root) if path.is_file()
            and render(text := path.read_text(encoding="utf-8")) != text]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository's root (default: this checkout)")
    args = parser.parse_args(argv)
    paths = stale(args.root)
    if args.check:
        for path in paths:
            print(f"stale: {path} (run python -m mbrl_offline.doc_tables)", file=sys.stderr)
        return 1 if paths else 0
    for path in paths:
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
