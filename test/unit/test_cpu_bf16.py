"""bf16 on the CPU without compiler-rt (regression): no bf16 value reaches LLVM.

The unfused bf16 G3/G5/G6 (and fused G3) CPU libraries of a bundle did not load:
``undefined symbol: __truncsfbf2``. Their max reductions keep the larger loaded bf16
value (``llvm.select`` on bf16, carried around the loop), and LLVM's generic x86-64 code
promotes such a value to f32 and truncates it back through compiler-rt's helper, which
libgcc 12 lacks (the JIT found it in libmlir_float16_utils). backends/cpu/bf16.py now
moves every bf16 value as its i16 bits. Here: the direct f32 -> bf16 cast (ties to even,
NaN, inf, overflow, subnormals) against a bit-arithmetic reference written here, and bf16
graphs fused and unfused, each run by the JIT and by its bundle's library in a fresh
process, whose undefined symbols are listed with ``nm``.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile

import numpy as np
import pytest

import opfuse
from opfuse.frontends.builder.graphs import graphs

from test_codegen_common import as_tuple, inputs_of, run_bundle_without_mlir

_HELPERS = ("__truncsfbf2", "__truncdfbf2", "__extendbfsf2")


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, round to nearest even, NaN quiet: integer arithmetic on the bits."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) & 0xFFFF
    nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def _f32(*bits: int) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


# Each rounding case: exact, ties (even below, odd above), just past a tie, subnormal ties,
# the largest finite f32 (rounds to inf), inf, signed zero, quiet and signalling NaNs.
_CASES = _f32(
    0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0xBF818000,
    0x00008000, 0x00018000, 0x00008001, 0x00010000, 0x807FFFFF, 0x00000001,
    0x7F7FFFFF, 0x7F7F7FFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000,
    0x7FC00000, 0xFFC00001, 0x7F800001, 0xFF800001, 0x7FBFFFFF,
)

_CAST = """
func.func @cast(%x: tensor<{n}xf32>) -> tensor<{n}xbf16> {{
  %e = tensor.empty() : tensor<{n}xbf16>
  %r = linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}}
      ins(%x : tensor<{n}xf32>) outs(%e : tensor<{n}xbf16>) {{
  ^bb0(%a: f32, %b: bf16):
    %t = arith.truncf %a : f32 to bf16
    linalg.yield %t : bf16
  }} -> tensor<{n}xbf16>
  return %r : tensor<{n}xbf16>
}}
"""


def _assert_bf16_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except that any quiet NaN stands for a NaN (payloads may differ)."""
    got, want = got.view(np.uint16).ravel(), want.ravel()
    quiet_nan = ((want & 0x7FC0) == 0x7FC0)
    np.testing.assert_array_equal((got & 0x7FC0) == 0x7FC0, quiet_nan)
    np.testing.assert_array_equal(got[~quiet_nan], want[~quiet_nan])


def _library_problems(bundle_path, tmp_path) -> list[str]:
    """The bf16/f32 conversion helpers the bundle's CPU library leaves undefined."""
    with zipfile.ZipFile(bundle_path) as z:
        z.extract("cpu/program.so", tmp_path / "lib")
    nm = subprocess.run(["nm", "-u", str(tmp_path / "lib/cpu/program.so")],
                        capture_output=True, text=True, check=True).stdout
    return [s for s in nm.split() if s.split("@")[0] in _HELPERS]


def _check_bundle(exe, args, want, tmp_path) -> None:
    """``exe``'s bundle: its library has no conversion helper left to resolve, and it
    loads and computes ``want`` in a process without mlir (bit for bit: same kernels)."""
    path = exe.save_bundle(tmp_path / "b.opfuse", targets=("sm_90",), cpu=True)
    if shutil.which("nm"):
        assert _library_problems(path, tmp_path) == []
    got = run_bundle_without_mlir(path, args, tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_f32_to_bf16_cast_rounds_to_nearest_even(fusion, tmp_path):
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([_CASES, random_bits])
    exe = opfuse.compile(_CAST.format(n=x.size), backend="cpu", fusion=fusion)
    (got,) = as_tuple(exe(x))
    _assert_bf16_bits_equal(got, _bf16_reference(x))
    _check_bundle(exe, [x], [got], tmp_path)


def _bf16_of_f64_reference(x: np.ndarray) -> np.ndarray:
    """f64 -> bf16 bits rounded once to nearest even (numpy's np.round on the scaled
    value, exact in f64): 8 significand bits, quantum at least 2**-133 (subnormals)."""
    with np.errstate(over="ignore", invalid="ignore"):
        _, e = np.frexp(np.where(np.isfinite(x), x, 1.0))
        q = np.ldexp(1.0, np.maximum(e - 8, -133))
        r = np.where(np.isfinite(x), np.round(x / q) * q, x).astype(np.float32)
    return (r.view(np.uint32) >> 16).astype(np.uint16) | np.where(np.isnan(x), 0x0040, 0).astype(np.uint16)


_CAST64 = _CAST.replace("xf32>", "xf64>").replace("%a: f32", "%a: f64").replace("f32 to", "f64 to")


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_f64_to_bf16_cast_rounds_once(fusion, tmp_path):
    """f64 -> bf16 had no expansion: ``__truncdfbf2`` (which rounds through f32: twice)."""
    special = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-30),
                        2.0**-133, 1.5 * 2.0**-133, 2.0**-134, 2.0**-134 + 2**-160, 1e-320,
                        3.3961e38, 3.4e38, 1e300, -np.inf, np.inf, np.nan, -0.0])
    rng = np.random.default_rng(2)
    x = np.concatenate([special, rng.standard_normal(500) * np.exp2(rng.integers(-140, 130, 500))])
    exe = opfuse.compile(_CAST64.format(n=x.size), backend="cpu", fusion=fusion)
    (got,) = as_tuple(exe(x))
    _assert_bf16_bits_equal(got, _bf16_of_f64_reference(x))
    _check_bundle(exe, [x], [got], tmp_path)


def test_reference_is_numpy_rounding():
    """The reference above agrees with rounding through numpy's float64 on normal numbers
    (bf16 has f32's exponent: keep 8 significand bits, ties to even)."""
    x = np.random.default_rng(1).standard_normal(10000).astype(np.float32)
    m, e = np.frexp(x.astype(np.float64))
    rounded = np.ldexp(np.round(m * 2**8) / 2**8, e).astype(np.float32)  # np.round: to even
    want = (rounded.view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(_bf16_reference(x), want)


# G3: a max reduction (fused too); G5, G6: attention's (the report); G1: matmul + GELU.
@pytest.mark.parametrize("name", ["g1_mlp", "g3_softmax", "g5_attention", "g6_encoder_layer"])
def test_bf16_graphs_fused_and_unfused_on_the_cpu_and_in_bundles(name, tmp_path):
    graph = graphs(scale=16, dtype="bf16")[name]
    values = inputs_of(graph)
    want = graph.reference(*values)
    args = [_bf16_reference(v) for v in values]  # bf16 goes in as its bits
    outs = {}
    for fusion in (True, False):
        exe = opfuse.compile(graph, backend="cpu", fusion=fusion)
        outs[fusion] = as_tuple(exe(*args))
        (tmp_path / str(fusion)).mkdir()
        _check_bundle(exe, args, outs[fusion], tmp_path / str(fusion))
    for fused, unfused, ref in zip(outs[True], outs[False], want):
        f, u = ((o.astype(np.uint32) << 16).view(np.float32) for o in (fused, unfused))
        scale = float(np.max(np.abs(ref))) or 1.0
        # bf16 keeps 8 significand bits; both programs round each op's result once
        np.testing.assert_allclose(f, ref, atol=0.05 * scale, rtol=0.05)
        np.testing.assert_allclose(u, ref, atol=0.05 * scale, rtol=0.05)
