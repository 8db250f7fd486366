"""Minimal cases of what the random linalg programs (test_random_linalg.py) found, against
numpy on the CPU (fused and unfused) and through the GPU kernels in the emulator. The
inputs are the regression files named below (each says what failed and why)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import opfuse
from opfuse.testing.emulator import emulate

REGRESSIONS = Path(__file__).parents[1] / "regressions"


def _captured_constant(a, b):
    return a * 4 + b


def _min_with_an_unused_sum(x, acc):
    return np.minimum(3.0, x.min()).reshape(())


def _max_from_a_filled_argument(acc, x):
    return np.maximum(0.5, (acc[0] + x).max()).reshape(1)


CASES = {
    "captured-constant-in-a-named-op": ([(1, 4, 1), (1, 4, 1)], _captured_constant),
    "row-reduction-with-an-unused-result": ([(8,), ()], _min_with_an_unused_sum),
    "fold-leaves-a-fill-on-a-reshaped-argument": ([(1,), (4,)], _max_from_a_filled_argument),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_and_emulated_kernels_match_numpy(name):
    shapes, reference = CASES[name]
    rng = np.random.default_rng(0)
    args = [rng.uniform(0.5, 4, s).astype(np.float32) for s in shapes]
    want = reference(*[a.astype(np.float64) for a in args])
    for fusion in (True, False):
        exe = opfuse.compile(REGRESSIONS / f"{name}.mlir", backend="cpu", fusion=fusion)
        np.testing.assert_allclose(exe(*args), want, rtol=1e-6)
        (got,) = emulate.run_program(exe.gpu_program(lower=False), args)
        np.testing.assert_allclose(got, want, rtol=1e-6)
