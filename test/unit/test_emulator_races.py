"""The emulator's shared-memory race check (:mod:`opfuse.testing.emulator.emulate`).

Lockstep execution hides a missing ``gpu.barrier``: every thread has done everything
before the next op runs. The check records each workgroup access per block and element
until the block's next barrier and raises on a read-after-write, write-after-read or
write-after-write between two threads of one block. The kernels here are written by hand
in the form the emitters produce (a host function holding one ``gpu.launch`` with a
``workgroup(...)`` attribution; see :mod:`opfuse.backends.gpu.build.kernel`): two blocks of eight
threads, ``x`` and ``y`` one element per thread.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opfuse.testing.emulator import emulate
from opfuse.errors import OpfuseError
from opfuse.ir import make_context, parse_module

from test_codegen_common import assert_close

SMEM = "memref<8xf32, #gpu.address_space<workgroup>>"

KERNEL = """
func.func @k(%x: memref<16xf32>, %y: memref<16xf32>) {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c8 = arith.constant 8 : index
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c2, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c8, %sy = %c1, %sz = %c1)
             workgroup(%sm : SMEM) {
    %c0 = arith.constant 0 : index
    %one = arith.constant 1 : index
    %three = arith.constant 3 : index
    %g = affine.apply affine_map<(d0, d1) -> (d0 * 8 + d1)>(%bx, %tx)
    %next = affine.apply affine_map<(d0) -> ((d0 + 1) mod 8)>(%tx)
    %first = arith.cmpi eq, %tx, %c0 : index
    %v = memref.load %x[%g] : memref<16xf32>
BODY
    gpu.terminator
  }
  return
}
"""


def _kernel(body: str) -> str:
    return KERNEL.replace("SMEM", SMEM).replace("BODY", body.replace("SMEM", SMEM))


def _run(body: str) -> np.ndarray:
    x = np.arange(16, dtype=np.float32) + 100
    y = np.full(16, -1, dtype=np.float32)
    emu = emulate.Emulator(parse_module(_kernel(body), make_context()))
    emu.run("k", [x, y])
    return y


def _race(body: str, kind: str, where: str) -> None:
    with pytest.raises(OpfuseError) as info:
        _run(body)
    msg = str(info.value)
    assert f"shared-memory race in kernel @k: {kind} on workgroup buffer 0 ({SMEM})" in msg
    assert where in msg, msg


def _rotated(x: np.ndarray) -> np.ndarray:
    """Each thread's value from the next thread of its block (the kernels' result)."""
    return np.roll(x.reshape(2, 8), -1, axis=1).reshape(-1)


ROTATE = """
    memref.store %v, %sm[%tx] : SMEM
    BARRIER
    %w = memref.load %sm[%next] : SMEM
    memref.store %w, %y[%g] : memref<16xf32>
"""


def test_store_barrier_load_of_a_neighbour_passes():
    y = _run(ROTATE.replace("BARRIER", "gpu.barrier"))
    np.testing.assert_array_equal(y, _rotated(np.arange(16, dtype=np.float32) + 100))


def test_load_of_a_neighbour_without_barrier_is_read_after_write():
    _race(
        ROTATE.replace("BARRIER", ""),
        "read-after-write",
        "at element 1 in block (0, 0, 0): thread (0, 0, 0) reads it (memref.load) "
        "after thread (1, 0, 0) wrote it, with no gpu.barrier in between",
    )


def test_the_check_can_be_switched_off():
    text = _kernel(ROTATE.replace("BARRIER", ""))
    x = np.arange(16, dtype=np.float32) + 100
    y = np.zeros(16, dtype=np.float32)
    emulate.Emulator(parse_module(text, make_context()), racecheck=False).run("k", [x, y])
    np.testing.assert_array_equal(y, _rotated(x))  # lockstep gives the "intended" result


LOOP = """
    scf.for %i = %c0 to %three step %one {
      %fi = arith.index_cast %i : index to i32
      %f = arith.sitofp %fi : i32 to f32
      %vi = arith.addf %v, %f : f32
      memref.store %vi, %sm[%tx] : SMEM
      gpu.barrier
      %w = memref.load %sm[%next] : SMEM
      memref.store %w, %y[%g] : memref<16xf32>
      SECOND
    }
"""


def test_loop_overwriting_what_it_read_without_a_barrier_is_write_after_read():
    _race(
        LOOP.replace("SECOND", ""),
        "write-after-read",
        "at element 0 in block (0, 0, 0): thread (0, 0, 0) writes it (memref.store) "
        "after thread (7, 0, 0) read it, with no gpu.barrier in between",
    )


def test_loop_with_a_second_barrier_passes():
    y = _run(LOOP.replace("SECOND", "gpu.barrier"))
    np.testing.assert_array_equal(y, _rotated(np.arange(16, dtype=np.float32) + 102))


def test_two_threads_storing_one_element_is_write_after_write():
    _race(
        """
    %half = affine.apply affine_map<(d0) -> (d0 floordiv 2)>(%tx)
    memref.store %v, %sm[%half] : SMEM
""",
        "write-after-write",
        "at element 0 in block (0, 0, 0): thread (1, 0, 0) writes it (memref.store) "
        "after thread (0, 0, 0) wrote it",
    )


def test_two_threads_storing_one_element_in_two_ops_is_write_after_write():
    _race(
        """
    %second = arith.cmpi eq, %tx, %one : index
    scf.if %first {
      memref.store %v, %sm[%c0] : SMEM
    }
    scf.if %second {
      memref.store %v, %sm[%c0] : SMEM
    }
""",
        "write-after-write",
        "at element 0 in block (0, 0, 0): thread (1, 0, 0) writes it (memref.store) "
        "after thread (0, 0, 0) wrote it",
    )


def test_the_same_value_from_two_threads_is_still_write_after_write():
    _race(
        """
    %k = arith.constant 1.0 : f32
    memref.store %k, %sm[%c0] : SMEM
""",
        "write-after-write",
        "thread (1, 0, 0) writes it (memref.store) after thread (0, 0, 0) wrote it",
    )


def test_vector_accesses_overlapping_between_threads_race():
    # threads 0..3 store two elements each at [tx, tx + 1]: neighbours overlap by one
    _race(
        """
    %c4 = arith.constant 4 : index
    %low = arith.cmpi ult, %tx, %c4 : index
    scf.if %low {
      %vv = vector.broadcast %v : f32 to vector<2xf32>
      vector.store %vv, %sm[%tx] : SMEM, vector<2xf32>
    }
""",
        "write-after-write",
        "at element 1 in block (0, 0, 0): thread (1, 0, 0) writes it (vector.store) "
        "after thread (0, 0, 0) wrote it",
    )


def test_blocks_have_their_own_shared_memory():
    # thread 0 of each block publishes its value at element 0; after the barrier every
    # thread of the block reads it: same element, two blocks, no race
    y = _run("""
    scf.if %first {
      memref.store %v, %sm[%c0] : SMEM
    }
    gpu.barrier
    %w = memref.load %sm[%c0] : SMEM
    memref.store %w, %y[%g] : memref<16xf32>
""")
    np.testing.assert_array_equal(y, np.repeat(np.float32([100, 108]), 8))


def test_masked_off_threads_do_not_access():
    # only thread 0 stores and loads element 0 (no barrier needed: one thread); the other
    # threads' masked-off loads would be read-after-write if they counted
    y = _run("""
    scf.if %first {
      memref.store %v, %sm[%c0] : SMEM
    }
    scf.if %first {
      %w = memref.load %sm[%c0] : SMEM
      memref.store %w, %y[%g] : memref<16xf32>
    }
""")
    want = np.full(16, -1, dtype=np.float32)
    want[[0, 8]] = [100, 108]
    np.testing.assert_array_equal(y, want)


def test_a_race_in_another_block_names_that_block():
    _race(
        """
    %b1 = arith.cmpi eq, %bx, %one : index
    scf.if %b1 {
      memref.store %v, %sm[%tx] : SMEM
      %w = memref.load %sm[%next] : SMEM
    }
""",
        "read-after-write",
        "in block (1, 0, 0): thread (0, 0, 0) reads it (memref.load) after thread (1, 0, 0)",
    )


def test_a_barrier_releases_only_the_blocks_that_reach_it():
    # a block-uniform branch: block 0 synchronizes, block 1 does not
    _race(
        """
    %b0 = arith.cmpi eq, %bx, %c0 : index
    memref.store %v, %sm[%tx] : SMEM
    scf.if %b0 {
      gpu.barrier
    }
    %w = memref.load %sm[%next] : SMEM
    memref.store %w, %y[%g] : memref<16xf32>
""",
        "read-after-write",
        "at element 1 in block (1, 0, 0): thread (0, 0, 0) reads it (memref.load) "
        "after thread (1, 0, 0) wrote it",
    )


# ----- the row emitter's exchange between warps ------------------------------------------
@pytest.fixture(scope="module")
def softmax_program():
    """A softmax whose rows need a 128-thread team: for each of its two reductions (max,
    sum) one shared-memory exchange between the four warps of a block, behind a barrier."""
    from opfuse.builder import Graph
    from opfuse.backends.gpu.compiler import compile_module

    from test_codegen_common import compile_cpu

    g = Graph("softmax_rows")
    g.output(g.softmax(g.input("x", (3, 1028))))
    program = compile_module(compile_cpu(g)._source, lower=False)
    (k,) = program.kernels.values()
    assert k.emitter == "rows" and k.block == (128, 1, 1)
    assert "workgroup(" in program.kernels_ir
    x = g.random_inputs(0)["x"]
    return g, program, x


@pytest.mark.parametrize("outlined", [True, False])
def test_row_kernel_exchange_between_warps_passes(softmax_program, outlined):
    g, program, x = softmax_program
    assert_close(emulate.run_program(program, [x], outlined=outlined), g.reference(x))


@pytest.mark.parametrize("outlined", [True, False])
@pytest.mark.parametrize("which", [0, 1])
def test_row_kernel_without_a_barrier_is_read_after_write(softmax_program, outlined, which):
    g, program, x = softmax_program
    field = "outlined_ir" if outlined else "kernels_ir"
    lines = getattr(program, field).splitlines(keepends=True)
    barriers = [i for i, line in enumerate(lines) if line.strip() == "gpu.barrier"]
    assert len(barriers) == 2
    del lines[barriers[which]]
    broken = dataclasses.replace(program, **{field: "".join(lines)})
    with pytest.raises(OpfuseError, match=rf"read-after-write on workgroup buffer {which} "):
        emulate.run_program(broken, [x], outlined=outlined)
    # lockstep alone does not notice: the result is right
    got = emulate.run_program(broken, [x], outlined=outlined, racecheck=False)
    assert_close(got, g.reference(x))


def test_barrier_reached_by_part_of_a_block_is_an_internal_error():
    """A barrier under a thread-dependent condition hangs or is undefined on a GPU."""
    body = """
    scf.if %first {
      memref.store %v, %sm[%tx] : SMEM
      gpu.barrier
    }
    memref.store %v, %y[%g] : memref<16xf32>
"""
    with pytest.raises(OpfuseError) as info:
        _run(body)
    assert (
        "divergent gpu.barrier in kernel @k: block (0, 0, 0) reaches it with 1 of 8 threads"
        in str(info.value)
    )
    assert info.value.exit_code == 2


def test_misaligned_vector_access_is_an_internal_error():
    """A vector load claiming 16-byte alignment at element 1 faults on a GPU."""
    body = """
    %v4 = vector.load %x[%one] {alignment = 16 : i64} : memref<16xf32>, vector<4xf32>
    memref.store %v, %y[%g] : memref<16xf32>
"""
    with pytest.raises(OpfuseError) as info:
        _run(body)
    assert "misaligned vector.load in kernel @k: it claims 16-byte alignment, element 1" in str(
        info.value
    )
    assert info.value.exit_code == 2


def test_loop_carries_a_constant_vector_through_a_thread_dependent_bound():
    """Regression: an ``scf.for`` whose bound differs between threads (the attention
    kernel's causal key bound) starting from a splat vector constant broadcast the
    constant over the thread axis instead of giving every thread its own copy."""
    y = _run("""
    %z = arith.constant dense<0.0> : vector<2xf32>
    %ub = affine.apply affine_map<(d0) -> (d0 mod 4)>(%tx)
    %r = scf.for %i = %c0 to %ub step %one iter_args(%acc = %z) -> (vector<2xf32>) {
      %b = vector.broadcast %v : f32 to vector<2xf32>
      %n = arith.addf %acc, %b : vector<2xf32>
      scf.yield %n : vector<2xf32>
    }
    %e = vector.extract %r[1] : f32 from vector<2xf32>
    memref.store %e, %y[%g] : memref<16xf32>
""")
    x = np.arange(16, dtype=np.float32) + 100
    np.testing.assert_array_equal(y, x * (np.arange(16) % 8 % 4))
