"""The convolutional ops of real models through the torch importer
(``opfuse.frontends.torch.aten_conv``): 1-D and 2-D convolutions (stride, padding,
dilation, groups, bias) with eval-mode BatchNorm and ReLU, GroupNorm, vector norms (weight
norm), max and average pooling, compiled on the CPU backend against eager (f32:
max |opfuse - eager| <= 1e-5 * max(1, max |eager|)), with nothing left eager; and the GPU
kernels of a small CNN in the emulator against eager.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import opfuse.torch  # noqa: E402
from opfuse.testing.emulator import emulate  # noqa: E402
from opfuse.backends.gpu.compiler import compile_module  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402

from test_codegen_common import compile_cpu  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 8)
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 3, padding=2, groups=4))

    def forward(self, x):
        y = self.conv(self.gn(x))
        return y, torch.linalg.vector_norm(x, dim=-1), x.norm(p=1, dim=1), x.abs().amax()


MODELS = {
    "conv2d_bn_relu_pool": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=2),
            nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(3, stride=1, padding=1),
            nn.MaxPool2d(3, stride=2, padding=1),
        ),
        (2, 3, 16, 16),
    ),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(4, 6, 5, stride=2), nn.GELU()), (2, 4, 33)),
    "norms": (Norms, (2, 8, 12)),
}


def _model(name):
    torch.manual_seed(0)
    factory, shape = MODELS[name]
    model = factory().eval()
    with torch.no_grad():  # non-trivial running statistics
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(*shape)


def _close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = (g - w).abs().max().item()
        assert err <= 1e-5 * max(1.0, w.abs().max().item()), err


@pytest.mark.parametrize("name", list(MODELS))
def test_conv_models_compile_with_nothing_eager(name):
    model, x = _model(name)
    fast = opfuse.torch.compile(model, (x,), backend="cpu")
    with torch.no_grad():
        _close(fast(x), model(x))
    assert fast.report["eager"] == []
    totals = fast.report["totals"]
    assert totals["after"]["kernels"] < totals["before"]["kernels"]


def test_bn_and_relu_fuse_into_the_convolution():
    """conv -> BatchNorm (running statistics) -> ReLU: one kernel."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    fast = opfuse.torch.compile(model, (x,), backend="cpu")
    with torch.no_grad():
        _close(fast(x), model(x))
    assert fast.report["totals"]["after"]["kernels"] == 1, fast.report["partitions"][0]["report"]["kernels"]


class NoPadding(nn.Module):
    """GroupNorm, a grouped 1-D convolution without padding, GELU, vector norms."""

    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 8)
        self.conv = nn.Conv1d(8, 8, 3, stride=2, groups=4)

    def forward(self, x):
        y = nn.functional.gelu(self.conv(self.gn(x)))
        return y, torch.linalg.vector_norm(y, dim=-1)


def test_emulated_kernels_match_eager():
    """The GPU kernels (emulated, race check on) of group norm, a grouped 1-D convolution
    and vector norms. (Padded convolutions and pooling: test_gpu_conv_models.py.)"""
    torch.manual_seed(0)
    model, x = NoPadding().eval(), torch.randn(2, 8, 11)
    with torch.no_grad():
        want = model(x)
    imported = import_module(model, (x,))
    program = compile_module(compile_cpu(imported.graph)._source, lower=False)
    for got, w in zip(emulate.run_program(program, imported.arguments(x)), want):
        w = w.numpy()
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-4 * scale)
