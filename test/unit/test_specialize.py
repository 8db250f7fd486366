"""Entry functions with ``?`` dims: specialized at given sizes (``frontends.mlir.specialize``)
and compiled per call's shapes (``opfuse.compile`` -> ``SpecializedExecutable``), checked
against numpy. The input is written the way IREE's and torch-mlir's dynamic exports write
sizes: ``tensor.dim`` of an argument, ``tensor.empty(%d)``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import opfuse
from opfuse import ir as oir
from opfuse.driver.specialized import SpecializedExecutable
from opfuse.errors import OpfuseError
from opfuse.frontends.mlir import specialize as sp

# tanh(x + b) normalized by its row sums: an elementwise producer, a row reduction and
# its consumer; rows and columns both dynamic, b's size equated to x's columns by the maps.
ROW_NORM = """
func.func @f(%x: tensor<?x?xf32>, %b: tensor<?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %x, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %x, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %b : tensor<?x?xf32>, tensor<?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%a: f32, %bb: f32, %o: f32):
    %s = arith.addf %a, %bb : f32
    %t = math.tanh %s : f32
    linalg.yield %t : f32
  } -> tensor<?x?xf32>
  %z = tensor.empty(%d0) : tensor<?xf32>
  %zero = arith.constant 0.0 : f32
  %zf = linalg.fill ins(%zero : f32) outs(%z : tensor<?xf32>) -> tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%y : tensor<?x?xf32>) outs(%zf : tensor<?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %a, %o : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  %q = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%y, %r : tensor<?x?xf32>, tensor<?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %s = arith.divf %a, %m : f32
    linalg.yield %s : f32
  } -> tensor<?x?xf32>
  return %q : tensor<?x?xf32>
}
"""


def _row_norm(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = np.tanh(x.astype(np.float64) + b)
    return y / y.sum(axis=1, keepdims=True)


def test_specialized_text_is_static_and_keeps_the_program():
    text = sp.specialize(ROW_NORM, [(4, 8), (8,)])
    oir.parse_module(text)  # verifies
    assert "tensor<?" not in text
    assert "tensor<4x8xf32>" in text and "tensor<4xf32>" in text
    assert "tensor.dim" not in text and text.count("linalg.generic") == 3


@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 13), (300, 257)])
def test_one_executable_serves_every_shape(rows: int, cols: int):
    exe = opfuse.compile(ROW_NORM, backend="cpu")
    assert isinstance(exe, SpecializedExecutable)
    rng = np.random.default_rng(rows)
    x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    b = rng.uniform(-1, 1, cols).astype(np.float32)
    np.testing.assert_allclose(exe(x, b), _row_norm(x, b), rtol=2e-5, atol=1e-6)
    totals = exe.report["totals"]
    assert (totals["before"]["kernels"], totals["after"]["kernels"]) == (3, 1)
    assert exe.report["shapes"] == [[rows, cols], [cols]]


def test_shapes_are_compiled_once_each():
    exe = opfuse.compile(ROW_NORM, backend="cpu")
    for rows in (2, 3, 2):
        exe(np.ones((rows, 4), np.float32), np.ones(4, np.float32))
    assert list(exe.specializations) == [((2, 4), (4,)), ((3, 4), (4,))]
    assert "2 shape(s) compiled" in repr(exe)


def test_unfused_and_fused_agree_at_a_size():
    fused = opfuse.compile(ROW_NORM, backend="cpu")
    unfused = opfuse.compile(ROW_NORM, backend="cpu", fusion=False)
    x, b = np.random.default_rng(1).uniform(-1, 1, (5, 9)).astype(np.float32), np.ones(9, np.float32)
    np.testing.assert_allclose(fused(x, b), unfused(x, b), rtol=1e-6)
    assert unfused.report["totals"]["after"]["kernels"] == 3


def test_contradicting_sizes_name_the_op():
    exe = opfuse.compile(ROW_NORM, backend="cpu")
    with pytest.raises(OpfuseError, match=r"sizes contradict the program .*'linalg.generic'.*9"):
        exe(np.ones((4, 8), np.float32), np.ones(9, np.float32))


def test_wrong_rank_or_static_dim_is_refused():
    with pytest.raises(OpfuseError, match=r"argument 0 is \?x\?, got shape \(4, 8, 1\)"):
        sp.specialize(ROW_NORM, [(4, 8, 1), (8,)])
    partly = ROW_NORM.replace("%x: tensor<?x?xf32>", "%x: tensor<?x8xf32>").replace(
        "tensor.dim %x, %c0 : tensor<?x?xf32>", "tensor.dim %x, %c0 : tensor<?x8xf32>").replace(
        "tensor.dim %x, %c1 : tensor<?x?xf32>", "tensor.dim %x, %c1 : tensor<?x8xf32>").replace(
        "ins(%x, %b : tensor<?x?xf32>", "ins(%x, %b : tensor<?x8xf32>")
    with pytest.raises(OpfuseError, match=r"argument 0 is \?x8, got shape \(4, 9\)"):
        sp.specialize(partly, [(4, 9), (9,)])
    with pytest.raises(OpfuseError, match="takes 2 arguments, got 1"):
        sp.specialize(ROW_NORM, [(4, 8)])


def test_a_size_read_from_data_is_refused_by_name():
    text = """
func.func @f(%x: tensor<?xf32>, %n: tensor<i64>) -> tensor<?xf32> {
  %v = tensor.extract %n[] : tensor<i64>
  %i = arith.index_cast %v : i64 to index
  %e = tensor.empty(%i) : tensor<?xf32>
  return %e : tensor<?xf32>
}
"""
    with pytest.raises(OpfuseError, match=r"'tensor.empty' \(tensor<\?xf32>\) does not follow"):
        sp.specialize(text, [(4,), ()])


def test_uniform_shapes_and_argument_dims():
    func = oir.find_entry(oir.parse_module(ROW_NORM))
    assert sp.is_dynamic(func)
    assert sp.argument_shapes(func) == [[None, None], [None]]
    assert sp.uniform_shapes(func, 5) == [(5, 5), (5,)]


def test_report_before_any_call_says_what_to_do():
    exe = opfuse.compile(ROW_NORM, backend="cpu")
    with pytest.raises(OpfuseError, match="call it"):
        exe.report


# --- real torch-mlir output with torch.export Dims (test/Inputs/torch-mlir/export.py) ----

INPUTS = Path(__file__).resolve().parents[1] / "Inputs" / "torch-mlir"


@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (300, 64)])
def test_torch_mlir_dynamic_softmax_matches_numpy(shape):
    exe = opfuse.compile(str(INPUTS / "softmax_dynamic.mlir"), backend="cpu")
    x = np.random.default_rng(0).uniform(-3, 3, shape).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(exe(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    static = opfuse.compile(sp.specialize((INPUTS / "softmax_dynamic.mlir").read_text(),
                                          [shape]), backend="cpu")
    assert exe.report["totals"] == static.report["totals"]


@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (300, 64)])
def test_torch_mlir_dynamic_layernorm_linear_gelu_matches_torch(shape):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)  # export.py's model, rebuilt: the weights in the file are these
    norm = torch.nn.LayerNorm(64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    fc = torch.nn.Linear(64, 32)
    exe = opfuse.compile(str(INPUTS / "ln_linear_gelu_dynamic.mlir"), backend="cpu")
    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    with torch.no_grad():
        want = torch.nn.functional.gelu(fc(norm(torch.from_numpy(x)))).numpy()
    np.testing.assert_allclose(exe(x), want, rtol=1e-4, atol=1e-5)
    static = opfuse.compile(sp.specialize((INPUTS / "ln_linear_gelu_dynamic.mlir").read_text(),
                                          [shape]), backend="cpu")
    assert exe.report["totals"] == static.report["totals"]


def test_torch_mlir_dynamic_softmax_fuses_like_its_static_export():
    """At the static export's size (32x64) the dynamic export, specialized, fuses exactly
    as torch-mlir's static output of the same model does (two files torch-mlir wrote)."""
    dynamic = opfuse.compile(str(INPUTS / "softmax_dynamic.mlir"), backend="cpu")
    static = opfuse.compile(str(INPUTS / "softmax.mlir"), backend="cpu")
    x = np.random.default_rng(2).uniform(-1, 1, (32, 64)).astype(np.float32)
    np.testing.assert_allclose(dynamic(x), static(x), rtol=1e-6, atol=1e-8)
    assert dynamic.report["totals"] == static.report["totals"]
