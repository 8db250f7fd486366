"""The tensor-core matmul emitter (backends/gpu/emit/matmul_mma.py on backends/gpu/build/mma.py), emulated.

Each case is compiled to kernels, run by the emulator (race check on: it also checks the
cp.async protocol: no stage is read while a copy into it is in flight, none is refilled
while another thread may still read it) and compared with the builder's numpy reference.
The shapes pick the emitter's branches: operands stored along K or along M/N (ldmatrix
with and without .trans), M, N and K tails (zero-filled copies), K extents that only 8- or
4-byte copies divide, an odd K (no cp.async: evaluator loads and shared stores), an odd N
(one column per store), an operand computed in the kernel (a concatenation), more K slabs than
pipeline stages, batches, transposed results, f16, bf16 and TF32.

Tolerances, relative to max(1, max |reference|): f16 1e-2, bf16 3e-2 (one rounding of
the result to 8 significant bits is 2e-3; the reference rounds every intermediate
tensor, the kernel keeps f32 accumulators), TF32 5e-3 (operands rounded to 11 bits, K up
to 160 terms).
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.builder import Graph
from opfuse.backends.gpu.build import async_copy
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.emit import matmul_mma
from opfuse.backends.gpu.compiler import compile_module
from opfuse.backends.gpu.lower.ptxas import find_ptxas
from opfuse.errors import OpfuseError
from opfuse.ir import make_context, parse_module
from opfuse.runtime.schedule import float32_to_bf16_bits
from opfuse.runtime.schedule import bind_params, plan_buffers, run_numpy

from test_codegen_common import compile_cpu, inputs_of

TOL = {"f16": 1e-2, "bf16": 3e-2, "f32": 5e-3}


def run_emulated(program, device_args):
    """(emulator, outputs) of ``program`` on ``device_args``: every kernel emulated (race
    check on, bank-conflict counters), result buffers filled with NaN (bf16: 0xFFFF)
    first so that an element no kernel wrote shows, except those the runtime zeroes
    (``KernelSpec.zeroed``: a column sum added atomically)."""
    emu = emulate.Emulator(parse_module(program.outlined_ir, make_context()), bank_stats=True)

    def call(func, fargs, results):
        spec = program.kernels[func]
        for r in results:
            r.fill(0xFFFF if r.dtype == np.uint16 else np.nan)  # unwritten elements show
        for i in spec.zeroed:  # the runtime's part
            results[i].fill(0)
        emu.run_entry(spec.entry, spec.grid, spec.block, bind_params(spec, fargs, results))

    return emu, run_numpy(program.schedule, plan_buffers(program.schedule), device_args, call)


def emulated(g: Graph, inputs=None, **options):
    """(program, emulator, outputs as float64, reference as float64) of ``g``'s kernels,
    on ``inputs`` (default: the graph's example inputs)."""
    args = inputs_of(g) if inputs is None else inputs
    program = compile_module(compile_cpu(g)._source, lower=False, **options)
    device_args = [float32_to_bf16_bits(a) if g.dtype == "bf16" else a for a in args]
    emu, got = run_emulated(program, device_args)
    got = [
        (x.astype(np.uint32) << 16).view(np.float32) if x.dtype == np.uint16 else x for x in got
    ]
    want = g.reference(*args)
    return program, emu, [x.astype(np.float64) for x in got], [w.astype(np.float64) for w in want]


def check(g: Graph, **options):
    program, emu, got, want = emulated(g, **options)
    tol = TOL[g.dtype]
    for x, w in zip(got, want):
        assert not np.isnan(x).any()
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(x, w, rtol=0, atol=tol * scale)
    return program, emu


def linear(g):  # B = w: stored along N (ldmatrix.trans); M, N tails; bias + GELU epilogue
    x, w, b = g.input("x", (70, 64)), g.input("w", (64, 66)), g.input("b", (66,))
    g.output(g.gelu(g.matmul(x, w) + b))


def weight_t(g):  # B = wᵀ (torch's Linear): stored along K (ldmatrix without .trans)
    x, w = g.input("x", (40, 48)), g.input("w", (72, 48))
    g.output(g.matmul(x, g.transpose(w, (1, 0))))


def input_t(g):  # A = xᵀ: stored along M (ldmatrix.trans of A)
    x, w = g.input("x", (48, 40)), g.input("w", (48, 24))
    g.output(g.matmul(g.transpose(x, (1, 0)), w))


def k_tail_8_bytes(g):  # K = 36: 8-byte copies (4 elements), a partial last slab
    x, w = g.input("x", (33, 36)), g.input("w", (36, 40))
    g.output(g.matmul(x, w))


def odd_k(g):  # K = 33: no copy size divides the rows: evaluator staging, both operands
    x, w = g.input("x", (20, 33)), g.input("w", (33, 32))
    g.output(g.relu(g.matmul(x, w)))


def odd_n(g):  # N = 45: one column per epilogue store, N tail; B staged by the evaluator
    x, w = g.input("x", (32, 64)), g.input("w", (64, 45))
    g.output(g.tanh(g.matmul(x, w)))


def concat_operand(g):  # A = [x1 | x2] along K, fused: A computed while staging
    x1, x2, w = g.input("x1", (48, 32)), g.input("x2", (48, 32)), g.input("w", (64, 64))
    g.output(g.matmul(g.concat([x1, x2], axis=1), w))


def deep_k(g):  # K = 160: five slabs, more than the pipeline's stages
    x, w = g.input("x", (32, 160)), g.input("w", (160, 32))
    g.output(g.matmul(x, w))


def scores(g):  # Q Kᵀ per head (batch 4), scaled: B stored along K
    q, k = g.input("q", (2, 2, 40, 32)), g.input("k", (2, 2, 24, 32))
    g.output(g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.125))


def heads_merged(g):  # P V, then heads next to the sequence: a transposed store
    p, v = g.input("p", (3, 17, 32)), g.input("v", (3, 32, 16))
    g.output(g.transpose(g.matmul(p, v), (1, 0, 2)))


CASES = [linear, weight_t, input_t, k_tail_8_bytes, odd_k, odd_n, concat_operand, deep_k]
CASES += [scores]
CASES += [heads_merged]


@pytest.mark.parametrize("build", CASES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_emulated_mma_matches_numpy(build, dtype):
    g = Graph(build.__name__, dtype=dtype)
    build(g)
    program, emu = check(g)
    assert [k.emitter for k in program.kernels.values() if k.name.endswith("_output")] == ["mma"]
    assert emu.stats.mma > 0
    # every ldmatrix phase conflict-free: the padded rows put 8 rows in 8 bank groups
    assert emu.stats.ldmatrix_wavefronts == emu.stats.ldmatrix_matrices
    assert emu.stats.shared_load_wavefronts == emu.stats.shared_loads


@pytest.mark.parametrize("build", [linear, weight_t, input_t, odd_n], ids=lambda f: f.__name__)
def test_tf32_when_allowed(build):
    """f32 operands: SIMT by default (IEEE, like PyTorch's allow_tf32=False), m16n8k8 TF32
    tensor cores with allow_tf32 (B stored along N: element loads, ldmatrix cannot
    transpose 32-bit elements)."""
    g = Graph(build.__name__)
    build(g)
    program = compile_module(compile_cpu(g)._source, lower=False)
    assert {k.emitter for k in program.kernels.values()} == {"matmul"}
    program, emu = check(g, allow_tf32=True)
    assert {k.emitter for k in program.kernels.values()} == {"mma"}
    assert "nvvm.convert.float.to.tf32" in program.kernels_ir and emu.stats.mma > 0
    # element loads of fragments ldmatrix cannot transpose: conflict-free too (row stride
    # 8 banks mod 32)
    assert emu.stats.shared_load_wavefronts == emu.stats.shared_loads


def test_tf32_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPFUSE_ALLOW_TF32", "1")
    g = Graph("weight_t")
    weight_t(g)
    program, _ = check(g)
    assert {k.emitter for k in program.kernels.values()} == {"mma"}


def two_linears(g):
    x, w1, w2 = g.input("x", (32, 32)), g.input("w1", (32, 32)), g.input("w2", (32, 32))
    g.output(g.matmul(g.tanh(g.matmul(x, w1)), w2))


def test_variant_per_kernel(monkeypatch):
    """``matmul=`` picks the variant per kernel: one SIMT, one MMA in the same program,
    the same results; $OPFUSE_MATMUL does the same when the option is not given."""
    g = Graph("two", dtype="f16")
    two_linears(g)
    names = sorted(compile_module(compile_cpu(g)._source, lower=False).kernels)
    spec = f"{names[0]}=simt,auto"
    program, _ = check(g, matmul=spec)
    assert [program.kernels[n].emitter for n in names] == ["matmul", "mma"]
    assert not program.notes  # a variant not chosen leaves no note
    monkeypatch.setenv("OPFUSE_MATMUL", "simt")
    program, _ = check(g)
    assert {k.emitter for k in program.kernels.values()} == {"matmul"}
    with pytest.raises(OpfuseError, match="matmul mode 'fast'"):
        compile_module(compile_cpu(g)._source, lower=False, matmul="fast")


def test_the_race_check_covers_the_pipeline(monkeypatch):
    """Break the pipeline and the emulator must say so: waiting for one group too few
    reads a slab whose copies are still in flight; refilling before the barrier
    overwrites a slab other warps may still read."""
    g = Graph("deep_k", dtype="f16")
    deep_k(g)
    real_wait = async_copy.wait
    monkeypatch.setattr(matmul_mma.async_copy, "wait", lambda kb, n: real_wait(kb, n + 1))
    with pytest.raises(OpfuseError, match="still in flight"):
        emulated(g)
    monkeypatch.setattr(matmul_mma.async_copy, "wait", real_wait)

    original = matmul_mma._Kernel.build

    def no_barrier(self):
        from mlir.dialects import gpu

        real = gpu.barrier
        gpu.barrier = lambda *a, **k: None
        try:
            original(self)
        finally:
            gpu.barrier = real

    monkeypatch.setattr(matmul_mma._Kernel, "build", no_barrier)
    with pytest.raises(OpfuseError, match="shared-memory race"):
        emulated(g)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_ptx_has_mma_and_cp_async_and_no_spills(dtype):
    g = Graph("linear", dtype=dtype)
    linear(g)
    program = compile_module(compile_cpu(g)._source, targets=("sm_80", "sm_90"), ptxas=True)
    (k,) = program.kernels.values()
    kind = "bf16" if dtype == "bf16" else "f16"
    for chip in ("sm_80", "sm_90"):
        ptx = k.ptx[chip]
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
        assert "ldmatrix.sync.aligned.m8n8.x4" in ptx
        res = k.resources[chip]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res
