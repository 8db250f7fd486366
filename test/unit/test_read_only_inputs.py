"""No compiled program writes into the arrays its caller passes (issue #10, item 1).

linalg is destination-passing: ``linalg.matmul ins(%a, %b) outs(%c)`` writes ``c + a @ b``
into ``%c``'s buffer. With ``%c`` a function argument the CPU backend used to write into
the caller's array: the first call was right and overwrote ``c``, the second returned
``2 a@b + c``. Every kind of such program is called twice on the same arrays, on every
backend this machine has (the CPU backend fused and unfused, a bundle's CPU library, the
GPU kernels' host schedule in the emulator), and must leave the arrays unchanged and
return numpy's answer both times.
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.compiler import compile_module
from opfuse.errors import OpfuseError
from opfuse.runtime import bundle as rb
from opfuse.runtime.schedule import Buffer, Call, HostSchedule, View, plan_buffers

ID2 = "affine_map<(d0, d1) -> (d0, d1)>"
ROW = "affine_map<(d0, d1) -> (d0)>"

#: name -> (MLIR, numpy reference of the inputs). Each writes into an argument it reads.
CASES = {
    "matmul-outs-argument": (
        """
func.func @main(%a: tensor<4x3xf32>, %b: tensor<3x5xf32>, %c: tensor<4x5xf32>) -> tensor<4x5xf32> {
  %0 = linalg.matmul ins(%a, %b : tensor<4x3xf32>, tensor<3x5xf32>) outs(%c : tensor<4x5xf32>) -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}""",
        lambda a, b, c: a @ b + c,
    ),
    "batch-matmul-outs-argument": (
        """
func.func @main(%a: tensor<2x4x3xf32>, %b: tensor<2x3x4xf32>, %c: tensor<2x4x4xf32>) -> tensor<2x4x4xf32> {
  %0 = linalg.batch_matmul ins(%a, %b : tensor<2x4x3xf32>, tensor<2x3x4xf32>) outs(%c : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  return %0 : tensor<2x4x4xf32>
}""",
        lambda a, b, c: a @ b + c,
    ),
    "reduce-into-argument": (
        """
func.func @main(%a: tensor<4x8xf32>, %c: tensor<4xf32>) -> tensor<4xf32> {
  %0 = linalg.reduce ins(%a : tensor<4x8xf32>) outs(%c : tensor<4xf32>) dimensions = [1]
    (%x: f32, %acc: f32) {
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    }
  return %0 : tensor<4xf32>
}""",
        lambda a, c: a.sum(axis=1) + c,
    ),
    "generic-reduction-into-argument": (
        f"""
func.func @main(%a: tensor<4x8xf32>, %c: tensor<4xf32>) -> tensor<4xf32> {{
  %0 = linalg.generic {{indexing_maps = [{ID2}, {ROW}], iterator_types = ["parallel", "reduction"]}}
      ins(%a : tensor<4x8xf32>) outs(%c : tensor<4xf32>) {{
  ^bb0(%x: f32, %acc: f32):
    %m = arith.maximumf %x, %acc : f32
    linalg.yield %m : f32
  }} -> tensor<4xf32>
  return %0 : tensor<4xf32>
}}""",
        lambda a, c: np.maximum(a.max(axis=1), c),
    ),
    "generic-reads-out": (
        f"""
func.func @main(%a: tensor<4x8xf32>, %c: tensor<4x8xf32>) -> tensor<4x8xf32> {{
  %0 = linalg.generic {{indexing_maps = [{ID2}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%a : tensor<4x8xf32>) outs(%c : tensor<4x8xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %s = arith.addf %x, %o : f32
    linalg.yield %s : f32
  }} -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}}""",
        lambda a, c: a + c,
    ),
    "outs-through-a-reshape": (
        """
func.func @main(%a: tensor<4x3xf32>, %b: tensor<3x4xf32>, %c: tensor<16xf32>) -> tensor<4x4xf32> {
  %v = tensor.expand_shape %c [[0, 1]] output_shape [4, 4] : tensor<16xf32> into tensor<4x4xf32>
  %0 = linalg.matmul ins(%a, %b : tensor<4x3xf32>, tensor<3x4xf32>) outs(%v : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}""",
        lambda a, b, c: a @ b + c.reshape(4, 4),
    ),
    # fused: the producer of %a, the matmul into %c and its epilogue become one kernel
    "fused-kernel-writes-argument": (
        f"""
func.func @main(%a: tensor<4x3xf32>, %b: tensor<3x4xf32>, %c: tensor<4x4xf32>) -> tensor<4x4xf32> {{
  %e = tensor.empty() : tensor<4x4xf32>
  %0 = linalg.matmul ins(%a, %b : tensor<4x3xf32>, tensor<3x4xf32>) outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  %1 = linalg.generic {{indexing_maps = [{ID2}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%0 : tensor<4x4xf32>) outs(%e : tensor<4x4xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %t = math.tanh %x : f32
    linalg.yield %t : f32
  }} -> tensor<4x4xf32>
  return %1 : tensor<4x4xf32>
}}""",
        lambda a, b, c: np.tanh(a @ b + c),
    ),
    # the argument is also an output: the caller gets a fresh array, c stays as it was
    "argument-written-and-returned": (
        f"""
func.func @main(%a: tensor<4x8xf32>, %c: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {{
  %0 = linalg.generic {{indexing_maps = [{ID2}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%a : tensor<4x8xf32>) outs(%c : tensor<4x8xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %s = arith.mulf %x, %o : f32
    linalg.yield %s : f32
  }} -> tensor<4x8xf32>
  return %0, %c : tensor<4x8xf32>, tensor<4x8xf32>
}}""",
        lambda a, c: (a * c, c),
    ),
}


def _inputs(exe, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s.shape).astype(np.float32) for s in exe.signature.inputs]


def _check_twice(run, args, reference):
    kept = [a.copy() for a in args]
    want = reference(*kept)
    want = want if isinstance(want, tuple) else (want,)
    for _ in range(2):
        got = run(*args)
        got = got if isinstance(got, (tuple, list)) else (got,)
        for a, k in zip(args, kept):
            np.testing.assert_array_equal(a, k)  # the caller's arrays are untouched
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            assert not any(np.shares_memory(g, a) for a in args)


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", list(CASES))
def test_cpu_backend_never_writes_inputs(name, fusion):
    text, reference = CASES[name]
    exe = opfuse.compile(text, backend="cpu", fusion=fusion)
    _check_twice(exe, _inputs(exe), reference)


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_gpu_schedule_never_writes_inputs(name, fusion):
    text, reference = CASES[name]
    exe = opfuse.compile(text, backend="cpu", fusion=fusion)
    program = compile_module(exe._source, targets=("sm_90",), ptxas=False, lower=False)
    _check_twice(lambda *a: emulate.run_program(program, a), _inputs(exe), reference)


def test_bundle_cpu_library_never_writes_inputs(tmp_path):
    """A bundle's CPU library runs each kernel through a public wrapper; the schedule
    hands it the caller's arrays directly."""
    for name in ("matmul-outs-argument", "reduce-into-argument", "fused-kernel-writes-argument",
                 "argument-written-and-returned"):
        text, reference = CASES[name]
        exe = opfuse.compile(text, backend="cpu")
        program = rb.load(exe.save_bundle(tmp_path / f"{name}.opfuse", ptxas=False))
        _check_twice(program.program("cpu"), _inputs(exe), reference)


@pytest.mark.parametrize("name", ["matmul-outs-argument", "reduce-into-argument"])
def test_report_counts_the_copy(name):
    text, _ = CASES[name]
    exe = opfuse.compile(text, backend="cpu")
    copies = exe.report["input_copies"]
    assert len(copies) == 1
    arg = copies[0]["argument"]
    nbytes = int(np.prod(exe.signature.inputs[arg].shape)) * 4
    assert copies[0]["bytes"] == 2 * nbytes  # read + write of the argument
    totals = exe.report["totals"]
    assert totals["before"]["copy_bytes"] == totals["after"]["copy_bytes"] == 2 * nbytes


def test_no_copy_when_outs_is_only_overwritten():
    text = f"""
func.func @main(%a: tensor<4x8xf32>, %c: tensor<4x8xf32>) -> tensor<4x8xf32> {{
  %0 = linalg.generic {{indexing_maps = [{ID2}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%a : tensor<4x8xf32>) outs(%c : tensor<4x8xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %s = arith.mulf %x, %x : f32
    linalg.yield %s : f32
  }} -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}}"""
    exe = opfuse.compile(text, backend="cpu")
    assert "input_copies" not in exe.report
    _check_twice(exe, _inputs(exe), lambda a, c: a * a)


def test_a_schedule_that_writes_an_input_is_refused():
    """Bundles carry their schedule as JSON: one that binds an input (or a view of one)
    as a kernel's result is refused before anything runs."""
    bufs = [Buffer(0, (4,), "f32", "input", 0), Buffer(1, (2, 2), "f32", "temp")]
    schedule = HostSchedule("main", bufs, [0], [1], [View(1, 0), Call("k", (0,), (1,))])
    with pytest.raises(OpfuseError, match="input #0.*read-only"):
        plan_buffers(schedule)
