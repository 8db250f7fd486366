"""Scatter-adds (an embedding's gradient): recognized from their one-hot reduction as
``OpKind.SCATTER`` (``analysis/scatter.py``), a ``scatter`` kernel on the GPU (a thread per
update, an atomic add into the row its index picks: ``backends/gpu/emit/scatter.py``) and
a loop over the updates on the CPU (``backends/cpu/scatter.py``). Checked against a plain
Python loop in f32 (independent of the builder's numpy reference): repeated ids, a padding
id, ids outside the rows (negative, too large: they add nothing), i32 ids, f16 updates,
several width dims, and the CPU program fused and unfused (bit for bit: the loop adds in the
generic's order); the kernel in the emulator (race check on); what is not a scatter stays a
reduction.
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse

from opfuse.analysis.opinfo import OpKind, describe_all
from opfuse.backends.gpu.compiler import compile_module
from opfuse.backends.gpu.lower import ptxas
from opfuse.builder import Graph
from opfuse.ir import make_context, parse_module
from opfuse.testing.emulator import emulate

from test_codegen_common import as_tuple, compile_cpu

RNG = np.random.default_rng(0)


def _loop(updates: np.ndarray, ids: np.ndarray, rows: int, skip) -> np.ndarray:
    """The sum, one update at a time in position order, in f32."""
    k = ids.ndim
    out = np.zeros((rows, *updates.shape[k:]), np.float32)
    for pos in np.ndindex(*ids.shape):
        i = int(ids[pos])
        if 0 <= i < rows and i != skip:
            out[i] = out[i] + updates[pos].astype(np.float32)
    return out


def _graph(update_shape, ids_shape, rows, skip, dtype="f32", ids_dtype="i64"):
    g = Graph("embedding_grad")
    dy = g.input("dy", update_shape, dtype)
    ids = g.input("ids", ids_shape, ids_dtype)
    g.output(g.scatter_add(dy, ids, rows, skip=skip))
    return g


CASES = [
    ((2, 5, 8), (2, 5), 7, 3, "f32", "i64"),  # a padding id, ids outside [0, 7)
    ((300, 8), (300,), 50, None, "f32", "i64"),  # many repeats per row
    ((3, 4, 33), (3,), 20, None, "f32", "i32"),  # two width dims, i32 ids
    ((4, 9, 16), (4, 9), 1000, 0, "f16", "i64"),  # f16 summed in f32, rounded once
    ((64, 1), (64,), 3, None, "f32", "i64"),  # width 1: every thread of a row collides
]


@pytest.mark.parametrize("update_shape, ids_shape, rows, skip, dtype, ids_dtype", CASES)
def test_scatter_matches_a_loop_everywhere(update_shape, ids_shape, rows, skip, dtype, ids_dtype):
    g = _graph(update_shape, ids_shape, rows, skip, dtype, ids_dtype)
    np_dtype = np.float16 if dtype == "f16" else np.float32
    dy = RNG.standard_normal(update_shape).astype(np_dtype)
    ids = RNG.integers(-3, rows + 3, ids_shape).astype(np.int32 if ids_dtype == "i32" else np.int64)
    if skip is not None:
        ids.flat[:2] = skip
    want = _loop(dy, ids, rows, skip)
    fused = compile_cpu(g)
    assert [k["kind"] for k in fused.report["kernels"]][0] == "scatter"
    for exe in (fused, compile_cpu(g, fusion=False)):
        got = exe(dy, ids)
        assert got.dtype == np_dtype
        np.testing.assert_array_equal(got, want.astype(np_dtype))  # the generic's order
    np.testing.assert_allclose(g.reference(dy, ids)[0].astype(np.float32), want,
                               rtol=1e-5, atol=1e-5)
    program = compile_module(fused._source, lower=False)
    emitters = [k.emitter for k in program.kernels.values()]
    assert emitters[0] == "scatter", program.notes
    got = emulate.run_program(program, [dy, ids])[0]
    # the atomics' order is the hardware's: f32 rounding of each sum
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3 if dtype == "f16" else 1e-5,
                               atol=2e-3 if dtype == "f16" else 1e-5)


def test_scatter_kernel_zeroes_its_result_and_counts_updates_not_rows():
    g = _graph((512, 64), (512,), 50257, None)
    exe = compile_cpu(g)
    (kernel,) = exe.report["kernels"]
    # the payload's compare, select and add once per update, not once per row for each
    assert kernel["flops"] == 3 * 512 * 64
    program = compile_module(exe._source, lower=False)
    (spec,) = program.kernels.values()
    assert spec.zeroed == (0,) and spec.meta["atomics"] == 512 * 64
    ids = RNG.integers(0, 50257, 512)
    dy = RNG.standard_normal((512, 64)).astype(np.float32)
    np.testing.assert_array_equal(exe(dy, ids), _loop(dy, ids, 50257, None))


def test_scatter_kernel_assembles_without_spills():
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not found (the PTX itself is checked by test/codegen/scatter.mlir)")
    program = compile_cpu(_graph((4, 16, 32), (4, 16), 100, 0)).gpu_program(
        ("sm_80", "sm_90"), ptxas=True)
    (spec,) = program.kernels.values()
    assert "atom.global.add.f32" in spec.ptx["sm_90"]
    for chip in ("sm_80", "sm_90"):
        res = spec.resources[chip]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (chip, res)


_ONE_HOT = """
func.func @f(%x: tensor<6x4xf32>, %ids: tensor<6xi64>) -> tensor<5x4xf32> {
  %e = tensor.empty() : tensor<5x4xf32>
  %z = arith.constant 0.0 : f32
  %i = linalg.fill ins(%z : f32) outs(%e : tensor<5x4xf32>) -> tensor<5x4xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (XMAP)>,
                                        affine_map<(d0, d1, d2) -> (d2)>,
                                        affine_map<(d0, d1, d2) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x, %ids : tensor<6x4xf32>, tensor<6xi64>) outs(%i : tensor<5x4xf32>) {
  ^bb0(%a: f32, %id: i64, %acc: f32):
    %v = linalg.index 0 : index
    %vi = arith.index_cast %v : index to i64
    %hit = arith.cmpi PRED, %id, %vi : i64
    %zero = arith.constant FALSE : f32
    %s = arith.select %hit, %a, %zero : f32
    %o = arith.addf %acc, %s : f32
    linalg.yield %o : f32
  } -> tensor<5x4xf32>
  return %y : tensor<5x4xf32>
}
"""


@pytest.mark.parametrize("pred, false, xmap, kind", [
    ("eq", "0.0", "d2, d1", OpKind.SCATTER),
    ("ne", "0.0", "d2, d1", OpKind.REDUCTION),  # every other row: not one row per update
    ("eq", "1.0", "d2, d1", OpKind.REDUCTION),  # adds 1 where the id differs
    ("eq", "0.0", "d0, d1", OpKind.REDUCTION),  # an input reads the rows loop
])
def test_only_a_one_hot_sum_is_a_scatter(pred, false, xmap, kind):
    """The written one-hot sum, evaluated directly in numpy, is what the CPU program and
    the emulated kernels compute, recognized or not."""
    rows_input = xmap == "d0, d1"
    text = _ONE_HOT.replace("PRED", pred).replace("FALSE", false).replace("XMAP", xmap)
    if rows_input:
        text = text.replace("tensor<6x4xf32>", "tensor<5x4xf32>")
    module = parse_module(text, make_context())
    func = module.body.operations[0]
    ops = [o.operation for o in func.regions[0].blocks[0].operations]
    assert [i.kind for i in describe_all(func.operation, ops)][3] == kind
    X = RNG.standard_normal((5, 4) if rows_input else (6, 4)).astype(np.float32)
    ids = np.array([0, 2, 2, 7, -1, 4])
    v, t = np.arange(5)[:, None, None], np.arange(6)[None, None, :]
    hit = (ids[t] == v) if pred == "eq" else (ids[t] != v)
    x = X[v[..., 0], np.arange(4)[None, :]][..., None] if rows_input else X.T[None, :, :]
    want = np.where(hit, x, float(false)).sum(-1)
    exe = opfuse.compile(text, backend="cpu")
    np.testing.assert_allclose(exe(X, ids), want, rtol=1e-6, atol=1e-6)
    got = emulate.run_program(compile_module(exe._source, lower=False), [X, ids])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _run_everywhere(g, args, want, kinds):
    """CPU fused and unfused, and the emulated kernels, against ``want``; the fused
    kernels' kinds are ``kinds``."""
    fused = compile_cpu(g)
    assert [k["kind"] for k in fused.report["kernels"]] == kinds
    for exe in (fused, compile_cpu(g, fusion=False)):
        for got, w in zip(as_tuple(exe(*args)), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    program = compile_module(fused._source, lower=False)
    for got, w in zip(emulate.run_program(program, list(args)), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    return program


def test_embedding_gradients_join_the_row_kernel_that_computes_them():
    """GPT-2's embeddings' backward in small: a row kernel (x - mean(x) over 2 x 8 tokens of
    33: a tail past the vector width), its result scattered into the token rows and summed
    over the batch (the position gradient): one kernel, adding both atomically."""
    g = Graph("embeddings_backward")
    dy = g.input("dy", (2, 8, 33))
    ids = g.input("ids", (2, 8), "i64")
    dx = g.sub(dy, g.mean(dy, -1, keepdims=True))
    g.output(g.scatter_add(dx, ids, 50, name="dwte"))
    g.output(g.sum(dx, 0, name="dwpe"))
    DY = RNG.standard_normal((2, 8, 33)).astype(np.float32)
    I = RNG.integers(-1, 51, (2, 8))
    I[1, :4] = I[0, 0]
    DX = DY - DY.mean(-1, keepdims=True)
    program = _run_everywhere(g, (DY, I), (_loop(DX, I, 50, None), DX.sum(0)), ["input"])
    (spec,) = program.kernels.values()
    assert spec.emitter == "rows" and spec.zeroed == (0, 1)


def test_a_scatter_takes_the_loop_kernel_of_its_updates():
    """Elementwise updates (a GELU-like backward) feeding a scatter: read once, one kernel;
    where the loop's result is returned too, the loop kernel adds each element it computes."""
    for returned in (False, True):
        g = Graph("tanh_backward")
        dy = g.input("dy", (6, 5, 16))
        ids = g.input("ids", (6, 5), "i64")
        u = g.mul(g.tanh(dy), 2.0)
        g.output(g.scatter_add(u, ids, 9, skip=2))
        if returned:
            g.output(u)
        DY = RNG.standard_normal((6, 5, 16)).astype(np.float32)
        I = RNG.integers(0, 9, (6, 5))
        U = (np.tanh(DY.astype(np.float64)) * 2).astype(np.float32)
        want = (_loop(U, I, 9, 2), U) if returned else (_loop(U, I, 9, 2),)
        program = _run_everywhere(g, (DY, I), want, ["scatter"])
        (spec,) = program.kernels.values()
        assert spec.emitter == ("loop" if returned else "scatter"), program.notes


def test_deterministic_scatter_adds_in_order_without_atomics():
    """``atomics=0`` (set under ``torch.use_deterministic_algorithms``): the scatter stays a
    kernel of its own, marked ``opfuse.ordered``, whose GPU kernel gives each column one
    thread walking the tokens in order: no atomics, the CPU's sum bit for bit."""
    g = Graph("embeddings_backward")
    dy = g.input("dy", (3, 7, 40))
    ids = g.input("ids", (3, 7), "i64")
    g.output(g.scatter_add(g.mul(dy, 0.5), ids, 11, skip=0))
    exe = opfuse.compile(g, backend="cpu", atomics=False)
    assert [k["kind"] for k in exe.report["kernels"]] == ["loop", "scatter"]
    program = compile_module(exe._source, lower=False)
    spec = [k for k in program.kernels.values() if k.emitter == "scatter"][0]
    assert spec.meta["ordered"] and spec.meta["atomics"] == 0 and spec.grid[0] == 1
    assert "atom." not in exe.gpu_program(("sm_90",)).kernels[spec.name].ptx["sm_90"]
    DY = RNG.standard_normal((3, 7, 40)).astype(np.float32)
    I = RNG.integers(-1, 12, (3, 7))
    I[2, :5] = 4
    cpu = exe(DY, I)
    np.testing.assert_array_equal(cpu, _loop(DY * np.float32(0.5), I, 11, 0))
    for _ in range(2):  # run to run, and against the CPU: the same bits
        np.testing.assert_array_equal(emulate.run_program(program, [DY, I])[0], cpu)
