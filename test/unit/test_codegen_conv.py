"""The convolution emitter (backends/gpu/emit/conv.py) without a GPU: every convolution the builder
makes (plain, strided, dilated, grouped, depthwise; f32, f16, bf16; bias, BatchNorm-folded
scale and shift, ReLU, residual) and the three torch-mlir prints (test/Inputs/torch-mlir:
padding, bias in the init, grouped through expand/collapse, depthwise) is one "conv"
kernel, emulated (race check on) against numpy, and assembles with 0 spills for sm_80 and
sm_90 when ptxas is installed.

Tolerances: f32 rtol 1e-4 / atol 1e-5 (the kernel sums the window in another order than
numpy); f16/bf16 2e-2 (one rounding of the result).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import opfuse
from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas
from opfuse.frontends.builder.reference import _conv2d
from opfuse.frontends.builder.tensor import Tensor

from test_builder_conv import CONFIGS, TOL, _args, _conv_graph, _values

INPUTS = Path(__file__).resolve().parents[1] / "Inputs" / "torch-mlir"
HAVE_PTXAS = ptxas.find_ptxas() is not None


def _conv_bn_residual() -> Graph:
    """ResNet's basic block tail: relu(conv(x) * scale + shift + x), per-channel vectors."""
    g = Graph("block")
    x, w = g.input("x", (2, 16, 10, 12)), g.input("w", (16, 16, 3, 3))
    scale, shift = g.input("scale", (16,)), g.input("shift", (16,))
    y = g.conv2d(x, w, padding=1)
    per_channel = lambda t: Tensor(g, t.node, (1, 16, 1, 1), (0, 2, 3))  # noqa: E731
    g.output(g.relu(y * per_channel(scale) + per_channel(shift) + x))
    return g


def _one_conv_kernel(exe, lower: bool):
    assert exe.report["totals"]["after"]["kernels"] == 1
    assert [k["kind"] for k in exe.report["kernels"]] == ["conv"]
    program = exe.gpu_program(("sm_80", "sm_90")) if lower else exe.gpu_program(lower=False)
    (kernel,) = program.kernels.values()
    assert kernel.emitter == "conv" and not program.notes
    return program, kernel


BUILDER_CASES = [pytest.param(lambda c=c: (_conv_graph(*c), "f32"), id=f"conv{i}")
                 for i, c in enumerate(CONFIGS)]
BUILDER_CASES += [
    pytest.param(lambda: (_conv_graph(*CONFIGS[1], dtype="f16"), "f16"), id="f16"),
    pytest.param(lambda: (_conv_graph(*CONFIGS[3], dtype="bf16"), "bf16"), id="bf16-depthwise"),
    pytest.param(lambda: (_conv_bn_residual(), "f32"), id="bn-residual"),
]


@pytest.mark.parametrize("case", BUILDER_CASES)
def test_builder_convolutions_are_one_kernel_matching_numpy(case):
    g, dtype = case()
    inputs = g.random_inputs(2)
    (want,) = g.reference(**inputs)
    exe = opfuse.compile(g, backend="cpu")
    program, kernel = _one_conv_kernel(exe, lower=HAVE_PTXAS)
    (got,) = emulate.run_program(program, _args(g, inputs, dtype))
    np.testing.assert_allclose(_values(got, dtype).astype(np.float64), want, **TOL[dtype])
    if HAVE_PTXAS:
        for chip in ("sm_80", "sm_90"):
            res = kernel.resources[chip]
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (chip, res)


def test_unfused_convolution_is_a_conv_kernel_too():
    g = _conv_graph(*CONFIGS[2])
    inputs = g.random_inputs(4)
    exe = opfuse.compile(g, backend="cpu", fusion=False)
    program = exe.gpu_program(lower=False)
    assert "conv" in [k.emitter for k in program.kernels.values()] and not program.notes
    (got,) = emulate.run_program(program, _args(g, inputs, "f32"))
    np.testing.assert_allclose(got, g.reference(**inputs)[0], **TOL["f32"])


def _blobs(text: str) -> dict[str, np.ndarray]:
    found = re.findall(r'^\s*([\w.]+): "0x([0-9A-F]+)"', text, re.M)
    return {k: np.frombuffer(bytes.fromhex(h)[4:], np.float32) for k, h in found}


# file, (weight shape, bias shape) in the order of the constants, stride, groups, relu
TORCH_MLIR = {
    "conv_relu": (((8, 3, 3, 3), (8,)), 1, 1, True),
    "conv_grouped": (((8, 2, 3, 3), (8,)), 1, 4, False),
    "conv_depthwise": (((8, 1, 3, 3), (8,)), 2, 8, False),
}


@pytest.mark.parametrize("name", list(TORCH_MLIR))
def test_torch_mlir_convolutions_are_one_kernel_matching_numpy(name):
    (w_shape, b_shape), stride, groups, relu = TORCH_MLIR[name]
    path = INPUTS / f"{name}.mlir"
    text = path.read_text()
    order = re.findall(r"dense_resource<([\w.]+)>", text)
    blobs = _blobs(text)
    w, b = (blobs[n].reshape(s).astype(np.float64) for n, s in zip(order, (w_shape, b_shape)))
    x = np.random.default_rng(0).uniform(-1, 1, (1, w_shape[1] * groups, 16, 16)).astype(np.float32)
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (1, 1), (1, 1)])
    want = _conv2d(padded, w, (stride, stride), (1, 1), groups) + b.reshape(1, -1, 1, 1)
    want = np.maximum(want, 0) if relu else want
    exe = opfuse.compile(str(path), backend="cpu")
    np.testing.assert_allclose(exe(x), want, **TOL["f32"])
    program, _ = _one_conv_kernel(exe, lower=False)
    (got,) = emulate.run_program(program, [x])
    np.testing.assert_allclose(got, want, **TOL["f32"])
