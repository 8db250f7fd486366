"""Property test: random DAGs of elementwise, broadcast and reduction ops, with shapes that
include 1, 3 and odd sizes, give the same results fused, unfused and in numpy (CPU).

Every value in a generated graph has a shape that broadcasts to the graph's base shape
(some dims 1, or leading dims dropped), so any two can meet in a binary op. Reductions keep
their dims, except at outputs where a reduction without keepdims is also tried. Ops are
bounded (tanh, sigmoid, relu, neg, exp of a bounded value, add/sub/mul/max/min, sum/max/mean
over small axes), so f32 tolerances apply: RTOL 1e-4, ATOL 1e-5 against the float64 numpy
reference, and the same between fused and unfused.

Runs OPFUSE_HYPOTHESIS_EXAMPLES examples (default 200, derandomized so CI is repeatable;
set HYPOTHESIS_PROFILE=explore for fresh random seeds).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opfuse
from opfuse.builder import Graph

RTOL, ATOL = 1e-4, 1e-5
EXAMPLES = int(os.environ.get("OPFUSE_HYPOTHESIS_EXAMPLES", "200"))
_COMMON = dict(max_examples=EXAMPLES, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("explore", **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

DIMS = st.sampled_from([1, 2, 3, 5, 7, 8, 16])
UNARY = ("tanh", "sigmoid", "relu", "neg", "exp_tanh")
BINARY = ("add", "sub", "mul", "maximum", "minimum")


def _sub_shape(draw, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``base``: some dims set to 1, maybe leading dims dropped."""
    drop = draw(st.integers(0, len(base) - 1))
    return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else d for d in base[drop:])


@st.composite
def random_graph(draw):
    base = tuple(draw(st.lists(DIMS, min_size=1, max_size=3)))
    g = Graph("dag")
    pool = [g.input("x0", base)]
    for i in range(1, draw(st.integers(1, 3))):
        pool.append(g.input(f"x{i}", _sub_shape(draw, base)))
    for _ in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "broadcast"]))
        x = draw(st.sampled_from(pool))
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            y = g.exp(g.tanh(x)) if op == "exp_tanh" else getattr(g, op)(x)
        elif kind == "binary":
            y = getattr(g, draw(st.sampled_from(BINARY)))(x, draw(st.sampled_from(pool)))
        elif kind == "reduce" and len(x.shape) > 0 and max(x.shape) > 1:
            axis = draw(st.integers(0, len(x.shape) - 1))
            y = getattr(g, draw(st.sampled_from(["sum", "max", "mean"])))(x, axis=axis, keepdims=True)
        else:
            y = g.broadcast_to(x, base)
        pool.append(y)
    outputs = [pool[-1]]
    extra = draw(st.sampled_from(pool[:-1]))
    if extra is not outputs[0] and draw(st.booleans()):
        outputs.append(extra)
    if draw(st.booleans()) and len(base) > 1:  # a reduction that drops its axis, as an output
        outputs.append(g.sum(pool[-1], axis=len(pool[-1].shape) - 1))
    g.output(*outputs)
    return g


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@settings(settings.get_profile(PROFILE))
@given(graph=random_graph(), seed=st.integers(0, 2**16))
def test_fused_equals_unfused_equals_numpy(graph, seed):
    inputs = [a for a in graph.random_inputs(seed=seed).values()]
    fused = opfuse.compile(graph, backend="cpu")
    unfused = opfuse.compile(graph, backend="cpu", fusion=False)
    assert fused.report["totals"]["after"]["kernels"] <= unfused.report["totals"]["after"]["kernels"]
    got, base = _as_tuple(fused(*inputs)), _as_tuple(unfused(*inputs))
    ref = graph.reference(*inputs)
    for g, b, r in zip(got, base, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(g, b, rtol=RTOL, atol=ATOL)
