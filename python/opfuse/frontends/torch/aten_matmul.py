"""ATen rules for contractions: ``mm``/``bmm``, ``addmm``, ``linear``, ``matmul`` and
``scaled_dot_product_attention``, all on the builder's ``matmul``.

``linear``, ``matmul`` and attention arrive whole (``torch_decompositions.PRESERVED``) and
are written as the hand-made graphs write them (``opfuse.frontends.builder.graphs``), so they fuse
the same. Attention masks apply to the scaled scores before the softmax: a float mask is
added, a boolean mask keeps the scores where it is true (``where(mask, s, -inf)``), and
``is_causal=True`` keeps row i's columns j <= i, compared from two ``iota`` of the scores'
own shape so that the mask fuses into the softmax kernel. ``enable_gqa=True`` (grouped-query
attention, fewer K/V heads than query heads) broadcasts each K/V head over its group of
query heads, as transformers' ``repeat_kv`` does. How rules are written:
``aten_rule``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..builder.graph import Graph, Tensor
from .aten_rule import Rule, RuleContext, registrar

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


@rule("aten.mm.default", "aten.bmm.default")
def _mm(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.matmul(x, y, name=imp.name)


@rule("aten.addmm.default")
def _addmm(
    imp: RuleContext, bias: Tensor, x: Tensor, y: Tensor, *, beta: Any = 1, alpha: Any = 1
) -> Tensor:
    g, n = imp.g, imp.name
    mm = g.matmul(x, y, name=f"{n}.mm")
    if alpha != 1:
        mm = g.mul(mm, alpha, name=f"{n}.alpha")
    if beta != 1:
        bias = g.mul(bias, beta, name=f"{n}.beta")
    return g.add(mm, bias, name=n)


@rule("aten.linear.default")
def _linear(imp: RuleContext, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    # x @ Wᵀ (+ b) on 2-D operands, as the builder graphs write Linear: the transpose of
    # the weight fuses into the matmul's kernel; leading dims of x are folded and restored.
    g, n = imp.g, imp.name
    w_t = g.transpose(weight, (1, 0), name=f"{n}.wt") if weight.ndim == 2 else weight
    lead = x.shape[:-1]
    x2 = x if x.ndim == 2 else g.reshape(x, (-1, x.shape[-1]), name=f"{n}.flat")
    if w_t.ndim == 1:
        w_t = g.reshape(w_t, (w_t.shape[0], 1), name=f"{n}.wcol")
    y = g.matmul(x2, w_t, name=n if bias is None and x.ndim == 2 else f"{n}.mm")
    out = (*lead, weight.shape[0]) if weight.ndim == 2 else lead
    if y.shape != out:
        y = g.reshape(y, out, name=n if bias is None else f"{n}.unflat")
    return y if bias is None else g.add(y, bias, name=n)


@rule("aten.matmul.default")
def _matmul(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return _matmul_nd(imp.g, x, y, imp.name)


def _matmul_nd(g: Graph, x: Tensor, y: Tensor, n: str) -> Tensor:
    """``torch.matmul`` semantics on builder ops: 1-D promotion, folding, batch broadcast."""
    out_shape = (
        *np.broadcast_shapes(x.shape[:-2], y.shape[:-2]),
        *(x.shape[-2:-1] if x.ndim > 1 else ()),
        *(y.shape[-1:] if y.ndim > 1 else ()),
    )
    if x.ndim == 1:
        x = g.reshape(x, (1, x.shape[0]), name=f"{n}.lhs_row")
    if y.ndim == 1:
        y = g.reshape(y, (y.shape[0], 1), name=f"{n}.rhs_col")
    if y.ndim == 2 and x.ndim > 2:  # fold x's batch dims into its rows: one 2-D matmul
        x = g.reshape(x, (-1, x.shape[-1]), name=f"{n}.flat")
        r = g.matmul(x, y, name=n)
    elif x.ndim == y.ndim == 2:
        r = g.matmul(x, y, name=n)
    else:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]))
        x = g.broadcast_to(x, (*batch, *x.shape[-2:]), name=f"{n}.lhs_b")
        y = g.broadcast_to(y, (*batch, *y.shape[-2:]), name=f"{n}.rhs_b")
        if len(batch) > 2:
            x = g.reshape(x, (-1, *x.shape[-2:]), name=f"{n}.lhs3")
            y = g.reshape(y, (-1, *y.shape[-2:]), name=f"{n}.rhs3")
        r = g.matmul(x, y, name=n)
    return r if r.shape == tuple(out_shape) else g.reshape(r, out_shape, name=f"{n}.out")


@rule("aten.scaled_dot_product_attention.default")
def _sdpa(
    imp: RuleContext,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    # softmax(Q Kᵀ · scale) V, written like opfuse.frontends.builder.graphs._attention (G5, G6)
    if dropout_p:
        raise imp.unsupported(f"dropout_p={dropout_p} (call model.eval())")
    g, n = imp.g, imp.name
    if enable_gqa and k.shape[:-2] != q.shape[:-2]:
        k, v = _repeat_kv(imp, q, k, f"{n}.k"), _repeat_kv(imp, q, v, f"{n}.v")
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise imp.unsupported(f"key batch/heads {k.shape[:-2]} != query's {q.shape[:-2]}")
    perm = (*range(k.ndim - 2), k.ndim - 1, k.ndim - 2)
    scores = _matmul_nd(g, q, g.transpose(k, perm, name=f"{n}.k_t"), f"{n}.qk")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = g.mul(scores, scale, name=f"{n}.scale")
    if is_causal:  # torch's tril(ones(L, S)): row i attends to columns 0..i
        rows = g.iota(scores.shape, -2, dtype="i64", name=f"{n}.rows")
        cols = g.iota(scores.shape, -1, dtype="i64", name=f"{n}.cols")
        attn_mask = g.ge(rows, cols, name=f"{n}.causal")
    if attn_mask is not None and attn_mask.dtype == "i8":  # True: take part in attention
        scores = g.where(attn_mask, scores, -math.inf, name=f"{n}.mask")
    elif attn_mask is not None:  # an additive float mask
        scores = g.add(scores, attn_mask, name=f"{n}.mask")
    return _matmul_nd(g, g.softmax(scores, -1, name=f"{n}.softmax"), v, n)


def _repeat_kv(imp: RuleContext, q: Tensor, x: Tensor, n: str) -> Tensor:
    """K or V of grouped-query attention (``enable_gqa=True``: dim -3 is the heads, Hq a
    multiple of Hkv) read by every query head of its group: query head h reads K/V head
    h // (Hq / Hkv), torch's ``repeat_interleave``. Written as transformers' ``repeat_kv``
    (a size-1 group dim, broadcast, folded into the heads), which opfuse-fuse-attention
    takes as a broadcast by indexing map: no copy of K or V is made."""
    if x.ndim < 3 or q.ndim != x.ndim or x.shape[:-3] != q.shape[:-3]:
        raise imp.unsupported(
            f"enable_gqa with key/value shape {x.shape} for query shape {q.shape} "
            "(needs the same batch dims and heads at dim -3)")
    hq, hkv = q.shape[-3], x.shape[-3]
    if hkv == 0 or hq % hkv:
        raise imp.unsupported(
            f"enable_gqa with {hq} query heads over {hkv} key/value heads "
            "(query heads must be a multiple of key/value heads)")
    g, lead, (s, d) = imp.g, x.shape[:-3], x.shape[-2:]
    x = g.reshape(x, (*lead, hkv, 1, s, d), name=f"{n}.group")
    x = g.broadcast_to(x, (*lead, hkv, hq // hkv, s, d), name=f"{n}.repeat")
    return g.reshape(x, (*lead, hq, s, d), name=f"{n}.heads")
