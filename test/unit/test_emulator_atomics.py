"""The emulator's ``memref.atomic_rmw`` against hand-made examples of PTX's ``atom`` (ISA,
"atom": load the value at the address, combine it with the operand, store the result, all
in one step, and return the value loaded; threads on one address go one after another).
Two blocks of 32 threads; thread ``t`` (flat index) adds to ``out[t % M]``."""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import OpfuseError
from opfuse.ir import make_context, parse_module
from opfuse.testing.emulator import emulate

KERNEL = """
func.func @k(%out: memref<8xTY>, %old: memref<64xTY>, %x: memref<64xTY>) {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c32 = arith.constant 32 : index
  %cM = arith.constant M : index
  %climit = arith.constant LIMIT : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c2, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c32, %sy = %c1, %sz = %c1) {
    %base = arith.muli %bx, %c32 : index
    %t = arith.addi %base, %tx : index
    %a = arith.remui %t, %cM : index
    %v = memref.load %x[%t] : memref<64xTY>
    %on = arith.cmpi ult, %t, %climit : index
    scf.if %on {
      %o = memref.atomic_rmw KIND %v, %out[%a] : (TY, memref<8xTY>) -> TY
      memref.store %o, %old[%t] : memref<64xTY>
    }
    gpu.terminator
  }
  return
}
"""


def _run(kind: str, ty: str, m: int, x: np.ndarray, init: np.ndarray, limit: int = 64):
    text = (KERNEL.replace("KIND", kind).replace("TY", ty).replace("LIMIT", str(limit))
            .replace("%cM = arith.constant M", f"%cM = arith.constant {m}"))
    out, old = init.copy(), np.full(64, -1, init.dtype)
    emulate.Emulator(parse_module(text, make_context())).run("k", [out, old, x.copy()])
    return out, old


def test_every_add_to_one_address_lands_and_each_thread_sees_the_ones_before_it():
    x = np.ones(64, np.float32)
    out, old = _run("addf", "f32", 1, x, np.full(8, 10.0, np.float32))
    assert out[0] == 74.0 and (out[1:] == 10.0).all()
    # the returned values are the sums before each thread's turn: a serial order
    assert sorted(old.tolist()) == [10.0 + k for k in range(64)]


def test_adds_to_different_addresses_do_not_interfere():
    x = np.arange(64, dtype=np.float32)
    out, old = _run("addf", "f32", 8, x, np.zeros(8, np.float32))
    want = np.array([sum(range(j, 64, 8)) for j in range(8)], np.float32)
    np.testing.assert_array_equal(out, want)
    for j in range(8):  # per address: the old values are prefix sums of its threads' operands
        assert sorted(old[j::8].tolist()) == sorted(np.cumsum(x[j::8])[:-1].tolist() + [0.0])


def test_each_f32_addition_is_rounded():
    # 2**24 + 1 is not an f32: adding 1.0 sixteen times to 2**24 one at a time (what a
    # serialized atom.add.f32 does) leaves 2**24; an exact sum would give 2**24 + 16
    x = np.zeros(64, np.float32)
    x[:16] = 1.0
    out, _ = _run("addf", "f32", 1, x, np.full(8, 2.0**24, np.float32))
    assert out[0] == np.float32(2.0**24)


def test_inactive_threads_do_not_touch_memory():
    out, old = _run("addi", "i32", 4, np.ones(64, np.int32), np.zeros(8, np.int32), limit=10)
    assert out.tolist() == [3, 3, 2, 2, 0, 0, 0, 0]
    assert (old[10:] == -1).all()


@pytest.mark.parametrize("kind, want", [("maxs", 63), ("mins", -5), ("assign", None)])
def test_integer_max_min_and_exchange(kind, want):
    x = np.arange(64, dtype=np.int32)
    out, old = _run(kind, "i32", 1, x, np.full(8, -5, np.int32))
    if kind == "assign":  # exch: memory ends with one thread's operand, each sees another's
        assert out[0] in x and sorted(old.tolist() + [int(out[0])]) == sorted(x.tolist() + [-5])
    else:
        assert out[0] == want


def test_an_atomic_out_of_bounds_is_an_error():
    text = KERNEL.replace("KIND", "addf").replace("TY", "f32").replace("LIMIT", "64") \
        .replace("%cM = arith.constant M", "%cM = arith.constant 9")
    with pytest.raises(OpfuseError, match="atomic out of bounds"):
        emulate.Emulator(parse_module(text, make_context())).run(
            "k", [np.zeros(8, np.float32), np.zeros(64, np.float32), np.ones(64, np.float32)])
