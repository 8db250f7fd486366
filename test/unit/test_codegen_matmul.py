"""The SIMT (FFMA) matmul emitter, emulated: staging layouts, tails, prologues, f16.

Each case is compiled fused (matmul + epilogue, producers staged through the evaluator;
results that leave transposed are stored through the permutation)
and unfused, its kernels run by the emulator (which also checks every shared-memory
access between barriers for races), and compared with the builder's numpy reference.
The shapes pick the emitter's branches: K not a multiple of the 16-wide slab (zeros
staged past K, with vector and with scalar staging), M and N not multiples of the tile,
an A operand whose bytes run along M (a transposed input: staged along M), a B operand
whose bytes run along K (Q Kᵀ: staged along K), K shorter than one slab, N not a multiple
of 4 (scalar columns), and f16 operands accumulated in f32.
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.compiler import compile_module
from opfuse.errors import OpfuseError

from test_codegen_common import assert_close, compile_cpu


def linear_vector_k_tail(g):  # K = 36: two full slabs and a partial one of 4
    x, w, b = g.input("x", (70, 36)), g.input("w", (36, 132)), g.input("b", (132,))
    g.output(g.relu(g.matmul(x, w) + b))


def transposed_a(g):  # A = xᵀ: consecutive addresses run along M
    x, w = g.input("x", (40, 68)), g.input("w", (40, 20))
    g.output(g.matmul(g.transpose(x, (1, 0)), w))


def scores_k_contiguous(g):  # B = Kᵀ: consecutive addresses run along K
    q, k = g.input("q", (2, 2, 70, 32)), g.input("k", (2, 2, 66, 32))
    g.output(g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.125))


def short_k(g):  # K = 8 < one slab
    x, w = g.input("x", (64, 8)), g.input("w", (8, 64))
    g.output(g.matmul(x, w))


def scalar_columns(g):  # N = 30: one column per thread, K = 33: scalar staging past K
    x, w = g.input("x", (20, 33)), g.input("w", (33, 30))
    g.output(g.tanh(g.matmul(x, w)))


def prologue(g):  # an elementwise producer of A, staged once per element and block
    x, w = g.input("x", (48, 40)), g.input("w", (40, 64))
    g.output(g.matmul(g.relu(x), w))


def transposed_output(g):  # the matmul's result leaves transposed: stores to (n, m)
    x, w, b = g.input("x", (66, 40)), g.input("w", (40, 36)), g.input("b", (36,))
    g.output(g.transpose(g.relu(g.matmul(x, w) + b), (1, 0)))


def heads_merged(g):  # P V per head, then heads next to the sequence: (17, 3, 8)
    p, v = g.input("p", (3, 17, 20)), g.input("v", (3, 20, 8))
    g.output(g.transpose(g.matmul(p, v), (1, 0, 2)))


CASES = [
    transposed_output,
    heads_merged,
    linear_vector_k_tail,
    transposed_a,
    scores_k_contiguous,
    short_k,
    scalar_columns,
    prologue,
]


def _run(g: Graph, fusion: bool, **options):
    args = [g.random_inputs(0)[t.name] for t in g.inputs]
    exe = compile_cpu(g, fusion=fusion)
    program = compile_module(exe._source, lower=False, **options)
    return program, emulate.run_program(program, args), g.reference(*args)


@pytest.mark.parametrize("build", CASES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_emulated_matmul_matches_numpy(build, fusion):
    g = Graph(build.__name__)
    build(g)
    program, got, want = _run(g, fusion)
    assert any(k.emitter == "matmul" for k in program.kernels.values())
    assert_close(got, want)


@pytest.mark.parametrize("build", CASES, ids=lambda f: f.__name__)
def test_eight_rows_per_thread(build, monkeypatch):
    """OPFUSE_MATMUL_ROWS=8: 128-row tiles (two staging passes for A, 8-wide A reads)."""
    monkeypatch.setenv("OPFUSE_MATMUL_ROWS", "8")
    g = Graph(build.__name__)
    build(g)
    program, got, want = _run(g, True)
    assert all(k.block == (16, 16, 1) for k in program.kernels.values() if k.emitter == "matmul")
    assert "vector<8x" in program.kernels_ir  # the thread's 8 rows of A, read as one vector
    assert_close(got, want)


def test_bad_rows_per_thread_is_a_user_error(monkeypatch):
    monkeypatch.setenv("OPFUSE_MATMUL_ROWS", "3")
    g = Graph("short_k")
    short_k(g)
    with pytest.raises(OpfuseError, match="OPFUSE_MATMUL_ROWS='3': expected one of 4, 8"):
        _run(g, True)


def test_f16_operands_accumulate_in_f32():
    """With matmul=simt (f16 operands get tensor cores by default: test_codegen_mma.py)."""
    g = Graph("f16_linear", dtype="f16")
    x, w = g.input("x", (33, 48)), g.input("w", (48, 40))
    g.output(g.matmul(x, w))
    program, (got,), (want,) = _run(g, True, matmul="simt")
    assert [k.emitter for k in program.kernels.values()] == ["matmul"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3
    )


def test_staging_follows_the_operand_layout():
    """Q Kᵀ stages both operands along K, with 16-byte loads: no scalar gathers of Kᵀ."""
    g = Graph("scores")
    scores_k_contiguous(g)
    exe = compile_cpu(g)
    program = compile_module(exe._source, targets=("sm_90",))
    (kernel,) = [k for k in program.kernels.values() if k.emitter == "matmul"]
    loads = [ln.split()[0] for ln in kernel.ptx["sm_90"].splitlines() if "ld.global" in ln]
    assert loads == ["ld.global.nc.v4.b32"] * 2, loads
