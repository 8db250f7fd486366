"""Matmul kernels with outputs that read no contraction: a training forward saves, for
its backward, the operand views its matmul group computes (GPT-2's transposed Q and K,
returned beside Q·Kᵀ). Those outputs are written after the tiles, every thread of the
launch taking a strided share (``matmul.store_side_outputs``); before, the group fell back
to the one-thread-per-element kernel. Checked: the SIMT and tensor-core emitters build the
group (no fallback), and the emulated kernel (race check on) matches numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.backends.gpu.compiler import compile_module
from opfuse.builder import Graph
from opfuse.testing.emulator import emulate

from test_codegen_common import compile_cpu

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("dtype, emitter", [("f32", "matmul"), ("f16", "mma")])
def test_a_saved_operand_view_is_written_by_the_matmul_kernel(dtype, emitter):
    g = Graph("saved_operand")
    x = g.input("x", (4, 24, 16), dtype)
    w = g.input("w", (4, 24, 20), dtype)
    a = g.transpose(x, (0, 2, 1))  # (4, 16, 24): the matmul's A, also returned
    g.output(g.matmul(a, w))
    g.output(a)
    exe = compile_cpu(g)
    assert [k["kind"] for k in exe.report["kernels"]] == ["output"]
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == [emitter], program.notes
    np_dtype = np.float16 if dtype == "f16" else np.float32
    X = RNG.uniform(-1, 1, (4, 24, 16)).astype(np_dtype)
    W = RNG.uniform(-1, 1, (4, 24, 20)).astype(np_dtype)
    product, view = emulate.run_program(program, [X, W])
    A = X.transpose(0, 2, 1)
    np.testing.assert_array_equal(view, A)
    tol = 2e-2 if dtype == "f16" else 1e-5
    np.testing.assert_allclose(product.astype(np.float64),
                               A.astype(np.float64) @ W.astype(np.float64), rtol=tol, atol=tol)

