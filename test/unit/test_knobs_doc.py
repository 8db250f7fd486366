"""docs/knobs.md is the page config.py generates: a variable declared without the page
regenerated fails here."""

from pathlib import Path

from opfuse import config

DOC = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"


def test_the_knobs_page_is_current():
    assert DOC.read_text() == config.knobs_markdown(), (
        "docs/knobs.md is stale: python -m opfuse.config > docs/knobs.md")


def test_every_declared_variable_has_a_row():
    page = config.knobs_markdown()
    assert all(f"| `{var.name}` |" in page for var in config.declared())
    assert len(config.declared()) >= 10
