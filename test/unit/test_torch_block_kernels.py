"""Kernel counts of imported transformer blocks (issue 11: "imported
nn.TransformerEncoderLayer and a Llama decoder block the same shape" as G6).

torch imports each ``nn.Linear`` on a 3-D input as matmul on the flattened rows, then an
``expand_shape`` back to ``[B, S, N]`` ("unflat"), then the bias add: the epilogue goes
through that reshape (see test_epilogue_reshape.py), so every projection is one kernel
with its bias (and activation).

* ``nn.TransformerEncoderLayer`` (batch_first; post-norm and pre-norm): 7 kernels — the
  packed QKV projection + bias, attention, the out projection + bias, LN1, FFN1 + bias +
  ReLU, FFN2 + bias, LN2 (each residual add joins a neighbour); CPU = eager (f32), and
  the GPU kernels in the emulator = eager in f32 and bf16 with the matmul kernels on the
  matmul emitters (``matmul``/``mma``), never the ``fallback``.
* transformers' ``LlamaDecoderLayer`` (GQA, eager attention, rotary tables as inputs):
  7 kernels, G6's shape: RMSNorm, QKV (one horizontal kernel), attention with the rotary
  embedding of Q and K as its prologue, o_proj, RMSNorm (+ the residual), gate/up
  (horizontal, SiLU·mul), down + residual. RoPE's ``rotate_half`` reads each head's other
  half (columns d ± D/2 of the projection: another thread's accumulators, behind the head
  transpose), so it is no matmul epilogue; the attention kernel evaluates it while it
  stages Q and each K tile (opfuse-fuse-attention's prologues). In bf16 that kernel is
  the tensor-core one.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opfuse.testing.emulator import emulate  # noqa: E402
from opfuse.backends.gpu.compiler import compile_module  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402

from test_codegen_common import compile_cpu  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

#: Emulated kernels vs eager, relative to max(1, max|eager|): f32 as test_torch_kernels.py
#: (another summation order), bf16 as the half-precision torch tests.
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
ENCODER_KINDS = Counter({"output": 4, "attention": 1, "input": 2})
EMITTERS = {
    torch.float32: Counter({"matmul": 4, "attention": 1, "rows": 2}),
    torch.bfloat16: Counter({"mma": 4, "attention_mma": 1, "rows": 2}),
}


def _encoder(norm_first: bool, dtype=torch.float32):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first)
    return layer.eval().to(dtype), (torch.randn(2, 9, 32).to(dtype),)


def _kinds(exe) -> Counter:
    return Counter(k["kind"] for k in exe.report["kernels"])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_transformer_encoder_layer_is_seven_kernels(norm_first):
    model, inputs = _encoder(norm_first)
    imported = import_module(model, inputs)
    exe = compile_cpu(imported.graph)
    assert exe.report["totals"]["after"]["kernels"] == 7, exe.report["kernels"]
    assert _kinds(exe) == ENCODER_KINDS  # no "loop" kernel: every bias is in its matmul's
    got = exe(*imported.arguments(*inputs))
    with torch.no_grad():
        want = model(*inputs).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_transformer_encoder_layer_gpu_kernels(norm_first, dtype):
    model, inputs = _encoder(norm_first, dtype)
    imported = import_module(model, inputs)
    program = compile_module(compile_cpu(imported.graph)._source, lower=False)
    assert Counter(k.emitter for k in program.kernels.values()) == EMITTERS[dtype], program.notes
    (got,) = emulate.run_program(program, imported.arguments(*inputs))
    if dtype == torch.bfloat16:
        got = (got.astype(np.uint32) << 16).view(np.float32)
    with torch.no_grad():
        want = model(*inputs).float().numpy()
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[dtype] * scale)


LLAMA_KINDS = Counter({"input": 2, "horizontal": 2, "attention": 1, "output": 2})


@pytest.fixture(scope="module")
def llama():
    """A tiny ``LlamaDecoderLayer`` (hidden 32, 4 query heads over 2 K/V heads, head dim 8)
    called with its rotary tables, and its inputs: ``(model, x, cos, sin)``."""
    pytest.importorskip("transformers", reason="the Llama block needs the zoo extra")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, attn_implementation="eager")
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x, cos, sin):
            out = self.layer(x, position_embeddings=(cos, sin), attention_mask=None)
            return out[0] if isinstance(out, tuple) else out

    x = torch.randn(2, 9, 32)
    cos, sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(9)[None].expand(2, -1))
    return Block().eval(), x, cos, sin


def _rope_inside(exe) -> None:
    (att,) = [k["members"] for k in exe.report["kernels"] if k["kind"] == "attention"]
    names = " ".join(att)
    assert "cat" in names and "neg" in names, att  # rotate_half of Q and K
    prologues = [d for d in exe.report["decisions"] if d["action"] == "attention prologue"]
    assert sorted(d["numbers"]["prologue"] for d in prologues if d["fused"]) == ["K", "Q"], prologues


def test_llama_decoder_layer_kernels(llama):
    model, x, cos, sin = llama
    imported = import_module(model, (x, cos, sin))
    exe = compile_cpu(imported.graph)
    assert _kinds(exe) == LLAMA_KINDS, exe.report["kernels"]
    _rope_inside(exe)
    got = exe(*imported.arguments(x, cos, sin))
    with torch.no_grad():
        want = model(x, cos, sin).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_llama_decoder_layer_bf16_attention_on_tensor_cores(llama):
    """bf16: the same 7 kernels, the attention (RoPE prologue included) on the tensor-core
    kernel (its PTX has mma.sync), not the SIMT fall-back; emulated = eager."""
    model, x, cos, sin = llama
    model = copy.deepcopy(model).to(torch.bfloat16)
    inputs = tuple(t.to(torch.bfloat16) for t in (x, cos, sin))
    imported = import_module(model, inputs)
    exe = compile_cpu(imported.graph)
    assert _kinds(exe) == LLAMA_KINDS, exe.report["kernels"]
    _rope_inside(exe)
    program = compile_module(exe._source, targets=("sm_90",), ptxas=False)
    assert Counter(k.emitter for k in program.kernels.values()) == Counter(
        {"rows": 2, "horizontal_mma": 2, "mma": 2, "attention_mma": 1}), program.notes
    (att,) = [k for k in program.kernels.values() if k.emitter == "attention_mma"]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in att.ptx["sm_90"]
    (got,) = emulate.run_program(program, imported.arguments(*inputs))
    got = (got.astype(np.uint32) << 16).view(np.float32)
    with torch.no_grad():
        want = model(*inputs).float().numpy()
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=TOL[torch.bfloat16] * scale)
