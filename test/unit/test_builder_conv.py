"""The builder's ``pad`` and ``conv2d``: the IR they print, their numpy reference against
torch (float64), and CPU runs (fused and unfused) against the reference.

Tolerances: f32 rtol 1e-4 / atol 1e-5; f16 and bf16 2e-2 (their inputs and results are
rounded to the dtype; accumulation is f32 in the IR and exact in the reference).
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.builder import Graph
from opfuse.errors import OpfuseError
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

TOL = {"f32": dict(rtol=1e-4, atol=1e-5), "f16": dict(rtol=2e-2, atol=2e-2),
       "bf16": dict(rtol=2e-2, atol=2e-2)}

# (input channels, output channels, groups, stride, padding, dilation, bias)
CONFIGS = [
    (3, 8, 1, 1, 1, 1, True),  # a ResNet stem-like 3x3, same padding
    (4, 6, 1, (2, 1), (1, 2), (1, 2), True),  # asymmetric stride/padding/dilation
    (8, 8, 4, 1, 1, 1, False),  # grouped
    (8, 8, 8, 2, 1, 1, True),  # depthwise, strided
    (6, 4, 2, 1, 0, 1, True),  # grouped, no padding
]


def _conv_graph(cin, cout, groups, stride, padding, dilation, bias, dtype="f32", k=3):
    g = Graph("conv", dtype=dtype)
    x = g.input("x", (2, cin, 9, 10))
    w = g.input("w", (cout, cin // groups, k, k))
    b = g.input("b", (cout,)) if bias else None
    y = g.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    g.output(g.relu(y))
    return g


def _args(g: Graph, inputs: dict, dtype: str) -> list[np.ndarray]:
    arrays = [inputs[t.name] for t in g.inputs]
    return [float32_to_bf16_bits(a) for a in arrays] if dtype == "bf16" else arrays


def _values(out, dtype: str) -> np.ndarray:
    return bf16_bits_to_float32(out) if dtype == "bf16" else out


def test_forms_are_the_ones_torch_mlir_prints():
    text = _conv_graph(3, 8, 1, 1, 1, 1, True).to_mlir()
    assert "tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1]" in text
    assert "linalg.conv_2d_nchw_fchw {dilations = dense<[1, 1]> : vector<2xi64>" in text
    assert "affine_map<(d0, d1, d2, d3) -> (d1)>" in text  # the bias reads the channel vector
    grouped = _conv_graph(8, 8, 4, 1, 1, 1, False).to_mlir()
    assert "linalg.conv_2d_ngchw_gfchw" in grouped and "tensor<2x4x2x11x12xf32>" in grouped
    assert "tensor<4x2x2x3x3xf32>" in grouped and "tensor.collapse_shape" in grouped
    depthwise = _conv_graph(8, 8, 8, 2, 1, 1, True).to_mlir()
    assert "linalg.depthwise_conv_2d_nchw_chw" in depthwise and "tensor<8x3x3xf32>" in depthwise
    half = _conv_graph(3, 8, 1, 1, 1, 1, True, dtype="f16").to_mlir()
    assert "outs(%" in half and "tensor<2x8x9x10xf32>" in half and "arith.truncf" in half


@pytest.mark.parametrize("config", CONFIGS)
def test_reference_matches_torch(config):
    torch = pytest.importorskip("torch")
    cin, cout, groups, stride, padding, dilation, bias = config
    g = _conv_graph(*config)
    inputs = g.random_inputs(3)
    (got,) = g.reference(**inputs)
    t = {k: torch.tensor(v.astype(np.float64)) for k, v in inputs.items()}
    want = torch.relu(torch.nn.functional.conv2d(
        t["x"], t["w"], t.get("b"), stride=stride, padding=padding, dilation=dilation,
        groups=groups)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# every configuration in f32; half precision on the asymmetric one (keeps CI time down)
@pytest.mark.parametrize(
    "config, dtype", [(c, "f32") for c in CONFIGS] + [(CONFIGS[1], "f16"), (CONFIGS[1], "bf16")]
)
def test_cpu_fused_and_unfused_match_the_reference(config, dtype):
    g = _conv_graph(*config, dtype=dtype)
    inputs = g.random_inputs(1)
    (want,) = g.reference(**inputs)
    for fusion in (True, False):
        exe = opfuse.compile(g, backend="cpu", fusion=fusion)
        got = _values(exe(*_args(g, inputs, dtype)), dtype)
        np.testing.assert_allclose(got.astype(np.float64), want, **TOL[dtype])


def test_pad_matches_numpy_on_cpu():
    g = Graph("p")
    x = g.input("x", (3, 4, 5))
    g.output(g.exp(g.pad(x, [(1, 0), (2, 3), (0, 1)], value=-1.5)))
    inputs = g.random_inputs(0)
    want = np.exp(np.pad(inputs["x"].astype(np.float64), [(1, 0), (2, 3), (0, 1)],
                         constant_values=-1.5))
    np.testing.assert_allclose(g.reference(**inputs)[0], want, rtol=1e-6)
    got = opfuse.compile(g, backend="cpu")(inputs["x"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert g.pad(x, [(0, 0)] * 3) is x  # nothing to pad: the tensor itself


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda g: g.pad(g.input("x", (4, 8)), [(1, 1)]), "expected 2 non-negative"),
        (lambda g: g.pad(g.input("x", (4, 8)), [(1, 1), (-1, 0)]), "expected 2 non-negative"),
        (lambda g: g.pad(g.input("x", (4,), "i64"), [(1, 1)]), "i64 operands"),
        (lambda g: g.conv2d(g.input("x", (1, 3, 8, 8)), g.input("w", (4, 3, 3))), "4-D"),
        (lambda g: g.conv2d(g.input("x", (1, 4, 8, 8)), g.input("w", (4, 4, 3, 3)), groups=2),
         "groups=2"),
        (lambda g: g.conv2d(g.input("x", (1, 3, 8, 8)), g.input("w", (4, 3, 3, 3)), stride=0),
         "stride"),
        (lambda g: g.conv2d(g.input("x", (1, 3, 2, 2)), g.input("w", (4, 3, 3, 3))),
         "does not fit"),
        (lambda g: g.conv2d(g.input("x", (1, 3, 8, 8)), g.input("w", (4, 3, 3, 3)),
                            g.input("b", (3,))), r"bias must have shape \(4,\)"),
        (lambda g: g.conv2d(g.input("x", (1, 3, 8, 8)), g.input("w", (4, 3, 3, 3)),
                            padding=(1, 2, 3)), "padding"),
    ],
)
def test_errors(build, message):
    with pytest.raises(OpfuseError, match=message):
        build(Graph("e"))
