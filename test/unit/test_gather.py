"""Gathers (``opfuse.frontends.builder.gather``): embedding, gather, index, index_select as one
``linalg.generic`` reading through ``tensor.extract``. The builder's numpy reference against
numpy's own indexing, CPU runs fused and unfused against the reference, GPU kernels in the
emulator (race check on) against numpy, bounds (an out-of-range index reads an edge element,
never outside the buffer), and the fusion they allow: an embedding fuses with what follows
(GPT-2's scale and position add, BERT's sum and LayerNorm: one kernel), the producer of a
gathered tensor never joins the gather's kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.builder import Graph
from opfuse.errors import OpfuseError

from test_codegen_common import assert_everywhere

RNG = np.random.default_rng(0)


def _bounded(i: np.ndarray, n: int) -> np.ndarray:
    """The documented bounds: negative indices wrap once, then clamp to [0, n - 1]."""
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


def test_embedding_with_scale_position_add_and_layernorm_is_one_kernel():
    g = Graph("gpt2_embed")
    w = g.input("wte", (50, 16))
    ids = g.input("ids", (2, 7), "i64")
    wpe = g.input("wpe", (7, 16))
    y = g.layernorm(g.embedding(w, ids) * 4.0 + wpe)
    g.output(y)
    W, P = RNG.standard_normal((50, 16)).astype(np.float32), RNG.standard_normal((7, 16)).astype(np.float32)
    I = RNG.integers(0, 50, (2, 7))
    e = W[I] * 4.0 + P
    want = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-5)
    assert_everywhere(g, [W, I, P], [want.astype(np.float32)], kernels=1)


def test_out_of_range_indices_never_read_outside_the_buffer():
    """Indices past either end (and negative ones past -n) read the edge rows: the CPU, the
    emulated kernels (which fault on any access outside a buffer) and the reference agree."""
    g = Graph("oob")
    w = g.input("w", (5, 4))
    ids = g.input("ids", (6,), "i64")
    g.output(g.embedding(w, ids) + 1.0)
    W = RNG.standard_normal((5, 4)).astype(np.float32)
    I = np.array([0, 4, 5, 1000, -1, -1000])
    assert_everywhere(g, [W, I], [W[_bounded(I, 5)] + 1.0])


def test_gather_along_a_dim():
    g = Graph("gather")
    x = g.input("x", (3, 10))
    idx = g.input("idx", (3, 4), "i64")
    g.output(g.gather(x, 1, idx) * 2.0)
    X, I = RNG.standard_normal((3, 10)).astype(np.float32), RNG.integers(-10, 10, (3, 4))
    assert_everywhere(g, [X, I], [np.take_along_axis(X, _bounded(I, 10), 1) * 2.0])


def test_advanced_index_broadcasts_its_index_tensors():
    """``mask[batch[:, None, None, None], kv[None, None, None, :]]``, the padding-mask
    lookup every Hugging Face model makes, and a middle-dim index."""
    g = Graph("index")
    m = g.input("m", (2, 8), "i64")
    b = g.input("b", (2, 1, 1, 1), "i64")
    k = g.input("k", (1, 1, 1, 8), "i64")
    x = g.input("x", (3, 6, 5))
    j = g.input("j", (4,), "i64")
    g.output(g.cast(g.index(m, [b, k]), "f32"), g.index(x, [None, j]) + 0.5)
    M = RNG.integers(0, 2, (2, 8))
    B, K = np.arange(2).reshape(2, 1, 1, 1), np.arange(8).reshape(1, 1, 1, 8)
    X, J = RNG.standard_normal((3, 6, 5)).astype(np.float32), np.array([5, 0, 2, 2])
    assert_everywhere(g, [M, B, K, X, J], [M[B, K].astype(np.float32), X[:, J] + 0.5])


def test_index_select():
    g = Graph("index_select")
    x = g.input("x", (4, 6))
    j = g.input("j", (3,), "i64")
    g.output(g.index_select(x, 0, j) - 1.0)
    X = RNG.standard_normal((4, 6)).astype(np.float32)
    assert_everywhere(g, [X, np.array([3, 0, 3])], [X[[3, 0, 3]] - 1.0])


def test_a_gathered_tensor_is_complete_before_the_gather():
    """The table is computed in the graph (``w @ m``): its kernel finishes before the gather
    reads it at data-dependent rows; the ledger says why they are not one kernel."""
    g = Graph("computed_table")
    w, m = g.input("w", (5, 4)), g.input("m", (4, 4))
    ids = g.input("ids", (5,), "i64")
    g.output(g.embedding(g.matmul(w, m), ids))
    W, M = RNG.standard_normal((5, 4)).astype(np.float32), RNG.standard_normal((4, 4)).astype(np.float32)
    I = np.array([4, 1, 1, 0, 3])
    fused = assert_everywhere(g, [W, M, I], [(W @ M)[I]], kernels=2)
    reasons = [d["reason"] for d in fused.report["decisions"] if not d["fused"]]
    assert any("data-dependent positions" in r for r in reasons), reasons


def test_an_elementwise_table_is_computed_where_it_is_gathered():
    """A table made by one elementwise op (``w * 2``) is computed at the gathered rows
    instead (opfuse-fuse-recompute): one kernel, which reads ``w`` itself."""
    g = Graph("scaled_table")
    w = g.input("w", (5, 4))
    ids = g.input("ids", (5,), "i64")
    g.output(g.embedding(w * 2.0, ids))
    W, I = RNG.standard_normal((5, 4)).astype(np.float32), np.array([4, 1, 1, 0, 3])
    fused = assert_everywhere(g, [W, I], [W[I] * 2.0], kernels=1)
    assert any(d["fused"] and d["action"] == "recompute" for d in fused.report["decisions"])


def test_index_tensors_must_be_integers():
    g = Graph("bad")
    w, ids = g.input("w", (4, 4)), g.input("ids", (2,))
    with pytest.raises(OpfuseError, match="index tensors are integers"):
        g.embedding(w, ids)


def test_a_moved_table_read_by_a_gather_and_another_op():
    """Regression (Phi, GPT-NeoX crashed the process): a transpose read by a gather and by
    an elementwise op was duplicated into both; the copy replaced the gather's operands but
    not the tensor.extract in its body, and the original was erased under it."""
    g = Graph("moved_table")
    w = g.input("w", (4, 6))
    ids = g.input("ids", (6, 5), "i64")
    t = g.transpose(w, (1, 0))  # (6, 4)
    g.output(g.gather(t, 1, g.cast(g.cast(ids, "f32") * 0.5, "i64")), t * 3.0)
    W, I = RNG.standard_normal((4, 6)).astype(np.float32), RNG.integers(0, 8, (6, 5))
    T = W.T
    assert_everywhere(g, [W, I], [np.take_along_axis(T, I // 2, 1), T * 3.0])


def test_only_bodies_that_use_outside_values_are_searched_for_gathers():
    """The graph walks a generic's body for tensors it reads at data-dependent positions
    only where the body uses a value from outside the op (``Payload.captures``): a gather's
    does, an elementwise op's does not, and the gather is found either way."""
    from mlir import ir

    from opfuse import ir as oir
    from opfuse.analysis.graph import FuncGraph, functions
    from opfuse.analysis.opinfo import OpKind, info_cache

    g = Graph("gather_and_add")
    w, ids = g.input("w", (5, 4)), g.input("ids", (3,), "i64")
    g.output(g.embedding(w, ids) + 1.0)
    module = oir.parse_module(g.to_mlir())
    with info_cache():
        graph = FuncGraph(functions(module)[0])
    gather, add = (n for n in graph.nodes if n.kind == OpKind.ELEMENTWISE)
    assert gather.info.payload.captures and not add.info.payload.captures
    (table,) = gather.gathers
    assert isinstance(table, ir.BlockArgument) and table.arg_number == 0  # w
    assert add.gathers == []
