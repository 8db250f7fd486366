"""Horizontal fusion (opfuse-fuse-horizontal, backends/gpu/emit/horizontal.py): sibling matmuls over
one LHS as one kernel, on the GPU emulator (race check on; SIMT in f32, tensor cores in
f16/bf16) and on the CPU backend, against the builder's numpy reference. Shapes with
tails (M, N not multiples of the tile), three projections with different N and their
biases, SwiGLU's product of two siblings in one tile; the full-size G6/G7 kernels through
ptxas (0 spills)."""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.builder import Graph
from opfuse.cost import gpu_time as estimate
from opfuse.backends.gpu.lower import ptxas as ptxas_mod
from opfuse.backends.gpu.compiler import compile_module
from opfuse.frontends.builder.graphs import graphs

from test_codegen_common import compile_cpu
from test_codegen_mma import TOL, emulated

TOLERANCE = {"f32": 2e-5, **TOL}


def qkv(m=40, k=48, ns=(32, 32, 24), dtype="f32") -> Graph:
    g = Graph("qkv", dtype=dtype)
    x = g.input("x", (m, k))
    outs = []
    for name, n in zip("qkv", ns):
        w, b = g.input(f"w{name}", (k, n)), g.input(f"b{name}", (n,))
        outs.append(g.add(g.matmul(x, w, name=name), b, name=f"{name}.bias"))
    g.output(*outs)
    return g


def swiglu(m=40, k=48, n=36, dtype="f32") -> Graph:
    g = Graph("swiglu", dtype=dtype)
    x = g.input("x", (m, k))
    w1, w3, w2 = g.input("w1", (k, n)), g.input("w3", (k, n)), g.input("w2", (n, k))
    h = g.mul(g.silu(g.matmul(x, w1, name="gate")), g.matmul(x, w3, name="up"), name="swiglu")
    g.output(g.matmul(h, w2, name="down"))
    return g


def swiglu_saved(m=40, k=48, n=36, dtype="f32") -> Graph:
    """SwiGLU as a training forward runs it: both projections (and the gate's SiLU) are
    returned for the backward beside the product; each output sits on one sibling's C
    (regression: the pair's tile has both, yet the one on the second sibling was refused
    and the kernel fell back to one thread per element)."""
    g = Graph("swiglu_saved", dtype=dtype)
    x = g.input("x", (m, k))
    w1, w3 = g.input("w1", (k, n)), g.input("w3", (k, n))
    gate, up = g.matmul(x, w1, name="gate"), g.matmul(x, w3, name="up")
    act = g.silu(gate)
    g.output(g.mul(act, up, name="swiglu"), gate, up, act)
    return g


CASES = {"qkv": qkv, "swiglu": swiglu, "swiglu_saved": swiglu_saved,
         "qkv_one_tile_each": lambda dtype: qkv(16, 8, (4, 8, 12), dtype)}


def _kinds(g: Graph) -> list[str]:
    return [k["kind"] for k in compile_cpu(g).report["kernels"]]


@pytest.mark.parametrize("name", list(CASES))
def test_siblings_are_one_kernel(name):
    kinds = _kinds(CASES[name](dtype="f32"))
    assert kinds.count("horizontal") == 1
    assert kinds == (["horizontal", "output"] if name == "swiglu" else ["horizontal"])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_horizontal_kernel_matches_numpy(name, dtype):
    g = CASES[name](dtype=dtype)
    program, emu, got, want = emulated(g)
    (h,) = [k for k in program.kernels.values() if k.name.endswith("_horizontal")]
    assert h.emitter == ("horizontal" if dtype == "f32" else "horizontal_mma"), program.notes
    assert h.grid[0] == sum(-(-n // h.meta["tile"][1]) for n in h.meta["ranges"])
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, rtol=0, atol=TOLERANCE[dtype] * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_horizontal_function_matches_numpy(name):
    g = CASES[name](dtype="f32")
    args = g.random_inputs(seed=3)
    exe = opfuse.compile(g, backend="cpu")
    got = exe(*args.values())
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = g.reference(*args.values())
    assert len(got) == len(want)
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(ptxas_mod.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["g6_encoder_layer", "g7_rmsnorm_swiglu"])
def test_full_size_horizontal_kernels_assemble_without_spills(name, dtype):
    g = graphs(dtype=dtype)[name]
    program = compile_module(compile_cpu(g)._source, targets=("sm_80", "sm_90"), ptxas=False)
    (h,) = [k for k in program.kernels.values() if k.name.endswith("_horizontal")]
    assert h.emitter == ("horizontal" if dtype == "f32" else "horizontal_mma"), program.notes
    for chip in ("sm_80", "sm_90"):
        _, res = ptxas_mod.assemble(h.ptx[chip], chip, name=h.name)
        (r,) = res.values()
        assert r.spill_stores == 0 and r.spill_loads == 0, (chip, r)
    # the H200 estimate counts every product: G7's blocks run gate and up on one A tile
    # (it counted one of them before), G6's QKV three ranges of one product each
    est = estimate.matmul_kernel(estimate.H200, grid=h.grid, block=h.block, meta=h.meta,
                                 flops=1.0, bytes_=1.0, registers=128, smem=0)
    if name == "g7_rmsnorm_swiglu":
        assert h.meta["products"] == [2]
        assert est["executed_flops"] == 2.0 * 4096 * 1024 * 2816 * 2
    else:
        assert h.meta["products"] == [1, 1, 1]
        assert est["executed_flops"] == 2.0 * 2048 * 512 * 512 * 3
