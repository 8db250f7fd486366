"""opfuse's analyses keep no MLIR context alive after a compile.

What is derived from uniqued types, maps and attributes (bytes, shapes, loop dims) is
memoized per pipeline run, in the op-description cache: a process-wide memo keyed by
those objects held each one's context, so a process that compiles graph after graph (a
torch.compile server, the benchmark) kept every module it ever parsed (~10 MB per
10,000-op graph).
"""

from __future__ import annotations

import gc

from mlir import ir

import opfuse
from opfuse.frontends.builder.graphs import graphs


def test_compiles_leave_no_context_behind():
    text = graphs(scale=16)["g4_layernorm"].to_mlir()
    opfuse.compile(text, backend="cpu")  # first-use effects (registries, loaded dialects)
    gc.collect()
    before = ir.Context._get_live_count()
    for _ in range(3):
        exe = opfuse.compile(text, backend="cpu")
        del exe
    gc.collect()
    assert ir.Context._get_live_count() == before
