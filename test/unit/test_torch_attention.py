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
from opfuse.frontends.torch import import_module  # noqa: E402
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
