"""CpuProgram's per-call path (runtime/cpu.py): one set of memref descriptors lives with the
program and only the data pointers change per call. Each call must still read the arrays it
was given and return fresh outputs; inputs that are not contiguous, or bf16 given as
ml_dtypes, take the checked path (a copy or a view) and give the same answer."""

from __future__ import annotations

import numpy as np

import opfuse

SOURCE = """
func.func @f(%a: tensor<64x32xf32>, %b: tensor<32xf32>) -> tensor<64x32xf32> {
  %e = tensor.empty() : tensor<64x32xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<64x32xf32>, tensor<32xf32>) outs(%e : tensor<64x32xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.mulf %x, %y : f32
    linalg.yield %s : f32
  } -> tensor<64x32xf32>
  return %r : tensor<64x32xf32>
}"""


def test_each_call_reads_its_own_arrays_and_returns_fresh_outputs():
    ex = opfuse.compile(SOURCE, backend="cpu")
    rng = np.random.default_rng(1)
    calls = [(rng.standard_normal((64, 32), dtype=np.float32),
              rng.standard_normal(32, dtype=np.float32)) for _ in range(3)]
    outs = [ex(a, b) for a, b in calls]
    for (a, b), out in zip(calls, outs):
        np.testing.assert_array_equal(out, a * b)  # one rounding, as numpy's
    assert not np.shares_memory(outs[0], outs[1])
    a, b = calls[0]
    before = a.copy()
    ex(a, b)
    np.testing.assert_array_equal(a, before)  # the caller's array is not written


def test_strided_inputs_take_the_copying_path():
    ex = opfuse.compile(SOURCE, backend="cpu")
    rng = np.random.default_rng(2)
    wide = rng.standard_normal((64, 64), dtype=np.float32)
    b = rng.standard_normal(32, dtype=np.float32)
    view = wide[:, ::2]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(ex(view, b), view * b)
    np.testing.assert_array_equal(ex(np.ascontiguousarray(view), b), view * b)
