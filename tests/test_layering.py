"""The library's layering: no import cycle between its parts, and the command-line layer (`cli`, the
tools in ``tools/`` and ``experiments/``, ``__main__``) is never imported by the library.

Every import statement counts, module-level or inside a function (a function-local import hides a
cycle, it does not remove it). A part is a sub-package (``data``, ``models``, ``generators``,
``algorithms``) or a top-level module (``trainer``, ``cli``, ...); the package's own ``__init__`` is
the public facade and may import any part.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import mbrl_offline

PACKAGE = Path(mbrl_offline.__file__).parent
COMMAND_LINE = {"cli", "tools", "experiments", "__main__"}  # the parts that may import Hydra and every other part


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "mbrl_offline" else None


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """part -> {imported part: [files that import it]}, over every import statement."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for file in sorted(package.rglob("*.py")):
        rel = file.relative_to(package.parent).with_suffix("").parts
        module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        source = part_of(module)
        if source is None:  # mbrl_offline/__init__.py
            continue
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + ([f"{node.module}.{a.name}" for a in node.names]
                                           if node.module == "mbrl_offline" else [])
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                raise AssertionError(f"{file}: relative import; the library imports by absolute name")
            else:
                continue
            for target in targets:
                dest = part_of(target)
                if dest and dest != source:
                    graph[source][dest].append(file.name)
    return graph


def cycles(graph) -> list[list[str]]:
    """The strongly connected components with more than one part (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_the_library_parts():
    graph = import_graph()
    found = cycles(graph)
    detail = "; ".join(
        ", ".join(f"{a} -> {b} ({', '.join(sorted(set(graph[a][b])))})" for a in c for b in c if b in graph[a])
        for c in found)
    assert not found, f"import cycles between parts of mbrl_offline: {detail}"


def test_the_library_never_imports_the_command_line_layer():
    importers = sorted(f"{part} -> {', '.join(sorted(COMMAND_LINE & set(deps)))}"
                       for part, deps in import_graph().items() if part not in COMMAND_LINE and COMMAND_LINE & set(deps))
    assert importers == [], f"these parts import the command-line layer: {importers}"


def test_the_check_finds_a_cycle(tmp_path):
    """The check itself: a two-part cycle hidden in a function-local import is reported."""
    pkg = tmp_path / "mbrl_offline"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("def f():\n    from mbrl_offline.models import m\n")
    (pkg / "models.py").write_text("from mbrl_offline.data import f\n")
    (pkg / "trainer.py").write_text("import mbrl_offline.models\n")
    graph = import_graph(pkg)
    assert cycles(graph) == [["data", "models"]]
    assert dict(graph["trainer"]) == {"models": ["trainer.py"]}
