"""The emulator's vector constants, against hand-made kernels: a non-splat constant vector
is every lane's (vector.extract and vector.reduction of one worked on per-lane vectors
only: IndexError), and its f16/bf16 elements are read exactly (the bindings index only
f32/f64 and integer elements: TypeError). Found by test_random_linalg.py (seeds 656, 1076,
1160, 1348, 1420 of the 1500)."""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.testing.emulator import emulate
from opfuse.ir import make_context, parse_module

KERNEL = """
func.func @k(%x: memref<8xT>, %out: memref<8xT>, %sum: memref<8xT>) {
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c4 = arith.constant 4 : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c8, %sy = %c1, %sz = %c1) {
    %k = arith.constant dense<[1.5, -2.0, 0.1, 3.0]> : vector<4xT>
    %e = vector.extract %k[2] : T from vector<4xT>
    %v = memref.load %x[%tx] : memref<8xT>
    %p = arith.mulf %v, %e : T
    memref.store %p, %out[%tx] : memref<8xT>
    %r = vector.reduction <add>, %k : vector<4xT> into T
    %s = arith.addf %v, %r : T
    memref.store %s, %sum[%tx] : memref<8xT>
    gpu.terminator
  }
  return
}
"""

#: numpy type, the type in memory, the element's exact value, rounding to the type
TYPES = {
    "f32": (np.float32, np.float32, np.float32(0.1), np.float32),
    "f16": (np.float16, np.float16, np.float16(0.1), np.float16),
    "bf16": (np.float32, np.uint16, np.float32(0.10009765625), None),
}


def _bf16(x: np.ndarray) -> np.ndarray:
    return emulate._round_bf16(np.asarray(x, np.float32))


@pytest.mark.parametrize("t", list(TYPES))
def test_constant_vector_extract_and_reduction_in_every_lane(t):
    compute, memory, tenth, rounding = TYPES[t]
    rnd = rounding or _bf16
    x = rnd(np.arange(8, dtype=np.float32) - 3)
    store = (lambda a: emulate._to_bf16_bits(a)) if t == "bf16" else (lambda a: a.astype(memory))
    load = (lambda a: emulate._from_bf16_bits(a)) if t == "bf16" else (lambda a: a)
    out, total = np.zeros(8, memory), np.zeros(8, memory)
    module = parse_module(KERNEL.replace("T", t), make_context())
    emulate.Emulator(module).run("k", [store(x), out, total])
    np.testing.assert_array_equal(load(out), rnd(x * tenth))
    # the sum of the four elements (how a reduction rounds in T is unspecified: within
    # a few units of T's last place)
    acc = np.float32(1.5) - np.float32(2.0) + np.float32(tenth) + np.float32(3.0)
    np.testing.assert_allclose(load(total).astype(np.float32), x + acc,
                               rtol={"f32": 1e-6, "f16": 2e-3, "bf16": 2e-2}[t])


def test_half_precision_elements_from_decimals_and_bits():
    ctx = make_context()
    with ctx:
        for t, want in (("f16", np.float16([0.1, -65504, 1 / 3])),
                        ("bf16", _bf16([0.1, -3.0e38, 1 / 3]))):
            big = "-65504.0" if t == "f16" else "-3.0e38"
            attr = ir_attr(f"dense<[0.1, {big}, 0.3333333]> : vector<3x{t}>")
            got = emulate._elements(attr, attr.type.element_type)
            np.testing.assert_array_equal(got.astype(np.float32), np.asarray(want, np.float32))
        nan = ir_attr("dense<[0x7E00, 1.0]> : vector<2xf16>")
        got = emulate._elements(nan, nan.type.element_type)
        assert np.isnan(got[0]) and got[1] == 1


def ir_attr(text: str):
    from mlir import ir  # noqa: PLC0415

    return ir.DenseElementsAttr(ir.Attribute.parse(text))
