"""Column reductions (opfuse-fuse-columns, ``backends/gpu/emit/columns.py``): a reduction over a
non-innermost axis with its consumers and broadcast producers as one ``columns`` kernel.

Each graph is checked against numpy: the builder's reference, the fused and the unfused
CPU programs, and the GPU kernels in the emulator (race check on); the kernel is built by
the column emitter (not the fallback) and assembles without spills where ptxas is found.
Small shapes with a partial last block (64-thread blocks for 40 or 72 kept points).
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.builder import Graph
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.gpu.compiler import compile_module

from test_codegen_common import assert_everywhere

RNG = np.random.default_rng(7)


def _mean_pooling(b=2, s=8, h=20, vocab=16):
    """The zoo's embedding classifier without its head: masked mean of token embeddings."""
    g = Graph("pool")
    ids = g.input("ids", (b, s), "i64")
    mask = g.input("mask", (b, s), "i64")
    table = g.input("table", (vocab, h))
    m = g.expand_dims(g.cast(mask, "f32"), [2])
    pooled = g.div(g.sum(g.mul(g.embedding(table, ids), m), 1),
                   g.maximum(g.sum(m, 1), 1.0))
    g.output(pooled)
    ids_v = RNG.integers(0, vocab, (b, s)).astype(np.int64)
    mask_v = (RNG.uniform(size=(b, s)) < 0.6).astype(np.int64)
    mask_v[-1] = 0  # a row with nothing to pool: clamp(0, 1) divides by 1
    table_v = RNG.uniform(-1, 1, (vocab, h)).astype(np.float32)
    mf = mask_v[..., None].astype(np.float32)
    want = (table_v[ids_v] * mf).sum(1) / np.maximum(mf.sum(1), 1.0)
    return g, [ids_v, mask_v, table_v], [want.astype(np.float32)]


def _weight_norm(o=6, i=4, k=12):
    """torch's weight_norm(dim=2): g * v / ||v|| over the two leading axes of the filter."""
    gr = Graph("wnorm")
    v = gr.input("v", (o, i, k))
    gain = gr.input("g", (1, 1, k))
    norm = gr.sqrt(gr.sum(gr.mul(v, v), (0, 1), keepdims=True))
    gr.output(gr.mul(gr.div(v, norm), gain))
    V = RNG.uniform(-1, 1, (o, i, k)).astype(np.float32)
    G = RNG.uniform(0.5, 2, (1, 1, k)).astype(np.float32)
    want = V / np.sqrt((V * V).sum((0, 1), keepdims=True)) * G
    return gr, [V, G], [want.astype(np.float32)]


def _column_mean(r=9, c=72):
    """A sum over the leading axis and a scale after it (one kernel: K = 72 points)."""
    g = Graph("colmean")
    x = g.input("x", (r, c))
    g.output(g.mul(g.sum(g.exp(x), 0), 1.0 / r))
    X = RNG.uniform(-1, 1, (r, c)).astype(np.float32)
    return g, [X], [(np.exp(X).sum(0) / r).astype(np.float32)]


_BUILDS = {"mean_pooling": _mean_pooling, "weight_norm": _weight_norm, "column_mean": _column_mean}
_CHECKED: dict = {}


def _checked(name):
    """(graph, fused Executable, want), checked by assert_everywhere once per module."""
    if name not in _CHECKED:
        graph, args, want = _BUILDS[name]()
        _CHECKED[name] = graph, assert_everywhere(graph, args, want, kernels=1), want
    return _CHECKED[name]


@pytest.mark.parametrize("name", list(_BUILDS))
def test_one_columns_kernel_everywhere(name):
    """Reference = fused CPU = unfused CPU = emulator (assert_everywhere), one kernel of
    kind ``columns``, built by the column emitter with one thread per kept point."""
    _, exe, want = _checked(name)
    (kernel,) = exe.report["kernels"]
    assert kernel["kind"] == "columns", kernel
    program = compile_module(exe._source, lower=False)
    (spec,) = program.kernels.values()
    assert spec.emitter == "columns", program.notes
    kept = want[0].shape[2:] if name == "weight_norm" else want[0].shape
    assert spec.meta["columns"] == int(np.prod(kept))


def test_mean_pooling_ledger_names_both_merges():
    """The consumer (sum / count) by the byte guard, the mask count (a row reduction read
    at every hidden unit) recomputed per thread by the time guard."""
    _, exe, _ = _checked("mean_pooling")
    fused = {d["action"]: d["reason"] for d in exe.report["decisions"]
             if d["pass_name"] == "opfuse-fuse-columns" and d["fused"]}
    assert fused["after column reduction"].startswith("saving"), fused
    assert fused["recomputed in columns"].startswith("time saving"), fused


@pytest.mark.parametrize("name", ["mean_pooling", "weight_norm"])
def test_columns_kernels_assemble_without_spills(name):
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not found")
    _, exe, _ = _checked(name)
    program = exe.gpu_program(("sm_80", "sm_90"), ptxas=True)
    (spec,) = program.kernels.values()
    assert spec.emitter == "columns", program.notes
    for chip in ("sm_80", "sm_90"):
        res = spec.resources[chip]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (chip, res)
