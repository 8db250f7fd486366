"""Attention from PyTorch models imports as one attention kernel (issue #11): SDPA with and
without ``is_causal``, with a boolean and a float ``attn_mask``, ``nn.MultiheadAttention``,
GPT-2's ``masked_fill`` attention (nanoGPT's float tril buffer and Hugging Face's bool one
with ``torch.where``) and Llama's grouped-query attention. Each program is compiled for the
CPU backend and run against torch eager."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import opfuse  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402
from test_torch_backend import dynamo  # noqa: E402,F401  (fixture: Executables compiled)
from torch_models import (  # noqa: E402
    Attention,
    CausalAttention,
    GPT2Attention,
    LlamaAttention,
    MaskedAttention,
    module_of,
)


class MHA(nn.Module):
    """``nn.MultiheadAttention`` (packed in-projection, batch first), self-attention."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def _qkv(shape=(2, 4, 16, 8)):
    return tuple(torch.randn(*shape) for _ in range(3))


def _bool_mask():
    m = torch.rand(2, 1, 16, 16) > 0.3
    m[:, :, :, 0] = True  # every row attends to something
    return m


MODELS = {
    "sdpa": (Attention, _qkv),
    "sdpa_causal": (CausalAttention, _qkv),
    "sdpa_bool_mask": (MaskedAttention, lambda: (*_qkv(), _bool_mask())),
    "sdpa_float_mask": (
        lambda: module_of(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)),
        lambda: (*_qkv(), torch.randn(2, 1, 16, 16)),
    ),
    "multihead_attention": (MHA, lambda: (torch.randn(2, 16, 32),)),
    "gpt2_masked_fill": (GPT2Attention, _qkv),
    "gpt2_bool_where": (lambda: GPT2Attention(boolean=True), _qkv),
    "llama_gqa": (LlamaAttention, lambda: (torch.randn(2, 16, 64),)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_attention_is_one_kernel(name):
    torch.manual_seed(0)
    factory, make_inputs = MODELS[name]
    model, inputs = factory().eval(), make_inputs()
    imported = import_module(model, inputs)
    exe = opfuse.compile(imported.graph, backend="cpu")
    kinds = [k["kind"] for k in exe.report["kernels"]]
    assert kinds.count("attention") == 1, kinds
    (att,) = [k for k in exe.report["kernels"] if k["kind"] == "attention"]
    assert att["attention"]["q_s"] > 0
    # nothing of the softmax is left outside the attention kernel
    assert not any(k["kind"] == "input" and "softmax" in " ".join(k["members"])
                   for k in exe.report["kernels"])
    if name == "llama_gqa":  # its Q, K and V projections: one horizontal kernel
        assert kinds.count("horizontal") == 1, kinds
    got = exe(*imported.arguments(*inputs))
    got = got[0] if isinstance(got, (list, tuple)) else got
    with torch.no_grad():
        want = model(*inputs).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


# ------------------------------------------------- grouped-query SDPA (enable_gqa=True)
# torch's SDPA with ``enable_gqa=True`` reads K/V head h // (Hq / Hkv) for query head h;
# transformers' default (``sdpa``) attention calls it so whenever it has no mask tensor.
# The importer broadcasts each K/V head over its group (``repeat_kv``'s form), which
# opfuse-fuse-attention takes as a broadcast by indexing map: one kernel, no K/V copy.

def _gqa_inputs(mask: bool):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    return (q, k, v, torch.randn(2, 1, 16, 16)) if mask else (q, k, v)


def _gqa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _gqa_masked(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)


GQA = {"causal": (_gqa_causal, False), "float_mask": (_gqa_masked, True)}


@pytest.mark.parametrize("name", list(GQA))
def test_gqa_sdpa_through_torch_compile_is_one_attention_kernel(name, dynamo):
    import warnings

    import opfuse.torch

    fn, mask = GQA[name]
    inputs = _gqa_inputs(mask)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)  # nothing left eager
        got = torch.compile(fn, backend="opfuse", options={"backend": "cpu"})(*inputs)
        want = fn(*inputs)
    (exe,) = dynamo  # the one Executable torch.compile(backend="opfuse") made
    assert [k["kind"] for k in exe.report["kernels"]] == ["attention"], exe.report["kernels"]
    assert exe.report["kernels"][0]["attention"]["q_s"] > 0
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(GQA))
def test_gqa_sdpa_gpu_kernel_in_the_emulator(name):
    from opfuse.testing.emulator import emulate
    from opfuse.backends.gpu.compiler import compile_module

    fn, mask = GQA[name]
    inputs = _gqa_inputs(mask)
    imported = import_module(module_of(fn), inputs)
    exe = opfuse.compile(imported.graph, backend="cpu")
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention"], program.notes
    (got,) = emulate.run_program(program, imported.arguments(*inputs))
    with torch.no_grad():
        want = fn(*inputs).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_gqa_sdpa_broadcast_batch_is_left_eager_with_its_reason():
    """K/V with a batch of 1 broadcast over the queries' (torch allows it): refused with
    its reason, the op runs eagerly between the compiled partitions, the result is eager's."""
    import opfuse.torch

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q * 2.0, k, v, enable_gqa=True) + 1.0

    torch.manual_seed(0)
    inputs = (torch.randn(2, 8, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8))
    with pytest.warns(opfuse.torch.FallbackWarning, match="scaled_dot_product_attention"):
        compiled = opfuse.torch.compile(module_of(fn), inputs, backend="cpu")
    (eager,) = compiled.report["eager"]
    assert eager["op"] == "aten.scaled_dot_product_attention.default", eager
    assert "enable_gqa with key/value shape (1, 2, 16, 8) for query shape (2, 8, 16, 8)" \
        in eager["reason"], eager
    with torch.no_grad():
        np.testing.assert_allclose(compiled(*inputs).numpy(), fn(*inputs).numpy(), atol=1e-5)


def test_gqa_heads_not_a_multiple_is_refused():
    """Query heads not a multiple of K/V heads: torch itself refuses such a call, so the
    rule is called directly: an OpfuseError that says why (never a traceback)."""
    from opfuse.errors import OpfuseError
    from opfuse.frontends.builder.graph import Graph
    from opfuse.frontends.torch.aten_matmul import _sdpa

    class Context:
        g, name, node = Graph("gqa"), "sdpa", None

        def unsupported(self, detail):
            return OpfuseError(f"aten.scaled_dot_product_attention: {detail}")

    g = Context.g
    q, kv = g.input("q", (1, 6, 4, 8)), g.input("kv", (1, 4, 4, 8))
    with pytest.raises(OpfuseError, match="6 query heads over 4 key/value heads"):
        _sdpa(Context(), q, kv, kv, enable_gqa=True)


def test_llama_decoder_layer_default_sdpa_attention():
    """transformers' LlamaDecoderLayer with its default attention (``sdpa``: GQA through
    ``enable_gqa=True`` and ``is_causal``, as no mask tensor is given): the same 7 kernels as
    with eager attention (test_torch_block_kernels.py), one of them attention with the
    rotary embedding as its prologue; = eager."""
    from collections import Counter

    pytest.importorskip("transformers", reason="the Llama block needs the zoo extra")
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, num_hidden_layers=1, vocab_size=64)
    torch.manual_seed(0)
    llama = LlamaModel(cfg).eval()  # a model resolves the default attention implementation
    assert llama.config._attn_implementation == "sdpa"
    layer = llama.layers[0]

    def block(x, cos, sin):
        out = layer(x, position_embeddings=(cos, sin), attention_mask=None)
        return out[0] if isinstance(out, tuple) else out

    model = module_of(block)
    model.layer = layer  # its parameters are the module's
    x = torch.randn(2, 9, 32)
    cos, sin = llama.rotary_emb(x, torch.arange(9)[None].expand(2, -1))
    imported = import_module(model, (x, cos, sin))
    # SDPA itself, K/V not repeated before it (no expand: enable_gqa does the broadcast)
    assert imported.aten_ops["aten.scaled_dot_product_attention.default"] == 1
    assert not any("expand" in op for op in imported.aten_ops), imported.aten_ops
    exe = opfuse.compile(imported.graph, backend="cpu")
    kinds = Counter(k["kind"] for k in exe.report["kernels"])
    assert kinds == Counter({"input": 2, "horizontal": 2, "attention": 1,
                             "output": 2}), exe.report["kernels"]
    got = exe(*imported.arguments(x, cos, sin))
    with torch.no_grad():
        want = model(x, cos, sin).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))
