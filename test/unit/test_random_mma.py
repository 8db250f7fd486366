"""Property test of the tensor-core matmul path: random matmul graphs in f16, bf16 and f32
with TF32 allowed, compiled to kernels, emulated (race check on), against numpy.

Each example draws one or two products: 2-D linears (``x @ w``, ``xᵀ @ w``, ``x @ wᵀ``:
operands stored along K or along M/N, so ldmatrix with and without ``.trans``, and TF32's
element loads), batched 3-D/4-D products (``q @ kᵀ``, ``p @ v``), an elementwise prologue
on A, and bias / residual / activation epilogues, with sizes that pick the emitter's
tails (1, odd sizes, just above multiples of 8, 16, 32 and 64: zero-filled copies, 8- and
4-byte copies, evaluator staging, one-column stores). Every output-group kernel must be
the tensor-core one; each kernel's result buffers are poisoned before it runs (an element
no thread writes shows).

Tolerances, relative to max(1, max |reference|) (test_codegen_mma.py says why): f16 1e-2,
bf16 3e-2, TF32 5e-3. Inputs are uniform in [-1, 1), right-hand sides scaled by
1/sqrt(K), so values stay O(1). OPFUSE_HYPOTHESIS_EXAMPLES sets the number of examples
(default 36, about 20 s on one core; the wgmma variant, ``matmul=wgmma`` on sm_90a, runs a
quarter of them on f16 and bf16), derandomized; HYPOTHESIS_PROFILE=explore draws fresh ones.
A failing example prints as the builder calls that rebuild it.
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfuse.builder import Graph

from test_codegen_mma import TOL, emulated

EXAMPLES = int(os.environ.get("OPFUSE_HYPOTHESIS_EXAMPLES", "36"))
_COMMON = dict(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("mma-ci", derandomize=True, **_COMMON)
settings.register_profile("mma-explore", **_COMMON)
PROFILE = "mma-" + ("explore" if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else "ci")

SIZES = (1, 3, 8, 9, 16, 17, 24, 33, 36, 40, 64, 65, 72)
MAX_ELEMS = 4096
ACTIVATIONS = (None, "relu", "gelu", "tanh", "silu")


class _Case:
    def __init__(self, dtype: str):
        self.g = Graph("random_mma", dtype="f32" if dtype == "tf32" else dtype)
        self.dtype = dtype
        self.lines = [f'g = Graph("random_mma", dtype={self.g.dtype!r})']
        self.scales: dict[str, float] = {}
        self.names: dict[int, str] = {}

    def call(self, method: str, *args, **kwargs):
        out = getattr(self.g, method)(*args, **kwargs)
        fmt = lambda a: self.names.get(id(a), repr(a))  # noqa: E731
        parts = [fmt(a) for a in args] + [f"{k}={fmt(v)}" for k, v in kwargs.items()]
        self.names[id(out)] = f"t{len(self.names)}"
        self.lines.append(f"{self.names[id(out)]} = g.{method}({', '.join(parts)})")
        return out

    def input(self, prefix: str, shape, scale: float = 1.0):
        name = f"{prefix}{len(self.g.inputs)}"
        if scale != 1.0:
            self.scales[name] = scale
        return self.call("input", name, tuple(shape))

    def __repr__(self) -> str:
        return "\n" + "\n".join(self.lines) + (f"  # scales {self.scales}" if self.scales else "") + "\n"


@st.composite
def random_case(draw, dtypes=("f16", "bf16", "tf32")) -> _Case:
    case = _Case(draw(st.sampled_from(list(dtypes))))

    def dim(room=MAX_ELEMS):
        return draw(st.sampled_from([s for s in SIZES if s <= max(1, room)]))

    def epilogue(y):
        n = y.shape[-1]
        if draw(st.booleans()):
            y = case.call("add", y, case.input("b", (n,)))
        if draw(st.integers(0, 3)) == 0:
            y = case.call("add", y, case.input("r", y.shape))
        act = draw(st.sampled_from(ACTIVATIONS))
        return case.call(act, y) if act else y

    if draw(st.booleans()):  # a 2-D linear, maybe followed by a second one
        m, k = dim(512), dim(512)
        how = draw(st.sampled_from(["x@w", "xT@w", "x@wT"]))
        a = case.input("x", (k, m) if how == "xT@w" else (m, k))
        if how == "xT@w":
            a = case.call("transpose", a, (1, 0))
        if draw(st.integers(0, 2)) == 0:
            a = case.call(draw(st.sampled_from(["relu", "tanh", "neg"])), a)
        n = dim(MAX_ELEMS // max(m, k))
        w = case.input("w", (n, k) if how == "x@wT" else (k, n), 1 / math.sqrt(k))
        if how == "x@wT":
            w = case.call("transpose", w, (1, 0))
        y = epilogue(case.call("matmul", a, w))
        if draw(st.booleans()):
            n2 = dim(MAX_ELEMS // max(m, n))
            y = epilogue(case.call("matmul", y, case.input("w", (n, n2), 1 / math.sqrt(n))))
    else:  # batched: q @ kᵀ (or q @ k), maybe @ v
        batch = tuple(draw(st.sampled_from([(2,), (3,), (2, 2)])))
        nb = math.prod(batch)
        s, d = dim(MAX_ELEMS // (nb * 16)), dim(MAX_ELEMS // (nb * 16))
        q = case.input("q", batch + (s, d))
        s2 = dim(MAX_ELEMS // (nb * max(s, d)))
        swap = tuple(range(len(batch))) + (len(batch) + 1, len(batch))
        if draw(st.booleans()):
            kt = case.call("transpose", case.input("k", batch + (s2, d), 1 / math.sqrt(d)), swap)
        else:
            kt = case.input("k", batch + (d, s2), 1 / math.sqrt(d))
        y = case.call("matmul", q, kt)
        if draw(st.booleans()):
            dv = dim(MAX_ELEMS // (nb * max(s, s2)))
            y = case.call("matmul", case.call("tanh", y), case.input("v", batch + (s2, dv), 1 / math.sqrt(s2)))
        y = epilogue(y)
    case.g.output(y)
    case.lines.append(f"g.output({case.names[id(y)]})")
    return case


def _inputs(case: _Case, seed: int):
    from opfuse.frontends.builder.graphs import example_inputs

    from opfuse.frontends.builder.graph import round_to_dtype

    values = example_inputs(case.g, seed)
    for name, s in case.scales.items():
        values[name] = round_to_dtype(values[name] * s, case.g.dtype).astype(values[name].dtype)
    return values


@settings(settings.get_profile(PROFILE))
@given(case=random_case(), seed=st.integers(0, 2**16))
def test_emulated_mma_kernels_match_numpy(case: _Case, seed: int):
    _check(case, seed, "mma", allow_tf32=case.dtype == "tf32")


@settings(settings.get_profile(PROFILE), max_examples=max(4, EXAMPLES // 4))
@given(case=random_case(("f16", "bf16")), seed=st.integers(0, 2**16))
def test_emulated_wgmma_kernels_match_numpy(case: _Case, seed: int):
    """The same graphs on warpgroup MMA (``matmul=wgmma``, sm_90a), a quarter as many."""
    _check(case, seed, "wgmma", targets=("sm_90a",), matmul="wgmma")


def _check(case: _Case, seed: int, emitter: str, **options) -> None:
    values = _inputs(case, seed)
    program, emu, got, want = emulated(case.g, inputs=[values[t.name] for t in case.g.inputs], **options)
    matmuls = [k for k in program.kernels.values() if k.name.endswith("_output")]
    assert matmuls and all(k.emitter == emitter for k in matmuls), program.notes
    tol = TOL["f32" if case.dtype == "tf32" else case.dtype]
    for x, w in zip(got, want):
        assert not np.isnan(x).any(), "an output element no thread wrote"
        np.testing.assert_allclose(x, w, rtol=0, atol=tol * max(1.0, float(np.abs(w).max())))
