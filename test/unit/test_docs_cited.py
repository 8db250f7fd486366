"""Every document the code and the docs cite is in the repository: a docstring that
points a reader at ``docs/x.md`` or a ``*.md`` at the root that does not exist fails here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("python", "passes", "tools", "bench", "docs", "examples")
CITED = re.compile(r"(?<![\w/.-])((?:docs/|bench/)?[\w./-]*[A-Za-z]\.md)\b")


def _texts():
    yield ROOT / "README.md"
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md") and ".venv" not in path.parts:
                yield path


def _missing():
    missing = []
    for path in _texts():
        for cited in CITED.findall(path.read_text(errors="replace")):
            # bench.md and zoo.md are what ``python -m bench`` writes into bench/results/.
            candidates = [ROOT / cited, path.parent / cited,
                          ROOT / "bench/results" / Path(cited).name]
            if not any(c.exists() for c in candidates):
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    return missing


def test_every_cited_document_exists():
    assert _missing() == []


def test_the_checker_sees_a_missing_document():
    assert CITED.findall("see ARCHITECTURE.md and docs/knobs.md.") == [
        "ARCHITECTURE.md", "docs/knobs.md"]
