"""The warp-level building block (backends/gpu/build/mma.py) on its own, as another emitter (the
attention kernel) uses it: one warp stages operands into shared memory with
backends/gpu/build/async_copy.py, loads fragments, multiplies, turns two accumulators into an A
fragment (FlashAttention's P) and multiplies again, and stores through ``Warp.pairs``.
Emulated (race check on) against numpy, f16 and bf16, with B stored both ways."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir
from mlir.dialects import gpu, vector

from opfuse.backends.gpu.build import async_copy, mma
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.build.kernel import KernelBuilder, Param, Shared
from opfuse.ir import make_context
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits


def _kernel(dtype: str, b_k_contiguous: bool):
    """D = f(A @ B1) @ B2 for A 16x16, B1 16x16, B2 16x8 (f = rounding to ``dtype``)."""
    ctx = make_context()
    module = ir.Module.create(ir.Location.unknown(ctx))
    params = [Param(("arg", 0), (256,), dtype), Param(("arg", 1), (256,), dtype),
              Param(("arg", 2), (128,), dtype), Param(("result", 0), (128,), "f32")]
    ld = mma.padded_ld(16, 2)
    kb = KernelBuilder(module, "k", params, (1, 1, 1), (32, 1, 1), [Shared(16 * ld, dtype)] * 3)
    a_g, b1_g, b2_g, d_g = kb.params
    a_s, b1_s, b2_s = kb.shared
    with ctx:
        tid = kb.add_dim(kb.thread_id[0])
        # A and B1 (16 rows of 16): thread t copies half t % 2 of row t / 2 (16 bytes);
        # B2 (16 rows of 8): threads 0-15 copy one row each
        row, half = ir.AffineExpr.get_floor_div(tid, 2), ir.AffineExpr.get_mod(tid, 2) * 8
        for src, dst in ((a_g, a_s), (b1_g, b1_s)):
            async_copy.copy(kb, dst, kb.apply(row * ld + half), src, kb.apply(row * 16 + half), 8)
        with kb.if_(kb.cmp_lt(kb.apply(tid), kb.index(16))):
            async_copy.copy(kb, b2_s, kb.apply(tid * ld), b2_g, kb.apply(tid * 8), 8)
        async_copy.commit(kb)
        async_copy.wait(kb, 0)
        with kb.emitting():
            gpu.barrier()
        kind = mma.KINDS[dtype]
        warp = mma.Warp(kb, kind, tid)
        zero = ir.AffineConstantExpr.get(0, ctx)
        # A row-major [m][k]: along K. B1 given [k][n] (along N) or, transposed, [n][k]
        tile_a = mma.SharedTile(a_s, ld, True, zero)
        tile_b1 = mma.SharedTile(b1_s, ld, b_k_contiguous, zero)
        tile_b2 = mma.SharedTile(b2_s, ld, False, zero)
        a = warp.load_a(tile_a, zero, zero)
        b_left, b_right = warp.load_b(tile_b1, zero, zero, tiles=2)
        left = warp.mma(a, b_left, warp.zeros())
        right = warp.mma(a, b_right, warp.zeros())
        p = warp.a_from_acc(left, right)
        (b2,) = warp.load_b(tile_b2, zero, zero, tiles=1)
        d = warp.mma(p, b2, warp.zeros())
        for (r, c), (x, y) in warp.pairs(d, zero, zero):
            with kb.emitting():
                v = vector.from_elements(ir.VectorType.get([2], ir.F32Type.get()), [x, y])
                vector.store(v, d_g, [kb.apply(r * 8 + c)], alignment=8)
    kb.func.verify()
    return module


@pytest.mark.parametrize("b_k_contiguous", [False, True], ids=["b_along_n", "b_along_k"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_two_chained_products_through_a_from_acc(dtype, b_k_contiguous):
    rng = np.random.default_rng(1)
    A, B1, B2 = (rng.integers(-3, 4, s).astype(np.float32) / 4 for s in ((16, 16), (16, 16), (16, 8)))
    B1_mem = B1.T if b_k_contiguous else B1  # along K: stored [n][k]

    def mem(x):
        flat = np.ascontiguousarray(x).reshape(-1)
        return float32_to_bf16_bits(flat) if dtype == "bf16" else flat.astype(np.float16)

    d = np.zeros(128, np.float32)
    emu = emulate.Emulator(_kernel(dtype, b_k_contiguous))
    emu.run("k", [mem(A), mem(B1_mem), mem(B2), d])
    P = A.astype(np.float64) @ B1
    P = bf16_bits_to_float32(float32_to_bf16_bits(P.astype(np.float32))) if dtype == "bf16" else P.astype(np.float16)
    np.testing.assert_allclose(d.reshape(16, 8), P.astype(np.float64) @ B2, rtol=1e-6, atol=1e-6)
    assert emu.stats.mma == 3 and emu.stats.ldmatrix_wavefronts == emu.stats.ldmatrix_matrices
