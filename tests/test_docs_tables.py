"""The docs' tables of agents and generators are written from the registries (`mbrl_offline.doc_tables`):
stale ones fail here, and a new family's row appears the day it is registered."""
from pathlib import Path

from mbrl_offline import doc_tables, registry

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_tables_are_current():
    stale = doc_tables.stale(ROOT)
    assert not stale, f"stale generated tables in {[str(p) for p in stale]}: run python -m mbrl_offline.doc_tables"


def test_a_new_agent_gets_a_row(monkeypatch):
    from mbrl_offline.algorithms import ALGORITHMS, IQL, IQLConfig

    class Renamed(IQL):
        name, summary, defaults_from = "iql-copy", "IQL under another name", "this test"

    monkeypatch.setitem(ALGORITHMS, "iql-copy", (Renamed, IQLConfig))
    table = doc_tables.agents_table()
    assert "| `iql-copy` | IQL under another name | this test | transitions | none (the dataset alone) |" in table
    assert len(table.splitlines()) == 2 + len(registry.agents())
    assert doc_tables.stale(ROOT)  # README's table now lacks that row


def test_every_registered_agent_has_a_section_in_the_algorithms_page():
    text = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    missing = [name for name in registry.agents() if f"`{name}`" not in text]
    assert not missing, f"docs/algorithms.md does not describe {missing}"
