"""The CPU backend's own kernels on awkward shapes, against numpy float64.

* the matmul micro-kernel (backends/cpu/matmul.py): sizes 1, odd, and not multiples of
  its register tile (mr x nr) or of its cache blocks (kc, mc); A and B transposed; batches;
  f32, f16 and bf16 operands (f32 accumulation);
* vectorized reductions (backends/cpu/reductions.py): row lengths below, at and above the
  vector width, sums, maxima (NaN propagates, -inf rows), minima, products;
* tile loops (backends/cpu/tiling.py): kernels whose rows do not divide by the tile.

Tolerances: f32 matmul 1e-5 x sqrt(K) relative to max|ref| (f32 accumulation), f16
1e-2, bf16 3e-2 (operands rounded to the half type: the reference uses the rounded
values, so only the result's rounding remains); reductions 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.backends.cpu import matmul as cpu_matmul
from opfuse.ir import parse_module
from opfuse.backends.cpu import lower as cpu_codegen
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

RNG = np.random.default_rng(7)
B = cpu_matmul.blocking()
# around the blocking's edges: 1, odd, mr and nr +- 1, past kc and mc
SIZES = sorted({1, 3, B.mr - 1, B.mr + 1, B.nr - 1, B.nr + 1, 2 * B.nr + 5, B.kc + 3,
                B.mc + B.mr + 1})


def _matmul_module(m, k, n, ta="f32", tc="f32", a_t=False, b_t=False, batch=None):
    a_shape = (k, m) if a_t else (m, k)
    b_shape = (n, k) if b_t else (k, n)
    if batch is not None:
        a_shape, b_shape, c_shape = (batch, *a_shape), (batch, *b_shape), (batch, m, n)
    else:
        c_shape = (m, n)

    def tt(shape, t):
        return "tensor<" + "x".join(map(str, shape)) + f"x{t}>"

    A, Bt, C = tt(a_shape, ta), tt(b_shape, ta), tt(c_shape, tc)
    if batch is None:
        a_map = "affine_map<(d0, d1, d2) -> (d2, d0)>" if a_t else "affine_map<(d0, d1, d2) -> (d0, d2)>"
        b_map = "affine_map<(d0, d1, d2) -> (d1, d2)>" if b_t else "affine_map<(d0, d1, d2) -> (d2, d1)>"
        maps = f"indexing_maps = [{a_map}, {b_map}, affine_map<(d0, d1, d2) -> (d0, d1)>]"
        op = "linalg.matmul"
    else:
        a_map = ("affine_map<(b, d0, d1, d2) -> (b, d2, d0)>" if a_t
                 else "affine_map<(b, d0, d1, d2) -> (b, d0, d2)>")
        b_map = ("affine_map<(b, d0, d1, d2) -> (b, d1, d2)>" if b_t
                 else "affine_map<(b, d0, d1, d2) -> (b, d2, d1)>")
        maps = f"indexing_maps = [{a_map}, {b_map}, affine_map<(b, d0, d1, d2) -> (b, d0, d1)>]"
        op = "linalg.batch_matmul"
    return f"""
func.func @main(%a: {A}, %b: {Bt}) -> {C} {{
  %z = arith.constant 0.0 : {tc}
  %e = tensor.empty() : {C}
  %f = linalg.fill ins(%z : {tc}) outs(%e : {C}) -> {C}
  %r = {op} {maps} ins(%a, %b : {A}, {Bt}) outs(%f : {C}) -> {C}
  return %r : {C}
}}
"""


def _operand(shape, t):
    x = RNG.standard_normal(shape).astype(np.float32)
    if t == "f16":
        x = x.astype(np.float16)
        return x, x.astype(np.float64)
    if t == "bf16":
        bits = float32_to_bf16_bits(x)
        return bits, bf16_bits_to_float32(bits).astype(np.float64)
    return x, x.astype(np.float64)


def _run_matmul(m, k, n, ta="f32", tc="f32", a_t=False, b_t=False, batch=None):
    module = parse_module(_matmul_module(m, k, n, ta, tc, a_t, b_t, batch))
    lead = () if batch is None else (batch,)
    a, a64 = _operand(lead + ((k, m) if a_t else (m, k)), ta)
    b, b64 = _operand(lead + ((n, k) if b_t else (k, n)), ta)
    if a_t:
        a64 = np.swapaxes(a64, -1, -2)
    if b_t:
        b64 = np.swapaxes(b64, -1, -2)
    (got,) = cpu_codegen.run_module(module, a, b)
    if tc == "bf16":
        got = bf16_bits_to_float32(got)
    return got.astype(np.float64), a64 @ b64


def _check(got, want, k, tc):
    scale = max(1.0, float(np.abs(want).max()))
    tol = {"f32": 1e-5 * np.sqrt(k), "f16": 1e-2, "bf16": 3e-2}[tc]
    err = float(np.abs(got - want).max()) / scale
    assert err <= tol, f"max scaled error {err:.2e} > {tol:.1e}"


# each m around the blocking once, the n around the panel width in turn
PAIRS = [(m, (1, B.nr - 1, B.nr + 1, 2 * B.nr + 5)[i % 4]) for i, m in enumerate(SIZES)]


@pytest.mark.parametrize("m,n", PAIRS)
def test_matmul_shapes_around_the_blocking(m, n):
    k = 37
    got, want = _run_matmul(m, k, n)
    _check(got, want, k, "f32")


@pytest.mark.parametrize("k", [1, 2, B.kc - 1, B.kc + 3, 2 * B.kc + 1])
def test_matmul_k_around_the_slices(k):
    got, want = _run_matmul(B.mr * 3 + 2, k, B.nr + 3)
    _check(got, want, k, "f32")


@pytest.mark.parametrize("a_t,b_t", [(True, False), (False, True), (True, True)])
def test_transposed_operands(a_t, b_t):
    got, want = _run_matmul(23, 19, 71, a_t=a_t, b_t=b_t)
    _check(got, want, 19, "f32")


@pytest.mark.parametrize("a_t,b_t", [(False, False), (False, True), (True, False)])
def test_batch_matmul(a_t, b_t):
    got, want = _run_matmul(13, 9, 67, a_t=a_t, b_t=b_t, batch=3)
    _check(got, want, 9, "f32")


@pytest.mark.parametrize("ta,tc", [("f16", "f32"), ("bf16", "f32"), ("f16", "f16"),
                                   ("bf16", "bf16")])
def test_half_precision_operands(ta, tc):
    got, want = _run_matmul(17, 40, 70, ta=ta, tc=tc)
    _check(got, want, 40, tc)


def test_matmuls_become_the_micro_kernel():
    from opfuse.backends.cpu import lower as cpu_codegen

    lowered = str(cpu_codegen.lower_to_llvm(parse_module(_matmul_module(8, 8, 8))))
    assert "__opfuse_mm_pack_f32" in lowered and "__opfuse_mm_f32_f32" in lowered
    integer = _matmul_module(8, 8, 8, ta="i32", tc="i32").replace("0.0 : i32", "0 : i32")
    lowered = str(cpu_codegen.lower_to_llvm(parse_module(integer)))
    assert "__opfuse_mm_" not in lowered  # integer matmuls stay loop nests


REDUCE = """
func.func @main(%x: tensor<RxCxf32>) -> tensor<Rxf32> {
  %init = arith.constant INIT : f32
  %e = tensor.empty() : tensor<Rxf32>
  %f = linalg.fill ins(%init : f32) outs(%e : tensor<Rxf32>) -> tensor<Rxf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<RxCxf32>) outs(%f : tensor<Rxf32>) {
  ^bb0(%a: f32, %acc: f32):
    BODY
    linalg.yield %y : f32
  } -> tensor<Rxf32>
  return %r : tensor<Rxf32>
}
"""

REDUCTIONS = {
    "sum": ("0.0", "%y = arith.addf %acc, %a : f32", lambda x: x.sum(1)),
    "sum_of_squares": ("0.0", "%s = arith.mulf %a, %a : f32\n    %y = arith.addf %s, %acc : f32",
                       lambda x: (x * x).sum(1)),
    "max": ("0xFF800000", "%y = arith.maximumf %acc, %a : f32", lambda x: x.max(1)),
    "min": ("0x7F800000", "%y = arith.minimumf %a, %acc : f32", lambda x: x.min(1)),
    "prod": ("1.0", "%y = arith.mulf %acc, %a : f32", lambda x: x.prod(1)),
}


@pytest.mark.parametrize("kind", list(REDUCTIONS))
@pytest.mark.parametrize("cols", [1, 7, 16, 17, 33, 100])
def test_row_reductions(kind, cols):
    init, body, ref = REDUCTIONS[kind]
    rows = 5
    text = REDUCE.replace("INIT", init).replace("BODY", body)
    text = text.replace("RxC", f"{rows}x{cols}").replace("<Rx", f"<{rows}x")
    x = RNG.uniform(0.5, 1.5, (rows, cols)).astype(np.float32)
    if kind in ("max", "min") and cols > 2:
        x[1, cols // 2] = np.nan  # NaN propagates through maximumf / minimumf
        x[2, :] = -np.inf if kind == "max" else np.inf
    (got,) = cpu_codegen.run_module(parse_module(text), x)
    want = ref(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reductions_run_vectorized():
    from opfuse.backends.cpu import lower as cpu_codegen

    text = REDUCE.replace("INIT", "0.0").replace("BODY", REDUCTIONS["sum"][1])
    text = text.replace("RxC", "4x64").replace("<Rx", "<4x")
    lowered = str(cpu_codegen.lower_to_llvm(parse_module(text)))
    assert "llvm.intr.vector.reduce.fadd" in lowered or "vector.reduce.fadd" in lowered


SOFTMAX_ROWS = """
func.func @main(%x: tensor<RxCxf32>) -> tensor<RxCxf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %em = tensor.empty() : tensor<Rxf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%em : tensor<Rxf32>) -> tensor<Rxf32>
  %m = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<RxCxf32>) outs(%fm : tensor<Rxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %y = arith.maximumf %a, %acc : f32
    linalg.yield %y : f32
  } -> tensor<Rxf32>
  %e = tensor.empty() : tensor<RxCxf32>
  %p = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>,
                                        affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%x, %m : tensor<RxCxf32>, tensor<Rxf32>) outs(%e : tensor<RxCxf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %y = math.exp %d : f32
    linalg.yield %y : f32
  } -> tensor<RxCxf32>
  %fs = linalg.fill ins(%zero : f32) outs(%em : tensor<Rxf32>) -> tensor<Rxf32>
  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%p : tensor<RxCxf32>) outs(%fs : tensor<Rxf32>) {
  ^bb0(%a: f32, %acc: f32):
    %y = arith.addf %a, %acc : f32
    linalg.yield %y : f32
  } -> tensor<Rxf32>
  %o = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>,
                                        affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%p, %s : tensor<RxCxf32>, tensor<Rxf32>) outs(%e : tensor<RxCxf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %y = arith.divf %a, %b : f32
    linalg.yield %y : f32
  } -> tensor<RxCxf32>
  return %o : tensor<RxCxf32>
}
"""


@pytest.mark.parametrize("rows,cols", [(1, 5000), (333, 129), (1025, 33), (7, 16)])
def test_tiled_softmax_rows_not_dividing_the_tile(rows, cols):
    """Through opfuse.compile (fused: one kernel, tiled by rows) and unfused."""
    import opfuse

    text = SOFTMAX_ROWS.replace("RxC", f"{rows}x{cols}").replace("<Rx", f"<{rows}x")
    x = RNG.standard_normal((rows, cols)).astype(np.float32) * 4
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    for fusion in (True, False):
        exe = opfuse.compile(text, backend="cpu", fusion=fusion)
        np.testing.assert_allclose(exe(x), want, rtol=1e-5, atol=1e-7)
