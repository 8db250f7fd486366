"""Scalar arithmetic between kernels (issue #10): ``tensor.extract`` of an element of an
earlier result, arith/math on the scalar, the scalar used by a later op's payload, a fill
or a pad value. Each kernel that uses the scalar computes it again from the tensor it
takes as an argument (test/regressions/scalar-arith-between-kernels.mlir shows the IR).

Checked against numpy fused and unfused on the CPU and in the GPU emulator, and assembled
by ptxas (0 spills) where ptxas is installed. (test_codegen_parity.py checks a scalar
through a bundle's CPU library.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import opfuse
from opfuse.testing.emulator import emulate

REGRESSION = Path(__file__).parents[1] / "regressions" / "scalar-arith-between-kernels.mlir"

#: A scalar taken at a position computed between ops (an index read from a tensor): the
#: kernel using it loads the index, then the element at that index.
COMPUTED_POSITION = """
func.func @main(%x: tensor<4x8xf32>, %idx: tensor<i64>) -> tensor<4x8xf32> {
  %i = tensor.extract %idx[] : tensor<i64>
  %ic = arith.index_cast %i : i64 to index
  %c1 = arith.constant 1 : index
  %v = tensor.extract %x[%c1, %ic] : tensor<4x8xf32>
  %e = tensor.empty() : tensor<4x8xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %v : f32
    linalg.yield %m : f32
  } -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
"""


def _args(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (4, 8)).astype(np.float32),
            rng.uniform(-1, 1, (3, 5)).astype(np.float32)]


def _reference(x: np.ndarray, w: np.ndarray):
    x, w = x.astype(np.float64), w.astype(np.float64)
    mean = x.sum() * 0.03125
    y = (x - mean) * np.exp(mean)
    v = w[1, 2] + mean
    return y, np.pad(w, ((1, 2), (2, 3)), constant_values=v) - v


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_cpu_matches_numpy(fusion):
    exe = opfuse.compile(REGRESSION, backend="cpu", fusion=fusion)
    args = _args()
    kept = [a.copy() for a in args]
    for got, want in zip(exe(*args), _reference(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(args, kept))


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_gpu_kernels_match_numpy_in_the_emulator(fusion):
    exe = opfuse.compile(REGRESSION, backend="cpu", fusion=fusion)
    program = exe.gpu_program(lower=False)
    # no kernel returns a scalar, and the extracted tensors are kernel parameters
    assert all(p[0] in ("arg", "result") for k in program.kernels.values() for p in k.params)
    assert len(program.kernels) == (3 if fusion else 4)
    args = _args(1)
    for got, want in zip(emulate.run_program(program, args), _reference(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [0, 5, 7])
def test_extract_at_a_computed_position(k):
    x = np.random.default_rng(k).uniform(-1, 1, (4, 8)).astype(np.float32)
    idx = np.array(k, np.int64)
    want = x.astype(np.float64) * x[1, k]
    for fusion in (True, False):
        exe = opfuse.compile(COMPUTED_POSITION, backend="cpu", fusion=fusion)
        np.testing.assert_allclose(exe(x, idx), want, rtol=1e-6)
        program = exe.gpu_program(lower=False)
        assert len(program.kernels) == 1
        (got,) = emulate.run_program(program, [x, idx])
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_kernels_assemble_without_spills():
    for text in (REGRESSION.read_text(), COMPUTED_POSITION):
        exe = opfuse.compile(text, backend="cpu")
        program = exe.gpu_program(targets=("sm_80", "sm_90"), ptxas=True)
        for k in program.kernels.values():
            for chip in ("sm_80", "sm_90"):
                res = k.resources[chip]
                assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, chip, res)
            assert "ld.global" in k.ptx["sm_90"]
