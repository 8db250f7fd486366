"""bench/contractions.py: a graph's contractions alone (the floor the bench times beside
fused and unfused, issue 13's fusion-win line)."""

from __future__ import annotations

import numpy as np

import opfuse
from bench.cases import uniform_inputs
from bench.contractions import contractions_alone
from opfuse.frontends.builder.graphs import graphs


def test_every_matmul_of_the_encoder_layer_and_nothing_else():
    text = contractions_alone(graphs(scale=8)["g6_encoder_layer"].to_mlir())
    # Q, K, V, O, FFN1, FFN2; Q·Kᵀ and P·V batched
    assert text.count("linalg.matmul ins") == 6 and text.count("linalg.batch_matmul ins") == 2
    assert "linalg.generic" not in text and "math." not in text
    # the normalized tokens read by Q, K and V are one argument, not three
    exe = opfuse.compile(text, backend="cpu", fusion=False)
    # h and W_q, W_k, W_v; the heads' Q, Kᵀ, P, V; then an input and a weight per O, FFN1, FFN2
    assert len(exe.signature.inputs) == 1 + 3 + 4 + 3 * 2
    assert len(exe.report["kernels"]) == 8


def test_results_are_the_products_of_its_arguments():
    text = contractions_alone(graphs(scale=8)["g1_mlp"].to_mlir())
    exe = opfuse.compile(text, backend="cpu", fusion=False)
    a, w1, h, w2 = uniform_inputs(exe.signature)
    got = exe(a, w1, h, w2)
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ w1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], h.astype(np.float64) @ w2, rtol=1e-5, atol=1e-5)


def test_a_graph_without_contractions_has_none():
    assert contractions_alone(graphs(scale=64)["g2_elementwise_chain"].to_mlir()) is None
