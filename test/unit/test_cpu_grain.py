"""Which kernels' tile loops go to the threads (backends/cpu/grain.py): a kernel whose
estimated one-thread time is under OPFUSE_CPU_PARALLEL_MIN_US keeps its loops on the
calling thread, the others become tasks of the async runtime; either way the results are
the one-thread bits and match numpy float64."""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.backends.cpu import lower as cpu_codegen
from opfuse.backends.cpu import grain as cpu_grain
from opfuse.backends.cpu.kernels import kernel_functions
from opfuse.errors import OpfuseError
from opfuse.ir import parse_module


def _matmul_tanh(m: int, k: int, n: int) -> str:
    """A matmul kernel, then a tanh kernel the planner cannot merge (its input is returned)."""
    return f"""
func.func @f(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>, %c: tensor<64x4096xf32>)
    -> (tensor<{m}x{n}xf32>, tensor<64x4096xf32>) {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{m}x{n}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %p = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>)
                     outs(%f : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %e2 = tensor.empty() : tensor<64x4096xf32>
  %t = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}}
      ins(%c : tensor<64x4096xf32>) outs(%e2 : tensor<64x4096xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %y = math.tanh %x : f32
    linalg.yield %y : f32
  }} -> tensor<64x4096xf32>
  return %p, %t : tensor<{m}x{n}xf32>, tensor<64x4096xf32>
}}"""


def _kernels(source: str) -> dict[str, float]:
    module = parse_module(opfuse.compile(source, backend="cpu", threads=1).ir("fused"))
    from mlir import ir
    return {ir.StringAttr(f.attributes["sym_name"]).value: cpu_grain.estimated_us(f)
            for f in kernel_functions(module)}


def test_estimates_follow_flops_and_bytes():
    est = _kernels(_matmul_tanh(1024, 1024, 1024))
    assert len(est) == 2
    matmul = max(est.values())
    tanh = min(est.values())
    # 2 * 1024^3 FLOPs at 200 GFLOP/s, 12 MiB at 20 GB/s, the fill's 1024^2 stores at
    # 10 G/s: 10.7 ms + 0.63 ms + 0.10 ms
    assert matmul == pytest.approx(
        1e6 * (2 * 1024**3 / 200e9 + 3 * 4 * 1024**2 / 20e9 + 1024**2 / 10e9), rel=1e-6)
    # 2 MiB moved, 262,144 iterations of one body op
    assert tanh == pytest.approx(1e6 * (2 * 4 * 64 * 4096 / 20e9 + 64 * 4096 / 10e9), rel=1e-6)


def _lowered(source: str, threads: int):
    module = parse_module(opfuse.compile(source, backend="cpu", threads=1).ir("fused"))
    return str(cpu_codegen.lower_to_llvm(module, threads=threads))


def test_small_kernels_stay_on_the_calling_thread(monkeypatch):
    monkeypatch.delenv("OPFUSE_CPU_PARALLEL_MIN_US", raising=False)
    small = _lowered(_matmul_tanh(128, 128, 128), threads=2)  # 21 us and 130 us: both small
    assert "llvm.call @mlirAsyncRuntimeExecute" not in small
    big = _lowered(_matmul_tanh(1024, 1024, 1024), threads=2)  # the matmul: ~11 ms
    assert "llvm.call @mlirAsyncRuntimeExecute" in big
    monkeypatch.setenv("OPFUSE_CPU_PARALLEL_MIN_US", "0")
    assert "llvm.call @mlirAsyncRuntimeExecute" in _lowered(_matmul_tanh(128, 128, 128), threads=2)


@pytest.mark.parametrize("limit", ["0", "800", "1e9"])
def test_results_do_not_depend_on_the_split(monkeypatch, limit):
    monkeypatch.setenv("OPFUSE_CPU_PARALLEL_MIN_US", limit)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 512), dtype=np.float32)
    b = rng.standard_normal((512, 384), dtype=np.float32)
    c = rng.standard_normal((64, 4096), dtype=np.float32)
    source = _matmul_tanh(256, 512, 384)
    got = opfuse.compile(source, backend="cpu", threads=2)(a, b, c)
    one = opfuse.compile(source, backend="cpu", threads=1)(a, b, c)
    for g, o in zip(got, one):
        np.testing.assert_array_equal(g, o)
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], np.tanh(c.astype(np.float64)), atol=1e-6)


@pytest.mark.parametrize("bad", ["-1", "fast", "nan"])
def test_a_bad_threshold_is_named(monkeypatch, bad):
    monkeypatch.setenv("OPFUSE_CPU_PARALLEL_MIN_US", bad)
    with pytest.raises(OpfuseError, match="OPFUSE_CPU_PARALLEL_MIN_US"):
        _lowered(_matmul_tanh(64, 64, 64), threads=2)


def test_the_executable_says_how_many_kernels_are_threaded(monkeypatch):
    monkeypatch.delenv("OPFUSE_CPU_PARALLEL_MIN_US", raising=False)
    assert opfuse.compile(_matmul_tanh(128, 128, 128), backend="cpu", threads=2).threaded_kernels == (0, 2)
    assert opfuse.compile(_matmul_tanh(1024, 1024, 1024), backend="cpu",
                          threads=2).threaded_kernels == (1, 2)  # the matmul, not the tanh
    assert opfuse.compile(_matmul_tanh(128, 128, 128), backend="cpu", threads=1).threaded_kernels == (2, 2)


def test_named_ops_without_iterator_types_are_estimated():
    """Regression: linalg.elementwise has maps but no iterator_types (a KeyError once, in
    every random program that had one)."""
    n = 4096
    source = f"""
func.func @f(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %e = tensor.empty() : tensor<{n}xf32>
  %r = linalg.elementwise kind=#linalg.elementwise_kind<add>
      ins(%a, %b : tensor<{n}xf32>, tensor<{n}xf32>) outs(%e : tensor<{n}xf32>) -> tensor<{n}xf32>
  return %r : tensor<{n}xf32>
}}"""
    module = parse_module(source)
    func = next(op.operation for op in module.body.operations)
    assert "linalg.elementwise" in str(func)
    # 3 x 16 KiB moved, 4096 iterations of one op
    assert cpu_grain.estimated_us(func) == pytest.approx(1e6 * (3 * 4 * n / 20e9 + n / 10e9))
    a = np.arange(n, dtype=np.float32)
    got = opfuse.compile(source, backend="cpu", threads=2)(a, a)
    np.testing.assert_array_equal(got, a + a)
