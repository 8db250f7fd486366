"""Matmul epilogues behind a transpose (opfuse-fuse-epilogue): the attention backward's
``dK`` seen as ``[B, T, H, D]`` and added to another gradient, a tied embedding's gradient
``dWᵀ + scatter``. Each element of the transposed result is still one accumulator, stored
at the permuted index. Checked: one kernel, the CPU program fused and unfused and the
emulated GPU kernels (SIMT in f32, tensor cores in f16) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.backends.gpu.compiler import compile_module
from opfuse.builder import Graph
from opfuse.testing.emulator import emulate

from test_codegen_common import as_tuple, compile_cpu

RNG = np.random.default_rng(0)


def _tied(dtype):
    """(x @ w)ᵀ + g: a 2-D matmul's result transposed, then added."""
    g = Graph("tied", dtype=dtype)
    x, w, t = g.input("x", (40, 24)), g.input("w", (24, 36)), g.input("t", (36, 40))
    g.output(g.add(g.transpose(g.matmul(x, w), (1, 0)), t))
    return g, lambda X, W, T: (X @ W).T + T


def _heads(dtype):
    """A batched matmul over (batch x heads) expanded to [B, H, T, D], permuted to
    [B, T, H, D] and added to another gradient (GPT-2's dK + dQ path)."""
    g = Graph("heads", dtype=dtype)
    a, b = g.input("a", (8, 16, 12)), g.input("b", (8, 12, 8))
    r = g.input("r", (2, 16, 4, 8))
    prod = g.reshape(g.matmul(a, b), (2, 4, 16, 8))
    g.output(g.add(g.transpose(prod, (0, 2, 1, 3)), r))
    return g, lambda A, B, R: (A @ B).reshape(2, 4, 16, 8).transpose(0, 2, 1, 3) + R


@pytest.mark.parametrize("dtype, emitter", [("f32", "matmul"), ("f16", "mma")])
@pytest.mark.parametrize("make", [_tied, _heads])
def test_a_transposed_epilogue_is_one_matmul_kernel(make, dtype, emitter):
    g, ref = make(dtype)
    exe = compile_cpu(g)
    assert [k["kind"] for k in exe.report["kernels"]] == ["output"]
    np_dtype = np.float16 if dtype == "f16" else np.float32
    args = [RNG.uniform(-1, 1, t.shape).astype(np_dtype) for t in g.inputs]
    want = ref(*(a.astype(np.float64) for a in args))
    tol = 2e-2 if dtype == "f16" else 1e-5
    for e in (exe, compile_cpu(g, fusion=False)):
        np.testing.assert_allclose(as_tuple(e(*args))[0].astype(np.float64), want, rtol=tol, atol=tol)
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == [emitter], program.notes
    got = emulate.run_program(program, args)[0]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
