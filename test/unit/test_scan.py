"""Scans (``cumsum``): recognized from their triangular reduction as ``OpKind.SCAN``
(``analysis/scan.py``), a ``scan`` group that takes the loop groups over its domain
(``opfuse-fuse-scan``) and a warp/block scan kernel (``backends/gpu/emit/scan.py``). Checked: the
builder's reference against numpy, the CPU program fused and unfused, and the scan kernel
in the emulator (race check on) against numpy: rows shorter than a warp, longer than a
block's tile (several tiles carried by the loop), lengths that are not powers of two, row
counts that do not fill the last block, every axis, f32/f16/i32/i64; ptxas 0 spills at
sm_80/sm_90; what is not a scan stays a reduction.
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.analysis.opinfo import OpKind, describe_all
from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.gpu.compiler import compile_module
from opfuse.ir import make_context, parse_module

from test_codegen_common import assert_everywhere, compile_cpu

RNG = np.random.default_rng(0)
_NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def _data(shape, dtype):
    if dtype.startswith("i"):
        return RNG.integers(-50, 50, shape).astype(_NP[dtype])
    return RNG.uniform(-1, 1, shape).astype(_NP[dtype])


def _scan_kernels(graph):
    exe = compile_cpu(graph)
    program = compile_module(exe._source, lower=False)
    return exe, program


@pytest.mark.parametrize(
    "shape, axis, dtype",
    [
        ((2, 9), 1, "i64"),  # short rows: a warp each, 8 rows per block, 6 idle
        ((3, 37), 1, "i32"),  # 37: not a power of two, more than a warp
        ((5, 1000), 1, "f32"),  # 4 per thread, 256 threads: one masked tile
        ((3, 2500), 1, "i64"),  # longer than a tile of 1024: three tiles, a carry
        ((2, 300), 1, "f16"),  # accumulated in f32, rounded after
        ((7, 5, 3), 0, "f32"),  # a leading axis: strided rows, 15 of them
        ((4, 130, 3), 1, "i32"),  # a middle axis
    ],
)
def test_scan_kernel_matches_numpy(shape, axis, dtype):
    g = Graph("scan")
    x = g.input("x", shape, dtype)
    g.output(g.cumsum(x, axis))
    X = _data(shape, dtype)
    if dtype.startswith("i"):  # exact: the reference, both CPU programs and the kernel
        exe = assert_everywhere(g, [X], [np.cumsum(X, axis).astype(X.dtype)])
        program = compile_module(exe._source, lower=False)
    else:  # against float64: f32 rounding of the sum (f16: of the result)
        want = np.cumsum(X.astype(np.float64), axis)
        tol = dict(rtol=1e-2, atol=1e-2) if dtype == "f16" else dict(rtol=1e-5, atol=2e-5)
        exe, program = _scan_kernels(g)
        runs = (exe(X), compile_cpu(g, fusion=False)(X), emulate.run_program(program, [X])[0])
        for got in runs:
            assert got.dtype == X.dtype
            np.testing.assert_allclose(got.astype(np.float64), want, **tol)
    assert [k.emitter for k in program.kernels.values()] == ["scan"], program.notes
    assert exe.report["kernels"][0]["kind"] == "scan"


def test_long_float_rows_are_summed_in_tiles():
    """5000 per row: five tiles of 1024, each adding the running total of the ones
    before; the error stays at f32 rounding of the sum (against float64)."""
    g = Graph("long")
    x = g.input("x", (3, 5000))
    g.output(g.cumsum(x, 1))
    X = _data((3, 5000), "f32")
    exe, program = _scan_kernels(g)
    (spec,) = program.kernels.values()
    assert spec.meta == {"team": 256, "items": 4, "tiles": 5, "rows_per_block": 1}
    got = emulate.run_program(program, [X])[0]
    np.testing.assert_allclose(got, np.cumsum(X.astype(np.float64), 1), rtol=0, atol=2e-4)


def test_position_ids_are_one_scan_kernel():
    """RoBERTa's position ids: the mask it counts and the arithmetic after it join the
    scan (6 ops, 1 kernel)."""
    g = Graph("positions")
    ids = g.input("ids", (2, 9), "i64")
    m = g.cast(g.ne(ids, 1), "i32")
    g.output(g.add(g.cast(g.mul(g.cumsum(m, 1), m), "i64"), 1))
    I = RNG.integers(0, 4, (2, 9))
    M = (I != 1).astype(np.int32)
    exe = assert_everywhere(g, [I], [(np.cumsum(M, 1) * M).astype(np.int64) + 1], kernels=1)
    assert exe.report["kernels"][0]["kind"] == "scan"


def test_scan_kernels_assemble_without_spills():
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not found (the PTX itself is checked by test/codegen/scan.mlir)")
    for shape, dtype in (((4, 5000), "f32"), ((2, 9), "i64"), ((8, 300), "i32")):
        g = Graph("scan")
        x = g.input("x", shape, dtype)
        g.output(g.cumsum(x, 1) * 3)
        program = compile_cpu(g).gpu_program(("sm_80", "sm_90"), ptxas=True)
        (spec,) = program.kernels.values()
        assert spec.emitter == "scan"
        assert "shfl.sync.up.b32" in spec.ptx["sm_90"]
        for chip in ("sm_80", "sm_90"):
            res = spec.resources[chip]
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (shape, chip, res)


_NOT_A_SCAN = """
func.func @f(%x: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %e = tensor.empty() : tensor<4x6xf32>
  %z = arith.constant 0.0 : f32
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<4x6xf32>) -> tensor<4x6xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                                        affine_map<(d0, d1, d2) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x : tensor<4x6xf32>) outs(%i : tensor<4x6xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %j = linalg.index 1 : index
    %r = linalg.index 2 : index
    %in = arith.cmpi PRED, %r, %j : index
    %s = arith.addf %acc, %a : f32
    %o = arith.select %in, %s, %acc : f32
    linalg.yield %o : f32
  } -> tensor<4x6xf32>
  return %y : tensor<4x6xf32>
}
"""


@pytest.mark.parametrize("pred, kind", [("ule", OpKind.SCAN), ("sle", OpKind.SCAN),
                                        ("ult", OpKind.REDUCTION), ("uge", OpKind.REDUCTION)])
def test_only_an_inclusive_running_sum_is_a_scan(pred, kind):
    """``r <= j`` is cumsum; ``r < j`` (exclusive) and ``r >= j`` (a suffix sum) are other
    sums: they stay reductions, which the rows kernel computes as written (and the CPU
    agrees with numpy either way)."""
    text = _NOT_A_SCAN.replace("PRED", pred)
    module = parse_module(text, make_context())
    func = module.body.operations[0]
    ops = [o.operation for o in func.regions[0].blocks[0].operations]
    kinds = [i.kind for i in describe_all(func.operation, ops)]
    assert kinds[3] == kind
    X = _data((4, 6), "f32")
    r, j = np.arange(6)[None, :, None], np.arange(6)[:, None, None]
    sel = {"ule": r <= j, "sle": r <= j, "ult": r < j, "uge": r >= j}[pred][..., 0]
    want = (X[:, None, :] * sel[None]).sum(-1)
    exe = opfuse.compile(text, backend="cpu")
    np.testing.assert_allclose(exe(X), want, rtol=1e-6, atol=1e-6)
    got = emulate.run_program(compile_module(exe._source, lower=False), [X])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
