"""The CPU backend's math approximations (backends/cpu/math.py), measured directly.

Each op runs through the real CPU lowering on a dense sweep of f32 inputs (every binade
from the smallest subnormal to the largest float, both signs, random mantissas, plus
±0, ±inf, NaN, the largest and the smallest floats) and is compared with numpy's float64
result. Error unit: ulp of the float64 result rounded to f32 (subnormal results: 2**-149).
Bounds: ``cpu_math.ULP_BOUNDS`` (pow: plus ``POW_ULP_PER_LOG`` ulp per unit of ``|y ln x|``,
the error any f32 ``exp(y log x)`` carries). Special values must match numpy exactly (NaN for NaN,
the same infinity, the same zero).

Half precision: f16 and bf16 math computes in f32 and rounds once, so the result must be
the float64 value correctly rounded or its neighbour (1 ulp of the half type).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from opfuse.backends.cpu import lower as cpu_codegen
from opfuse.backends.cpu import math as cpu_math
from opfuse.ir import parse_module
from opfuse.runtime import cpu as cpu_runtime
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17549435e-38,
                     -1.17549435e-38, 3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, 2.0],
                    np.float32)

_ERF = np.vectorize(math.erf, otypes=[np.float64])
REFERENCES = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "tanh": np.tanh, "erf": _ERF}


def sweep(per_binade: int = 192, seed: int = 0) -> np.ndarray:
    """Random mantissas in every binade 2**-149 .. 2**127, both signs, plus SPECIALS."""
    rng = np.random.default_rng(seed)
    exps = np.repeat(np.arange(-149, 128), per_binade)
    mags = np.ldexp(rng.uniform(1.0, 2.0, exps.size), exps)
    with np.errstate(over="ignore"):
        v = mags.astype(np.float32)
    v = v[np.isfinite(v)]
    return np.concatenate([v, -v, SPECIALS])


def unary_module(op: str, n: int, ty: str = "f32") -> str:
    to_f32 = f"%x = arith.extf %a : {ty} to f32" if ty != "f32" else ""
    src = "%x" if ty != "f32" else "%a"
    back = f"%r = arith.truncf %y : f32 to {ty}" if ty != "f32" else ""
    res = "%r" if ty != "f32" else "%y"
    return f"""
func.func @main(%in: tensor<{n}x{ty}>) -> tensor<{n}x{ty}> {{
  %e = tensor.empty() : tensor<{n}x{ty}>
  %o = linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}}
      ins(%in : tensor<{n}x{ty}>) outs(%e : tensor<{n}x{ty}>) {{
  ^bb0(%a: {ty}, %unused: {ty}):
    {to_f32}
    %y = math.{op} {src} : f32
    {back}
    linalg.yield {res} : {ty}
  }} -> tensor<{n}x{ty}>
  return %o : tensor<{n}x{ty}>
}}
"""


POW_MODULE = """
func.func @main(%x: tensor<NxF32>, %y: tensor<NxF32>) -> tensor<NxF32> {
  %e = tensor.empty() : tensor<NxF32>
  %o = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>,
                                        affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
      ins(%x, %y : tensor<NxF32>, tensor<NxF32>) outs(%e : tensor<NxF32>) {
  ^bb0(%a: f32, %b: f32, %unused: f32):
    %p = math.powf %a, %b : f32
    linalg.yield %p : f32
  } -> tensor<NxF32>
  return %o : tensor<NxF32>
}
"""


def run(text: str, *arrays: np.ndarray) -> np.ndarray:
    return cpu_codegen.run_module(parse_module(text), *arrays)[0]


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in ulp of ref rounded to f32; 0 where both are the same special."""
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
        spacing = np.maximum(np.spacing(np.abs(ref32)).astype(np.float64), 2.0**-149)
        err = np.abs(got.astype(np.float64) - ref) / spacing
    same = (np.isnan(got) & np.isnan(ref)) | (np.isinf(ref32) & (got == ref32))
    err = np.where(same, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def check_specials(x: np.ndarray, got: np.ndarray, ref: np.ndarray) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
    special = ~np.isfinite(x) | ~np.isfinite(ref32) | (ref32 == 0)
    for a, g, r in zip(x[special], got[special], ref32[special]):
        if np.isnan(r):
            assert np.isnan(g), (a, g, r)
        elif r == 0 and abs(a) > 1e-30:  # an exact zero result keeps numpy's sign
            assert g == 0 and np.signbit(g) == np.signbit(r), (a, g, r)
        elif not np.isfinite(r):
            assert g == r, (a, g, r)


@pytest.mark.parametrize("op", ["exp", "log", "log1p", "tanh", "erf"])
def test_unary_error_bound_over_every_binade(op):
    x = sweep()
    with np.errstate(all="ignore"):
        ref = REFERENCES[op](x.astype(np.float64))
    got = run(unary_module(op, x.size), x)
    err = ulp_error(got, ref)
    worst = int(np.argmax(err))
    assert err.max() <= cpu_math.ULP_BOUNDS[op], (
        f"{op}: {err.max():.2f} ulp at x={x[worst]!r}: got {got[worst]!r}, want {ref[worst]!r}")
    check_specials(x, got, ref)


def test_exp_le0_error_bound_below_zero():
    """The attention softmax's exp (no math op: its helper called directly) over every
    binade of x <= 0, plus 0, -inf and NaN: within its bound down to e**-87, 0 below."""
    x = sweep()
    x = np.concatenate([x[(x <= 0) | np.isnan(x)], np.float32([-87.0, -87.00001, -88.0])])
    n = x.size
    name = cpu_math.helper_name("exp_le0", "f32")
    text = unary_module("exp", n).replace("math.exp %a : f32", f"func.call @{name}(%a) : (f32) -> f32")
    got = run(text + cpu_math.helper_text("exp_le0", "f32"), x)
    with np.errstate(all="ignore"):
        ref = np.exp(x.astype(np.float64))
    live = x >= -87.0
    err = ulp_error(got[live], ref[live])
    worst = int(np.argmax(err))
    assert err.max() <= cpu_math.ULP_BOUNDS["exp_le0"], (
        f"{err.max():.2f} ulp at x={x[live][worst]!r}: got {got[live][worst]!r}")
    flushed = got[(x < -87.0) & ~np.isnan(x)]
    assert flushed.size and np.all(flushed == 0)
    assert np.isnan(got[np.isnan(x)]).all() and got[x == 0].tolist() == [1.0] * int((x == 0).sum())


def test_pow_error_bound_and_c99_special_cases():
    rng = np.random.default_rng(1)
    n = 1 << 15
    x = np.concatenate([rng.uniform(0, 4, n), np.ldexp(1.0, rng.integers(-140, 127, n)) *
                        rng.uniform(1, 2, n), -rng.integers(0, 10, n).astype(np.float64),
                        rng.uniform(-3, 3, n)]).astype(np.float32)
    y = np.concatenate([rng.uniform(-8, 8, n), rng.uniform(-1, 1, n),
                        rng.integers(-5, 6, n).astype(np.float64),
                        rng.uniform(-3, 3, n)]).astype(np.float32)
    grid = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5, -2.0, 3.0, -0.5],
                    np.float32)
    gx, gy = np.meshgrid(grid, grid)
    x, y = np.concatenate([x, gx.ravel()]), np.concatenate([y, gy.ravel()])
    got = run(POW_MODULE.replace("N", str(x.size)).replace("F32", "f32"), x, y)
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), y.astype(np.float64))
        amplification = np.abs(y * np.log(np.abs(x.astype(np.float64))))
    err = ulp_error(got, ref)
    finite = np.isfinite(amplification)
    bound = cpu_math.ULP_BOUNDS["powf"] + cpu_math.POW_ULP_PER_LOG * np.where(
        finite, amplification, 0)
    bad = err > bound
    assert not bad.any(), list(zip(x[bad][:5], y[bad][:5], got[bad][:5], ref[bad][:5]))
    # the grid's special cases (an input 0, ±1, ±inf or NaN, or y = 0): exactly C99 / numpy
    g_got, g_ref = got[-gx.size:], ref[-gx.size:].astype(np.float32)
    for a, b, g, r in zip(gx.ravel(), gy.ravel(), g_got, g_ref):
        if np.isfinite(a) and np.isfinite(b) and a != 0 and abs(a) != 1 and b != 0:
            continue  # an ordinary value: inside the bound above
        assert (np.isnan(g) and np.isnan(r)) or (g == r and np.signbit(g) == np.signbit(r)), (
            f"pow({a}, {b}) = {g}, numpy: {r}")


@pytest.mark.parametrize("ty", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["exp", "log", "tanh", "erf"])
def test_half_precision_rounds_once(op, ty):
    grid = np.linspace(-12, 12, 4001, dtype=np.float32)
    if op == "log":
        grid = np.abs(grid) + np.float32(1e-3)
    if ty == "f16":
        x = grid.astype(np.float16)
        got = run(unary_module(op, x.size, "f16"), x).astype(np.float64)
        with np.errstate(all="ignore"):
            ref = REFERENCES[op](x.astype(np.float64))
            rounded = ref.astype(np.float16).astype(np.float64)
        spacing = np.spacing(np.abs(rounded).astype(np.float16)).astype(np.float64)
    else:
        bits = float32_to_bf16_bits(grid)
        x = bf16_bits_to_float32(bits)
        got = bf16_bits_to_float32(run(unary_module(op, x.size, "bf16"), bits)).astype(np.float64)
        with np.errstate(all="ignore"):
            ref = REFERENCES[op](x.astype(np.float64))
            rounded = bf16_bits_to_float32(float32_to_bf16_bits(ref.astype(np.float32)))
        spacing = np.abs(rounded.astype(np.float64)) * 2.0**-7
    overflow = ~np.isfinite(rounded)
    assert np.array_equal(got[overflow], rounded[overflow])  # rounds to the same infinity
    with np.errstate(all="ignore"):
        err = np.abs(got - ref) / np.maximum(spacing, 1e-30)
    assert np.all(err[~overflow] <= 1.0), float(err[~overflow].max())


def test_no_libm_call_is_left_for_the_approximated_ops():
    text = unary_module("erf", 64)
    lowered = str(cpu_codegen.lower_to_llvm(parse_module(text)))
    for name in ("erff", "expf", "logf", "tanhf", "llvm.intr.exp", "llvm.intr.log"):
        assert name not in lowered
    # f64 math is not approximated: it keeps its libm call
    f64 = unary_module("erf", 8).replace("f32", "f64")
    assert "erf(" in str(cpu_codegen.lower_to_llvm(parse_module(f64))).replace("@erf(", "erf(")
