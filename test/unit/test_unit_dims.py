"""Reductions that keep the reduced dim (torch-mlir's softmax and LayerNorm, real output in
test/Inputs/torch-mlir) fuse like the builder's: one row kernel each, and the numbers are
numpy's on the CPU (fused and unfused) and in the emulated GPU kernel.

The numpy reference reads LayerNorm's weights from the file's resource blobs with its own
hex parse (independent of opfuse's reader). Tolerances: f32, rtol 1e-5 / atol 1e-6 (the
LayerNorm statistics are computed in f64 by torch-mlir's IR and by numpy).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import opfuse
from opfuse.testing.emulator import emulate

INPUTS = Path(__file__).resolve().parents[1] / "Inputs" / "torch-mlir"


def _blobs(text: str) -> dict[str, np.ndarray]:
    """Every f32 resource blob of a file: "0x" + 4 bytes of alignment + the data."""
    found = re.findall(r'^\s*([\w.]+): "0x([0-9A-F]+)"', text, re.M)
    return {k: np.frombuffer(bytes.fromhex(h)[4:], np.float32) for k, h in found}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(x: np.ndarray, text: str) -> np.ndarray:
    # the order of the constants in the function says which blob is which
    names = re.findall(r"dense_resource<([\w.]+)>", text)
    blobs = _blobs(text)
    bias, weight = (blobs[n].astype(np.float64) for n in names)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


CASES = {"softmax": lambda x, text: _softmax(x), "layernorm": _layernorm}


@pytest.mark.parametrize("name", list(CASES))
def test_one_row_kernel_matching_numpy_on_cpu_and_gpu(name):
    path = INPUTS / f"{name}.mlir"
    text = path.read_text()
    x = np.random.default_rng(0).uniform(-2, 2, (32, 64)).astype(np.float32)
    want = CASES[name](x.astype(np.float64), text)
    fused = opfuse.compile(str(path), backend="cpu")
    assert fused.report["totals"]["after"]["kernels"] == 1
    for exe in (fused, opfuse.compile(str(path), backend="cpu", fusion=False)):
        np.testing.assert_allclose(exe(x), want, rtol=1e-5, atol=1e-6)
    program = fused.gpu_program(lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["rows"] and not program.notes
    (got,) = emulate.run_program(program, [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
