"""opfuse's MLIR contexts load only the dialects opfuse builds ops in (ir.LOADED_DIALECTS).

Building an op of a registered but unloaded dialect aborts the whole process (LLVM ERROR
"created with unregistered dialect"), so every dialect whose Python builders opfuse
imports, or whose ops it creates by name, must be in the list. This reads the sources
for them; the parser loads the rest on first use, which the last test shows.
"""

from __future__ import annotations

import re
from pathlib import Path

from opfuse.ir import LOADED_DIALECTS, make_context, parse_module

ROOT = Path(__file__).parents[2]
SOURCES = [p for d in ("python/opfuse", "passes", "tools") for p in (ROOT / d).rglob("*.py")]
IMPORT = re.compile(r"from mlir\.dialects import ([\w, ()\n]+?)(?:\n\S|\n\n|$)")
DOTTED = re.compile(r"mlir\.dialects\.(\w+)")
CREATED = re.compile(r"Operation\.create\(\s*f?\"(\w+)\.")
#: imported for what they run, not for ops they build: the transform interpreter applies
#: scripts that were parsed (so their dialect is loaded by then)
NOT_BUILDERS = {"transform"}


def _dialects_used() -> dict[str, str]:
    used: dict[str, str] = {}
    for path in SOURCES:
        text = path.read_text()
        names = [n for m in IMPORT.finditer(text) for n in re.findall(r"\w+", m.group(1))]
        names += DOTTED.findall(text) + CREATED.findall(text)
        for name in names:
            name = name.removesuffix("_d")
            if name not in ("as", "import") and not name.startswith("_"):
                used.setdefault(name, str(path.relative_to(ROOT)))
    return used


def test_every_dialect_opfuse_builds_ops_in_is_loaded():
    used = _dialects_used()
    assert {"linalg", "arith", "gpu", "llvm"} <= set(used)  # the scan finds them at all
    missing = {n: where for n, where in used.items()
               if n not in LOADED_DIALECTS and n not in NOT_BUILDERS}
    assert not missing, f"add to ir.LOADED_DIALECTS (first used in): {missing}"


def test_other_dialects_load_when_parsed():
    ctx = make_context()
    loaded = set(LOADED_DIALECTS)
    text = """
    module attributes {transform.with_named_sequence} {
      transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
        transform.yield
      }
    }"""
    assert "transform" not in loaded
    module = parse_module(text, ctx)
    assert module.operation.verify()
