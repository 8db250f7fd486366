"""The PyTorch models the torch tests share (imported after ``pytest.importorskip("torch")``)."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


def seed_mlp(d: int = 256, approximate: str = "tanh") -> nn.Module:
    """The seed's demo: Linear(d,d) -> GELU -> Linear(d,d) -> GELU (G1 uses tanh GELU)."""
    return nn.Sequential(
        nn.Linear(d, d), nn.GELU(approximate), nn.Linear(d, d), nn.GELU(approximate)
    )


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Attention(nn.Module):
    """softmax(Q Kᵀ / sqrt(d)) V written with matmuls (G5)."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


class RMSNormSwiGLU(nn.Module):
    """G7: down(silu(gate(h)) * up(h)) with h = RMSNorm(x)."""

    def __init__(self, d: int = 256, hidden: int = 512):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return self.down(F.silu(self.gate(h)) * self.up(h))


def encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=256, nhead=4, batch_first=True)


# --------------------------------------------------------------------------- masks


class CausalAttention(nn.Module):
    """``F.scaled_dot_product_attention(..., is_causal=True)``."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class MaskedAttention(nn.Module):
    """SDPA with a boolean ``attn_mask`` input (True: attend)."""

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class GPT2Attention(nn.Module):
    """nanoGPT's masked attention: a registered float tril buffer, ``masked_fill(== 0)``.

    With ``boolean=True``, Hugging Face GPT-2's form instead: a bool tril buffer and
    ``torch.where(mask, scores, min)``.
    """

    def __init__(self, block: int = 16, boolean: bool = False):
        super().__init__()
        tril = torch.tril(torch.ones(block, block, dtype=torch.bool if boolean else None))
        self.register_buffer("bias", tril.view(1, 1, block, block))
        self.boolean = boolean

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.boolean:
            low = torch.finfo(att.dtype).min
            att = torch.where(self.bias[:, :, :t, :t], att, torch.full([], low))
        else:
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


class LeakyWhere(nn.Module):
    """``torch.where`` with a comparison against a scalar."""

    def forward(self, x):
        return torch.where(x > 0, x, 0.1 * x)


class ArangeAdd(nn.Module):
    """``torch.arange`` (float32) added to the input's last axis."""

    def forward(self, x):
        return x + torch.arange(x.shape[-1], dtype=torch.float32)


class CausalEncoderLayer(nn.Module):
    """A post-norm encoder layer over a causal mask built in ``forward``."""

    def __init__(self, d: int = 32, heads: int = 4, ff: int = 64):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, ff, batch_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x, src_mask=mask, is_causal=True)


def module_of(f: Callable) -> nn.Module:
    """A module whose forward is ``f``."""
    return type("Fn", (nn.Module,), {"forward": lambda self, *a: f(*a)})()


def _qkv(q=(2, 4, 16, 8), kv=None) -> Callable[[], tuple]:
    return lambda: (torch.randn(*q), torch.randn(*(kv or q)), torch.randn(*(kv or q)))


def _x_mask(shape=(4, 8)) -> Callable[[], tuple]:
    return lambda: (torch.randn(*shape), torch.rand(*shape) < 0.5)


def _nan_input() -> tuple:
    x = torch.randn(4, 8)
    x[1, 2] = x[3, 0] = float("nan")
    return (x,)


def _causal_or_random(*shape) -> torch.Tensor:
    """A random boolean mask that keeps the diagonal (no fully masked row: there torch's
    softmax gives 0 and opfuse's NaN, see opfuse.frontends.torch.aten_reductions)."""
    return (torch.rand(*shape) < 0.5) | torch.eye(shape[-2], shape[-1], dtype=torch.bool)


# name -> (model, inputs): masks, comparisons, selection, casts, arange, full. Each one was
# an unsupported op before (aten.gt, aten.eq, aten.arange, SDPA's is_causal, ...).
MASKS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple]]] = {
    "causal_sdpa": (CausalAttention, _qkv()),
    "causal_sdpa_cross": (CausalAttention, _qkv((2, 2, 6, 8), (2, 2, 10, 8))),
    "sdpa_bool_mask": (MaskedAttention, lambda: (*_qkv()(), _causal_or_random(2, 1, 16, 16))),
    "gpt2_masked_fill": (GPT2Attention, _qkv()),
    "gpt2_bool_buffer": (lambda: GPT2Attention(boolean=True), _qkv()),
    "where_scalar": (LeakyWhere, lambda: (torch.randn(4, 8),)),
    "arange_add": (ArangeAdd, lambda: (torch.randn(4, 8),)),
    "causal_encoder_layer": (CausalEncoderLayer, lambda: (torch.randn(2, 16, 32),)),
    "compare": (
        lambda: module_of(
            lambda x, y: (x > y).float()
            + (x >= 0.3) * 1.0
            + (x < y) * 2.0
            + (x <= -0.2) * 3.0
            + (x == y) * 4.0
            + (x != 0)
            + (y == x[0]) * 5.0
        ),
        lambda: (torch.randn(4, 8).round(), torch.randn(8).round()),
    ),
    "compare_nan": (
        lambda: module_of(lambda x: torch.where(x != x, 0.0, x) + (x == x) + (x > 0) + (x <= 0)),
        _nan_input,
    ),
    "tril_triu": (
        lambda: module_of(lambda x: x.tril() + x.triu(2) * 2 + x.tril(-1) * 3),
        lambda: (torch.randn(4, 8),),
    ),
    "logical": (
        lambda: module_of(
            lambda x, m: torch.where(m & (x > 0) | ~m, x, -x)
            + torch.logical_not(m) * 1.0
            + torch.logical_or(m, x < 0).float()
            + torch.logical_and(x, m).float()
            + torch.logical_not(x)
        ),
        _x_mask(),
    ),
    "masked_fill_tensor": (
        lambda: module_of(lambda x, m: x.masked_fill(m, torch.tensor(3.0))),
        _x_mask(),
    ),
    "arange_mask": (
        lambda: module_of(
            lambda x: torch.where(torch.arange(8)[None, :] <= torch.arange(4)[:, None], x, 0.0)
        ),
        lambda: (torch.randn(4, 8),),
    ),
    "arange_steps_and_ints": (
        lambda: module_of(
            lambda x: x * torch.arange(1, 9, 0.5)[::2]
            + torch.arange(8.0)
            + torch.arange(8) * 2
            - (torch.arange(8) < 2.5).float()
            + torch.arange(3, 19, 2) / 4
        ),
        lambda: (torch.randn(4, 8),),
    ),
    "full_ones_zeros": (
        lambda: module_of(
            lambda x: x
            + torch.ones_like(x)
            + torch.zeros(4, 8)
            + x.new_ones(8) * 2
            + torch.full((4, 1), 0.5)
        ),
        lambda: (torch.randn(4, 8),),
    ),
    "square_subsequent_mask": (
        lambda: module_of(
            lambda x: torch.softmax(x + nn.Transformer.generate_square_subsequent_mask(8)[:4], -1)
        ),
        lambda: (torch.randn(4, 8),),
    ),
    "casts": (
        lambda: module_of(
            lambda x, m: x.half().float()
            + m.to(x.dtype)
            + x.to(torch.bfloat16).float()
            + (x > 0).to(torch.int64) * x
            + (x * 4).long()
            + x.bool().float()
        ),
        _x_mask(),
    ),
    "bool_and_int_outputs": (
        lambda: module_of(lambda x: (x > 0, torch.arange(8) + 1, x * 2)),
        lambda: (torch.randn(4, 8),),
    ),
}


# --------------------------------------------------------------------------- concatenation


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Llama's ``rotate_half``: the halves of the last axis swapped, the moved one negated."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rope(nn.Module):
    """Rotary position embedding with the tables as inputs: x * cos + rotate_half(x) * sin."""

    def forward(self, x, cos, sin):
        return x * cos + rotate_half(x) * sin


class LlamaRotary(nn.Module):
    """Hugging Face's ``LlamaRotaryEmbedding``: cos/sin of position x inverse frequency,
    computed in ``forward`` (an outer product as a matmul, the angles concatenated twice)."""

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class LlamaAttention(nn.Module):
    """Llama's attention block: Q/K/V projections, RoPE on Q and K, grouped-query K/V
    repeated to every head (``repeat_kv``), causal SDPA, output projection."""

    def __init__(self, d: int = 64, heads: int = 4, kv_heads: int = 2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.rotary = LlamaRotary(self.head_dim)

    def _repeat_kv(self, x):
        b, h, t, hd = x.shape
        n_rep = self.heads // self.kv_heads
        return x[:, :, None, :, :].expand(b, h, n_rep, t, hd).reshape(b, h * n_rep, t, hd)

    def forward(self, x):
        b, t, d = x.shape
        cos, sin = self.rotary(x, torch.arange(t).unsqueeze(0).expand(b, -1))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(
            q, self._repeat_kv(k), self._repeat_kv(v), is_causal=True
        )
        return self.o_proj(o.transpose(1, 2).reshape(b, t, d))


# name -> (model, inputs): concatenation (aten.cat), each one unsupported before.
CONCAT: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple]]] = {
    "rope": (Rope, lambda: (torch.randn(2, 4, 16, 64), torch.randn(16, 64), torch.randn(16, 64))),
    "llama_attention": (LlamaAttention, lambda: (torch.randn(2, 16, 64),)),
    "cat_axes": (
        # unequal odd sizes, 2 and 3 inputs, along each axis (negative dims too)
        lambda: module_of(
            lambda a, b, c, d: (
                torch.cat([a, b.exp()], 0) * 2,
                torch.cat([a, c, -a], 1) + 1,
                torch.cat([d, a * a, d], -1),
                torch.cat([d.tanh(), -d], dim=-3),
            )
        ),
        lambda: (
            torch.randn(3, 5, 7),
            torch.randn(2, 5, 7),
            torch.randn(3, 1, 7),
            torch.randn(3, 5, 2),
        ),
    ),
    "cat_promotes_and_stacks": (
        lambda: module_of(
            lambda x, y: torch.cat([x.half(), y], -1).sum(-1, keepdim=True)
            + torch.stack([x, y[..., :4]], dim=1).amax(1)
            + torch.cat(torch.chunk(y, 3, dim=-1)[::-1], -1)[..., 2:6]
        ),
        lambda: (torch.randn(4, 4), torch.randn(4, 9)),
    ),
}
