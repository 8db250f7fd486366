"""GPU kernels of graphs with booleans and sources, without a GPU.

Booleans are i8 tensors (0/1) in device memory, never i1: comparisons widen their i1 with
``arith.extui`` inside the kernel, ``where`` narrows it back. Checked two ways, as in
test_codegen.py: the kernels lower to PTX for sm_90 (assembled with 0 spills when ptxas is
installed) with no i1 memref among their arguments, and the outlined kernels run in the
lockstep emulator (:mod:`opfuse.testing.emulator.emulate`) against the builder's numpy reference
(f32: rtol 1e-4, atol 1e-5; i8 exactly, through the same comparison).
"""

from __future__ import annotations

import re

import pytest

from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.gpu.compiler import compile_module

from test_codegen_common import assert_close, compile_cpu

HAVE_PTXAS = ptxas.find_ptxas() is not None


def _select() -> Graph:
    """Comparisons, where, logical ops and casts over a bool input; no iota."""
    g = Graph("select")
    x, a, m = g.input("x", (6, 40)), g.input("a", (40,)), g.input("m", (6, 40), "i8")
    keep = g.logical_or(g.logical_and(m, g.gt(x, a)), g.le(x, -0.5))
    s = g.softmax(g.where(keep, x, float("-inf")))
    g.output(s, keep, g.where(g.logical_not(m), x * 2.0, a), x * g.cast(g.ne(m, 0), "f32"))
    return g


def _sources() -> Graph:
    """iota: a causal mask over (2, 3, 8, 8) scores, ``x + arange``, a tril from 1-D aranges."""
    g = Graph("sources")
    x, y = g.input("x", (2, 3, 8, 8)), g.input("y", (4, 8))
    rows, cols = g.iota(x.shape, -2, dtype="i64"), g.iota(x.shape, -1, dtype="i64")
    causal = g.softmax(g.where(g.ge(rows, cols), x, float("-inf")))
    tril = g.reshape(g.iota((8,), 0, dtype="i64"), (1, 8)) - g.reshape(
        g.iota((4,), 0, dtype="i64"), (4, 1)
    )
    g.output(causal, y + g.iota((8,), 0, start=1.0, step=0.5), g.where(g.le(tril, 0), y, 0.0))
    return g


def _emulate(graph: Graph, fusion: bool) -> None:
    exe = compile_cpu(graph, fusion=fusion)
    inputs = graph.random_inputs(3)
    args = [inputs[t.name] for t in graph.inputs]
    program = compile_module(exe._source, lower=False)
    assert program.kernels and not program.notes  # every group had its kind's emitter
    assert_close(emulate.run_program(program, args), tuple(graph.reference(*args)))


@pytest.mark.parametrize("fusion", [True, False])
def test_emulated_boolean_kernels_match_numpy(fusion: bool):
    _emulate(_select(), fusion)


# Regression: the emulator could not read the non-splat lane offsets
# (dense<[0, 1, 2, 3]> : vector<4xindex>) of a vectorized linalg.index.
@pytest.mark.parametrize("fusion", [True, False])
def test_emulated_iota_kernels_match_numpy(fusion: bool):
    _emulate(_sources(), fusion)


@pytest.mark.parametrize("make", [_select, _sources])
def test_boolean_and_iota_kernels_lower_to_ptx(make):
    program = compile_module(compile_cpu(make())._source, targets=("sm_90",))
    assert program.kernels and not program.notes
    # no i1 memref: booleans cross as i8 (i1 only in registers: vector<4xi1> selects)
    assert not re.search(r"memref<(\d+x)*i1[,>]", program.kernels_ir)
    if make is _select:  # the bool input and the bool output are i8 kernel arguments
        assert re.search(r"memref<(\d+x)*i8[,>]", program.kernels_ir)
    for k in program.kernels.values():
        assert f".entry {k.entry}(" in k.ptx["sm_90"]
        if HAVE_PTXAS:
            res = k.resources["sm_90"]
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, res)
