"""A decoder's attention whose permuted K and V are also returned (the KV cache, GPT-2's
``present``) is one attention kernel: the kernel reads K and V through its own views, and a
loop kernel beside it writes the returned K and V (opfuse-fuse-attention clones the view
ops out of the attention group). Checked on a GPT-2-style block imported from PyTorch, on
the CPU backend and in the emulator (race check on), against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import opfuse  # noqa: E402
from opfuse.testing.emulator import emulate  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402


class CachedAttention(nn.Module):
    """GPT-2's attention block as Hugging Face writes it: one packed QKV projection, split,
    heads by view + transpose, causal SDPA, the output projection; returns the output and
    the permuted K and V (the cache)."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d // self.heads))
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d)), k, v


def _compiled():
    torch.manual_seed(0)
    model, x = CachedAttention().eval(), torch.randn(2, 16, 32)
    imported = import_module(model, (x,))
    exe = opfuse.compile(imported.graph, backend="cpu")
    with torch.no_grad():
        want = [w.numpy() for w in model(x)]
    return exe, imported.arguments(x), want


def test_kv_returned_attention_is_one_kernel_and_a_copy():
    exe, args, want = _compiled()
    kernels = exe.report["kernels"]
    kinds = [k["kind"] for k in kernels]
    assert kinds.count("attention") == 1, kinds
    (att,) = [k for k in kernels if k["kind"] == "attention"]
    assert att["attention"]["q_s"] > 0
    # the attention kernel writes O alone: the cache is the copy kernel's
    assert att["bytes_written"] == 2 * 16 * 32 * 4
    copies = [k for k in kernels if k["kind"] == "loop" and k["flops"] == 0
              and k["bytes_written"] == 2 * 2 * 16 * 32 * 4]
    assert len(copies) == 1, [(k["name"], k["members"]) for k in kernels]
    assert not any(k["kind"] == "input" and "softmax" in " ".join(k["members"]) for k in kernels)
    (entry,) = [d for d in exe.report["decisions"] if d["pass_name"] == "opfuse-fuse-attention"]
    assert entry["fused"] and "copied out by 1 kernel" in entry["reason"], entry
    got = exe(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_kv_returned_attention_in_the_emulator():
    exe, args, want = _compiled()
    program = exe.gpu_program(("sm_80",), ptxas=False)
    emitters = sorted(k.emitter for k in program.kernels.values())
    assert emitters.count("attention") == 1, emitters
    got = emulate.run_program(program, [np.asarray(a) for a in args])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
