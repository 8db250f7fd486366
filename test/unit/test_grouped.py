"""Grouped matmuls (opfuse-fuse-grouped): independent matmuls that read one tensor in
different roles, one "horizontal" kernel whose blocks are split between problems of
different M, N and K (backends/gpu/emit/horizontal.py's flat ranges).

A linear layer's backward (dX = dY·W, dW = dYᵀ·X, with tails in every dim) and
attention's (dV = Pᵀ·dO, dP = dO·Vᵀ over a batch): on the GPU emulator (race check on;
SIMT in f32, mma.sync in f16/bf16, wgmma on sm_90a) and on the CPU backend against the
builder's numpy reference; a dependent pair is not joined, and the ledger says why."""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.builder import Graph
from opfuse.cost import gpu_time as estimate

from test_codegen_common import compile_cpu
from test_codegen_mma import TOL, emulated

TOLERANCE = {"f32": 2e-5, **TOL}


def linear_backward(t=40, i=52, o=36, dtype="f32") -> Graph:
    g = Graph("linear_backward", dtype=dtype)
    dy, w, x = g.input("dy", (t, o)), g.input("w", (o, i)), g.input("x", (t, i))
    dx = g.matmul(dy, w, name="dx")
    dw = g.matmul(g.transpose(dy, (1, 0), name="dyT"), x, name="dw")
    g.output(dx, dw)
    return g


def with_column_sum(t=40, i=52, o=36, dtype="f32") -> Graph:
    """GPT-2's MLP backward: dX's column sum (the LayerNorm bias gradient before it) is
    added in dX's epilogue (opfuse-fuse-column-sums); the pair still shares a launch."""
    g = Graph("with_column_sum", dtype=dtype)
    dy, w, x = g.input("dy", (t, o)), g.input("w", (o, i)), g.input("x", (t, i))
    dx = g.matmul(dy, w, name="dx")
    dw = g.matmul(g.transpose(dy, (1, 0), name="dyT"), x, name="dw")
    g.output(dx, dw, g.sum(dx, axis=0, name="db"))
    return g


def attention_backward(b=3, t=24, d=16, dtype="f32") -> Graph:
    g = Graph("attention_backward", dtype=dtype)
    p, do, v = g.input("p", (b, t, t)), g.input("do", (b, t, d)), g.input("v", (b, t, d))
    dv = g.matmul(g.transpose(p, (0, 2, 1), name="pT"), do, name="dv")
    dp = g.matmul(do, g.transpose(v, (0, 2, 1), name="vT"), name="dp")
    g.output(dv, dp)
    return g


def dependent(t=16, k=24, dtype="f32") -> Graph:
    """z = (x·W)·xᵀ: z reads y = x·W, so the two matmuls over x cannot share a launch."""
    g = Graph("dependent", dtype=dtype)
    x, w = g.input("x", (t, k)), g.input("w", (k, k))
    y = g.matmul(x, w, name="y")
    g.output(g.matmul(y, g.transpose(x, (1, 0), name="xT"), name="z"))
    return g


CASES = {"linear_backward": linear_backward, "attention_backward": attention_backward,
         "with_column_sum": with_column_sum,
         "one_tile_each": lambda dtype: linear_backward(8, 12, 4, dtype),
         # several M and N tiles per range, a different count in each (64 x 64 SIMT tiles)
         "several_tiles": lambda dtype: linear_backward(130, 70, 66, dtype)}


def _report(g: Graph) -> dict:
    return compile_cpu(g).report


@pytest.mark.parametrize("name", list(CASES))
def test_independent_matmuls_are_one_kernel(name):
    report = _report(CASES[name](dtype="f32"))
    assert [k["kind"] for k in report["kernels"]] == ["horizontal"]
    (d,) = [d for d in report["decisions"] if d["pass_name"] == "opfuse-fuse-grouped"]
    assert d["fused"] and "2 independent matmuls reading" in d["reason"], d


def test_a_dependent_pair_stays_apart():
    report = _report(dependent())
    assert [k["kind"] for k in report["kernels"]] == ["output", "output"]
    refusals = [d for d in report["decisions"] if d["pass_name"] == "opfuse-fuse-grouped"]
    assert refusals and not any(d["fused"] for d in refusals)
    assert "depends on" in refusals[0]["reason"] or "cycle" in refusals[0]["reason"]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_grouped_kernel_matches_numpy(name, dtype):
    g = CASES[name](dtype=dtype)
    program, emu, got, want = emulated(g)
    (h,) = [k for k in program.kernels.values() if k.name.endswith("_horizontal")]
    assert h.emitter == ("horizontal" if dtype == "f32" else "horizontal_mma"), program.notes
    bm, bn, _ = h.meta["tile"]
    problems = h.meta.get("problems")
    if problems:  # different M: every range's (M, N) tiles laid along x
        assert h.grid[0] == sum(-(-m // bm) * -(-n // bn) for m, n, _ in problems)
        assert h.grid[1] == 1
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, rtol=0, atol=TOLERANCE[dtype] * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("name", ["linear_backward", "attention_backward"])
def test_emulated_grouped_wgmma_matches_numpy(name):
    g = CASES[name](dtype="bf16")
    program, emu, got, want = emulated(g, targets=("sm_90a",), matmul="wgmma")
    (h,) = [k for k in program.kernels.values() if k.name.endswith("_horizontal")]
    assert h.emitter == "horizontal_wgmma", program.notes
    assert emu.stats.wgmma > 0
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, rtol=0, atol=TOL["bf16"] * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_grouped_function_matches_numpy(name):
    g = CASES[name](dtype="f32")
    args = g.random_inputs(seed=5)
    got = opfuse.compile(g, backend="cpu")(*args.values())
    want = g.reference(*args.values())
    assert len(got) == len(want)
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-5)


def test_the_estimate_counts_each_problem():
    """A grouped kernel's executed FLOPs are each problem's padded to the tile, not the
    first problem's M and K times the summed N."""
    program, *_ = emulated(linear_backward())
    (h,) = [k for k in program.kernels.values() if k.name.endswith("_horizontal")]
    bm, bn, bk = h.meta["tile"]
    est = estimate.matmul_kernel(estimate.H200, grid=h.grid, block=h.block, meta=h.meta,
                                 flops=1.0, bytes_=1.0, registers=128, smem=0)

    def up(x, b):
        return -(-x // b) * b

    want = sum(2.0 * up(m, bm) * up(n, bn) * up(k, bk) for m, n, k in [[40, 52, 36], [36, 52, 40]])
    assert h.meta["problems"] == [[40, 52, 36], [36, 52, 40]]
    assert est["executed_flops"] == want
