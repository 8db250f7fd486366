"""Column sums inside a row kernel (opfuse-fuse-column-sums, column_sums.py): the
row kernel of ``dx = dy - mean_row(dy)`` adds ``dx.sum(0)`` and ``(dx * x).sum(0)`` into
zeroed results with atomics. Checked against numpy on the CPU backend and in the emulated
GPU kernel (race check on) at shapes with tails: rows that do not fill the last block,
columns that are not a whole number of vectors or of a team's chunks, one row per block."""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.backends.gpu.compiler import compile_module
from opfuse.testing.emulator import emulate

PROGRAM = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @centred_backward(%dy: tensor<RxCxf32>, %x: tensor<RxCxf32>)
    -> (tensor<RxCxf32>, tensor<Cxf32>, tensor<Cxf32>) {
  %zero = arith.constant 0.0 : f32
  %n = arith.constant C.0 : f32
  %er = tensor.empty() : tensor<Rxf32>
  %ir = linalg.fill ins(%zero : f32) outs(%er : tensor<Rxf32>) -> tensor<Rxf32>
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%dy : tensor<RxCxf32>) outs(%ir : tensor<Rxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<Rxf32>
  %e = tensor.empty() : tensor<RxCxf32>
  %dx = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%dy, %s : tensor<RxCxf32>, tensor<Rxf32>) outs(%e : tensor<RxCxf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.divf %b, %n : f32
    %r = arith.subf %a, %m : f32
    linalg.yield %r : f32
  } -> tensor<RxCxf32>
  %prod = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%dx, %x : tensor<RxCxf32>, tensor<RxCxf32>) outs(%e : tensor<RxCxf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<RxCxf32>
  %ec = tensor.empty() : tensor<Cxf32>
  %ic = linalg.fill ins(%zero : f32) outs(%ec : tensor<Cxf32>) -> tensor<Cxf32>
  %db = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
      ins(%dx : tensor<RxCxf32>) outs(%ic : tensor<Cxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<Cxf32>
  %dw = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
      ins(%prod : tensor<RxCxf32>) outs(%ic : tensor<Cxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<Cxf32>
  return %dx, %db, %dw : tensor<RxCxf32>, tensor<Cxf32>, tensor<Cxf32>
}
"""


def _program(rows: int, cols: int) -> str:
    return PROGRAM.replace("RxC", f"{rows}x{cols}").replace("<Rx", f"<{rows}x") \
        .replace("<Cx", f"<{cols}x").replace("C.0", f"{cols}.0")


def _reference(dy: np.ndarray, x: np.ndarray) -> list[np.ndarray]:
    d, xd = dy.astype(np.float64), x.astype(np.float64)
    dx = d - d.mean(axis=1, keepdims=True)
    return [dx, dx.sum(axis=0), (dx * xd).sum(axis=0)]


def _close(got, want, rows: int) -> None:
    for g, w in zip(got, want):
        # the column sums add `rows` terms in another order than numpy's
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=1e-5, atol=1e-6 * rows)


# 24x40: two blocks of 16 rows (the last part empty), 10 vectors per row in a team of 16;
# 7x37: odd columns (scalar lanes); 5x1000: a block per row (team of 64), chunk tails
SHAPES = [(24, 40), (7, 37), (5, 1000)]


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_emulated_row_kernel_adds_its_column_sums(rows, cols):
    rng = np.random.default_rng(rows * cols)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    exe = opfuse.compile(_program(rows, cols), backend="cpu")
    program = compile_module(exe._source, lower=False)
    (k,) = program.kernels.values()  # one kernel: the row kernel holds both sums
    assert k.emitter == "rows" and k.zeroed == (1, 2), program.notes
    _close(emulate.run_program(program, [dy, x]), _reference(dy, x), rows)
    _close(exe(dy, x), _reference(dy, x), rows)  # the CPU backend, same program


def test_the_runtime_zeroes_what_the_kernel_adds_into(monkeypatch):
    """Buffers start as garbage (all bits set: NaN in f32, what uninitialized device
    memory may hold): the sums are right because the runtime zeroes them before the
    launch (KernelSpec.zeroed), and NaN where that step is taken away."""
    from opfuse.runtime import schedule

    real_empty = np.empty

    def garbage(shape, dtype=float, **kw):
        a = real_empty(shape, dtype, **kw)
        a.reshape(-1).view(np.uint8)[:] = 0xFF
        return a

    monkeypatch.setattr(schedule.np, "empty", garbage)
    rows, cols = 24, 40
    rng = np.random.default_rng(1)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    program = compile_module(opfuse.compile(_program(rows, cols), backend="cpu")._source,
                             lower=False)
    _close(emulate.run_program(program, [dy, x]), _reference(dy, x), rows)
    monkeypatch.setattr(schedule.KernelSpec, "zeroed", property(lambda self: ()))
    dx, db, dw = emulate.run_program(program, [dy, x])
    assert np.isfinite(dx).all() and np.isnan(db).all() and np.isnan(dw).all()


def test_the_ptx_adds_with_f32_atomics():
    """The lowering turns memref.atomic_rmw addf into PTX's atom/red .global.add.f32."""
    program = compile_module(opfuse.compile(_program(24, 40), backend="cpu")._source,
                             targets=("sm_80", "sm_90"))
    (k,) = program.kernels.values()
    for chip, ptx in k.ptx.items():
        assert "global.add.f32" in ptx, chip


MATMUL = """
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#col3 = affine_map<(d0, d1, d2) -> (d2)>
func.func @linear_bias_gradient(%g: tensor<MxKxf32>, %w: tensor<KxNxf32>)
    -> (tensor<MxNxf32>, tensor<Nxf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<MxNxf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<MxNxf32>) -> tensor<MxNxf32>
  %dy = linalg.matmul ins(%g, %w : tensor<MxKxf32>, tensor<KxNxf32>)
      outs(%z : tensor<MxNxf32>) -> tensor<MxNxf32>
  %v = tensor.expand_shape %dy [[0, 1], [2]] output_shape [2, H, N]
      : tensor<MxNxf32> into tensor<2xHxNxf32>
  %ec = tensor.empty() : tensor<Nxf32>
  %ic = linalg.fill ins(%zero : f32) outs(%ec : tensor<Nxf32>) -> tensor<Nxf32>
  %db = linalg.generic {indexing_maps = [#id3, #col3],
                        iterator_types = ["reduction", "reduction", "parallel"]}
      ins(%v : tensor<2xHxNxf32>) outs(%ic : tensor<Nxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<Nxf32>
  return %dy, %db : tensor<MxNxf32>, tensor<Nxf32>
}
"""


def _matmul(m: int, k: int, n: int) -> str:
    return (MATMUL.replace("MxK", f"{m}x{k}").replace("KxN", f"{k}x{n}")
            .replace("MxN", f"{m}x{n}").replace("2xHxN", f"2x{m // 2}x{n}")
            .replace("2, H, N", f"2, {m // 2}, {n}").replace("<Nx", f"<{n}x"))


# 24x32x40: tiles with tails in M and N; 70x64x130: several tiles along both
@pytest.mark.parametrize("m, k, n", [(24, 32, 40), (70, 64, 130)])
@pytest.mark.parametrize("variant, emitter, rtol", [("simt", "matmul", 1e-5), ("mma", "mma", 2e-3)])
def test_emulated_matmul_adds_its_bias_gradient(m, k, n, variant, emitter, rtol):
    """The SIMT and the tensor-core (TF32 here: f32 operands) epilogues add each element
    of C into the column sum over C's rows (two batch rows of m/2, as [B, S, N] is)."""
    rng = np.random.default_rng(m + n)
    g = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    exe = opfuse.compile(_matmul(m, k, n), backend="cpu")
    program = compile_module(exe._source, lower=False, matmul=variant,
                             allow_tf32=variant == "mma")
    (kernel,) = program.kernels.values()
    assert kernel.emitter == emitter and kernel.zeroed == (1,), program.notes
    dy = g.astype(np.float64) @ w
    want = [dy, dy.sum(axis=0)]
    got = emulate.run_program(program, [g, w])
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max())
    for x, y in zip(exe(g, w), want):  # the CPU backend, same program
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * np.abs(y).max())


LOOP = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#col3 = affine_map<(d0, d1, d2) -> (d2)>
func.func @tanh_backward(%dy: tensor<RxCxf32>, %y: tensor<RxCxf32>)
    -> (tensor<RxCxf32>, tensor<Cxf32>) {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<RxCxf32>
  %dx = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%dy, %y : tensor<RxCxf32>, tensor<RxCxf32>) outs(%e : tensor<RxCxf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %sq = arith.mulf %b, %b : f32
    %d = arith.subf %one, %sq : f32
    %r = arith.mulf %a, %d : f32
    linalg.yield %r : f32
  } -> tensor<RxCxf32>
  %v = tensor.expand_shape %dx [[0, 1], [2]] output_shape [2, H, C]
      : tensor<RxCxf32> into tensor<2xHxCxf32>
  %ec = tensor.empty() : tensor<Cxf32>
  %ic = linalg.fill ins(%zero : f32) outs(%ec : tensor<Cxf32>) -> tensor<Cxf32>
  %db = linalg.generic {indexing_maps = [#id3, #col3],
                        iterator_types = ["reduction", "reduction", "parallel"]}
      ins(%v : tensor<2xHxCxf32>) outs(%ic : tensor<Cxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<Cxf32>
  return %dx, %db : tensor<RxCxf32>, tensor<Cxf32>
}
"""


@pytest.mark.parametrize("rows, cols", [(24, 40), (14, 37)])
def test_emulated_loop_kernel_adds_the_sum_of_what_it_computes(rows, cols):
    """tanh's backward and the bias gradient of the layer before it (summed over both
    leading dims of a [2, S, C] view): one loop kernel, each thread adding the elements
    it computes (a vector of them where the columns allow, one at a time at 37)."""
    text = (LOOP.replace("RxC", f"{rows}x{cols}").replace("2xHxC", f"2x{rows // 2}x{cols}")
            .replace("2, H, C", f"2, {rows // 2}, {cols}").replace("<Cx", f"<{cols}x"))
    rng = np.random.default_rng(rows)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    y = np.tanh(rng.standard_normal((rows, cols))).astype(np.float32)
    exe = opfuse.compile(text, backend="cpu")
    program = compile_module(exe._source, lower=False)
    (kernel,) = program.kernels.values()
    assert kernel.emitter == "loop" and kernel.zeroed == (1,), program.notes
    dx = dy.astype(np.float64) * (1 - y.astype(np.float64) ** 2)
    want = [dx, dx.sum(axis=0)]
    _close(emulate.run_program(program, [dy, y]), want, rows)
    _close(exe(dy, y), want, rows)


CONV_BIAS = """
#id4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#ch = affine_map<(d0, d1, d2) -> (d1)>
func.func @relu_backward_and_bias(%dy: tensor<2x6x5x7xf32>, %y: tensor<2x6x5x7xf32>)
    -> (tensor<2x6x5x7xf32>, tensor<6xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x6x5x7xf32>
  %dx = linalg.generic {indexing_maps = [#id4, #id4, #id4],
                        iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%dy, %y : tensor<2x6x5x7xf32>, tensor<2x6x5x7xf32>) outs(%e : tensor<2x6x5x7xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %pos = arith.cmpf ogt, %b, %zero : f32
    %r = arith.select %pos, %a, %zero : f32
    linalg.yield %r : f32
  } -> tensor<2x6x5x7xf32>
  %ec = tensor.empty() : tensor<6xf32>
  %ic = linalg.fill ins(%zero : f32) outs(%ec : tensor<6xf32>) -> tensor<6xf32>
  %v = tensor.collapse_shape %dx [[0], [1], [2, 3]] : tensor<2x6x5x7xf32> into tensor<2x6x35xf32>
  %db = linalg.generic {indexing_maps = [#id3, #ch],
                        iterator_types = ["reduction", "parallel", "reduction"]}
      ins(%v : tensor<2x6x35xf32>) outs(%ic : tensor<6xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<6xf32>
  return %dx, %db : tensor<2x6x5x7xf32>, tensor<6xf32>
}
"""


def test_emulated_loop_kernel_adds_a_sum_over_leading_and_trailing_loops():
    """ReLU's backward over NCHW and the convolution bias gradient, summed over N and the
    flattened H*W (keeping C) of a view, which opfuse-fuse-reduction does not take (the
    domains differ): one loop kernel, each thread adding its elements at their channel."""
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    y = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    exe = opfuse.compile(CONV_BIAS, backend="cpu")
    program = compile_module(exe._source, lower=False)
    (kernel,) = program.kernels.values()
    assert kernel.emitter == "loop" and kernel.zeroed == (1,), program.notes
    dx = np.where(y > 0, dy, 0).astype(np.float64)
    want = [dx, dx.sum(axis=(0, 2, 3))]
    _close(emulate.run_program(program, [dy, y]), want, 70)
    _close(exe(dy, y), want, 70)


def test_a_row_sum_the_rows_emitter_declines_is_a_loop_kernel_adding_into_it():
    """Found by test_random_kernels (whose runner then did not zero ``KernelSpec.zeroed``
    results, giving NaN): a sum over a reshape that the rows emitter declines (its input
    is also returned, in another shape) goes to the loop emitter, which adds each element
    into the zeroed sum, instead of to the sequential fallback."""
    from opfuse.builder import Graph

    g = Graph("row_sum_of_a_reshape")
    t1 = g.reshape(g.input("x0", (1, 4)), (1, 2, 2))
    g.output(t1, g.sum(t1, axis=2))
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    program = compile_module(opfuse.compile(g, backend="cpu")._source, lower=False)
    (kernel,) = program.kernels.values()
    assert (kernel.emitter, kernel.zeroed) == ("loop", (1,)), program.notes
    got = emulate.run_program(program, [x])
    np.testing.assert_allclose(got[1], x.reshape(1, 2, 2).sum(axis=2), rtol=1e-6)
