"""PyTorch models through the GPU code generator: imported, fused, compiled to kernels and
run by the emulator, against eager PyTorch.

The torch tests check imported models on the CPU backend; this checks the other half of
``torch.compile(model, backend="opfuse")`` on a GPU: every fused group of a real model
must have an emitter (an importer construct the evaluator does not know fails here, not
on the first GPU run: torch's MultiheadAttention slices its packed QKV projection with a
rank-reducing ``tensor.extract_slice``, which no emitter could build) and its kernels
must compute what eager computes.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opfuse.testing.emulator import emulate  # noqa: E402
from opfuse.backends.gpu.compiler import compile_module  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402

import torch_models as tm  # noqa: E402
from test_codegen_common import compile_cpu  # noqa: E402

#: Tolerance relative to the largest |eager| value (the torch tests' f32 figure, x10: the
#: emulator sums in another order than the CPU backend).
RTOL = 1e-4

MODELS = {
    "seed_mlp": (lambda: tm.seed_mlp(64), lambda: (torch.randn(32, 64),)),
    "softmax": (tm.Softmax, lambda: (torch.randn(8, 40),)),
    "attention": (tm.Attention, lambda: tuple(torch.randn(2, 2, 12, 8) for _ in range(3))),
    "rmsnorm_swiglu": (lambda: tm.RMSNormSwiGLU(32, 48), lambda: (torch.randn(10, 32),)),
    "encoder_layer": (
        lambda: torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True),
        lambda: (torch.randn(2, 9, 32),),
    ),
    **{f"mask:{k}": v for k, v in tm.MASKS.items()},
}


@pytest.mark.parametrize("name", list(MODELS))
def test_emulated_kernels_of_imported_models_match_eager(name):
    make_model, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model, inputs = make_model().eval(), make_inputs()
    with torch.no_grad():
        want = model(*inputs)
    imported = import_module(model, inputs)
    program = compile_module(compile_cpu(imported.graph)._source, lower=False)
    assert program.kernels
    got = emulate.run_program(program, imported.arguments(*inputs))
    wants = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, wants):
        w = w.detach().numpy()
        g = g.view(np.bool_) if w.dtype == np.bool_ else g
        scale = max(1.0, float(np.nanmax(np.abs(w.astype(np.float64))))) if w.size else 1.0
        np.testing.assert_allclose(
            g.astype(np.float64), w.astype(np.float64), rtol=0, atol=RTOL * scale
        )


HALF = {torch.float16: 1e-2, torch.bfloat16: 3e-2}  # the torch tests' half tolerances


@pytest.mark.parametrize("dtype", list(HALF), ids=["f16", "bf16"])
@pytest.mark.parametrize("name", ["seed_mlp", "attention", "rmsnorm_swiglu", "mask:causal_sdpa"])
def test_half_precision_kernels_match_eager(name, dtype):
    """f16 and bf16 kernels (bf16 emulated as float32 values rounded to nearest even
    wherever the IR makes a bf16 value, stored as its 16 bits), against eager in the
    same dtype."""
    make_model, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = make_model().eval().to(dtype)
    inputs = tuple(t.to(dtype) for t in make_inputs())
    with torch.no_grad():
        want = model(*inputs).float().numpy()
    imported = import_module(model, inputs)
    program = compile_module(compile_cpu(imported.graph)._source, lower=False)
    (got,) = emulate.run_program(program, imported.arguments(*inputs))
    if dtype == torch.bfloat16:
        got = (got.astype(np.uint32) << 16).view(np.float32)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=HALF[dtype] * scale)
