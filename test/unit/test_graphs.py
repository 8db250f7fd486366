"""G1–G8 end to end on the CPU: fused == unfused == an independent numpy reference.

The memory-bound graphs run at their benchmark size; the matmul-heavy ones (G5–G7: 2–70
GFLOP on a 2-core CPU) run the same graph structure at 1/8 of every size. The numpy
reference is the builder's own evaluator (float64, rounded to f32), independent of MLIR.

Tolerance (f32): max |fused - reference| <= ATOL + RTOL * |reference|, with RTOL = 1e-4
and ATOL = 1e-5; fused and unfused must agree to the same bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.frontends.builder.graphs import example_inputs, graphs

RTOL, ATOL = 1e-4, 1e-5
FULL_SIZE = ("g1_mlp", "g2_elementwise_chain", "g3_softmax", "g4_layernorm", "g8_x_minus_mean")
REDUCED = ("g5_attention", "g6_encoder_layer", "g7_rmsnorm_swiglu")
# kernels after fusion with the default pipeline (the structure does not depend on size)
EXPECTED_KERNELS = {"g1_mlp": 2, "g2_elementwise_chain": 1, "g3_softmax": 1, "g4_layernorm": 1,
                    "g5_attention": 1, "g6_encoder_layer": 7, "g7_rmsnorm_swiglu": 3,
                    "g8_x_minus_mean": 1}


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _check(name: str, graph) -> None:
    inputs = list(example_inputs(graph).values())
    fused = opfuse.compile(graph, backend="cpu")
    unfused = opfuse.compile(graph, backend="cpu", fusion=False)
    assert fused.report["totals"]["after"]["kernels"] == EXPECTED_KERNELS[name]
    assert unfused.report["totals"]["after"]["kernels"] == fused.report["totals"]["before"]["kernels"]
    got, base = _as_tuple(fused(*inputs)), _as_tuple(unfused(*inputs))
    ref = graph.reference(*inputs)
    assert len(got) == len(base) == len(ref)
    for g, b, r in zip(got, base, ref):
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(g, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_graph_matches_unfused_and_numpy(name):
    _check(name, graphs()[name])


@pytest.mark.parametrize("name", REDUCED)
def test_reduced_graph_matches_unfused_and_numpy(name):
    _check(name, graphs(small=True)[name])
