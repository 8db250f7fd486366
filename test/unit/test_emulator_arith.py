"""The emulator's unsigned integer ops, against hand-made examples of their semantics
(MLIR's arith dialect: ``minui``/``maxui``/``cmpi ult`` compare as unsigned; a negative
index is a huge unsigned one, which is how the emitters clamp a padded read:
``minui(-1, 15) = 15``, ``cmpi ult, -1, 16`` is false)."""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.testing.emulator import emulate
from opfuse.ir import make_context, parse_module

KERNEL = """
func.func @k(%a: memref<4xi64>, %b: memref<4xi64>, %out: memref<4xi64>) {
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c4, %sy = %c1, %sz = %c1) {
    %x = memref.load %a[%tx] : memref<4xi64>
    %y = memref.load %b[%tx] : memref<4xi64>
    %r = OP %x, %y : i64
    memref.store %r, %out[%tx] : memref<4xi64>
    gpu.terminator
  }
  return
}
"""

A = np.array([-1, 3, -5, 7], np.int64)
B = np.array([15, -2, -3, 7], np.int64)


@pytest.mark.parametrize(
    "op, want",
    [
        ("arith.minui", [15, 3, -5, 7]),  # -1, -2, -3, -5 are the four largest unsigned
        ("arith.maxui", [-1, -2, -3, 7]),
        ("arith.minsi", [-1, -2, -5, 7]),
        ("arith.maxsi", [15, 3, -3, 7]),
    ],
)
def test_unsigned_and_signed_min_max(op, want):
    out = np.zeros(4, np.int64)
    emulate.Emulator(parse_module(KERNEL.replace("OP", op), make_context())).run("k", [A, B, out])
    np.testing.assert_array_equal(out, want)
