"""ATen rules for convolutional models: ``convolution`` (1-D and 2-D), eval-mode batch norm,
group norm, vector norms, and max/avg pooling.

* ``convolution`` is the builder's ``conv2d`` (NCHW/FCHW, stride, padding, dilation,
  groups; ``builder_conv``); a 1-D one is a 2-D one of height 1 (``x`` viewed as
  ``N x C x 1 x L``, the filter as ``F x C x 1 x K``), its result viewed back.
* ``_native_batch_norm_legit_no_training`` (``BatchNorm`` in eval mode): the running
  statistics per channel, ``(x - mean) * rsqrt(var + eps) * weight + bias``, broadcast along
  dim 1: elementwise, so it fuses into the convolution's epilogue.
* ``native_group_norm``: ``x`` viewed as ``N x G x (C/G · HW)``, normalized like a layer norm
  over the last dim (biased variance), viewed back, then the per-channel affine.
* ``linalg_vector_norm``: ``ord`` 2 (``sqrt(sum(x²))``), 1 and ±inf, over ``dim``.
* ``max_pool2d_with_indices`` and ``avg_pool2d``: the input padded (``-inf`` / 0), one
  strided slice per window offset, combined with ``maximum`` / summed and scaled: a loop
  kernel reading the input once per offset. Where the indices are read (a training
  graph's backward), each offset's flat index comes with it, selected as PyTorch selects.

How rules are written: ``aten_rule``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..builder.graph import Tensor
from .aten_rule import Rule, RuleContext, registrar

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


def _pair(v: Any, n: int) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * n if len(v) == 1 else v)]


@rule("aten.convolution.default")
def _convolution(
    imp: RuleContext,
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Tensor:
    if transposed:
        raise imp.unsupported("a transposed convolution")
    g, n = imp.g, imp.name
    if x.ndim == 3:  # 1-D: a 2-D convolution of height 1
        x4 = g.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]), name=f"{n}.x2d")
        w4 = g.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]), name=f"{n}.w2d")
        s, p, d = (_pair(v, 1) for v in (stride, padding, dilation))
        y = g.conv2d(x4, w4, bias, (1, s[0]), (0, p[0]), (1, d[0]), groups, name=f"{n}.conv2d")
        return g.reshape(y, (y.shape[0], y.shape[1], y.shape[3]), name=n)
    if x.ndim != 4:
        raise imp.unsupported(f"a {x.ndim - 2}-D convolution (1-D and 2-D only)")
    s, p, d = (_pair(v, 2) for v in (stride, padding, dilation))
    return g.conv2d(x, w, bias, s, p, d, groups, name=n)


def _channels(imp: RuleContext, v: Tensor | None, rank: int, what: str) -> Tensor | None:
    """A per-channel vector shaped to broadcast along dim 1 of a rank-``rank`` tensor."""
    if v is None:
        return None
    return imp.g.expand_dims(v, range(1, rank - 1), name=f"{imp.name}.{what}")


@rule("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(
    imp: RuleContext,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    momentum: float,
    eps: float,
) -> tuple:
    if any(u.args[1] != 0 for u in imp.node.users):
        raise imp.unsupported("the saved batch statistics (training outputs)")
    g, n, r = imp.g, imp.name, x.ndim
    mean = _channels(imp, running_mean, r, "mean")
    # rsqrt(var + eps) per element of x (recomputed, a few flops) rather than per channel:
    # in x's iteration space it joins the convolution's epilogue instead of a kernel of C
    var = g.broadcast_to(_channels(imp, running_var, r, "var"), x.shape, name=f"{n}.var")
    y = g.mul(g.sub(x, mean, name=f"{n}.sub"),
              g.rsqrt(g.add(var, eps, name=f"{n}.eps"), name=f"{n}.rstd"), name=f"{n}.norm")
    if weight is not None:
        y = g.mul(y, _channels(imp, weight, r, "w"), name=f"{n}.scale")
    if bias is not None:
        y = g.add(y, _channels(imp, bias, r, "b"), name=f"{n}.shift")
    return y, None, None


@rule("aten.native_group_norm.default")
def _group_norm(
    imp: RuleContext,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    N: int,
    C: int,
    HxW: int,
    group: int,
    eps: float,
) -> tuple:
    if any(u.args[1] != 0 for u in imp.node.users):
        raise imp.unsupported("the group statistics (training outputs)")
    g, n = imp.g, imp.name
    grouped = g.reshape(x, (N, group, (C // group) * HxW), name=f"{n}.groups")
    y = g.reshape(g.layernorm(grouped, None, None, eps, name=f"{n}.norm"), x.shape, name=f"{n}.unflat")
    if weight is not None:
        y = g.mul(y, _channels(imp, weight, x.ndim, "w"), name=f"{n}.scale")
    if bias is not None:
        y = g.add(y, _channels(imp, bias, x.ndim, "b"), name=f"{n}.shift")
    return y, None, None


@rule("aten.linalg_vector_norm.default")
def _vector_norm(
    imp: RuleContext,
    x: Tensor,
    ord: Any = 2,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: Any = None,
) -> Tensor:
    if dtype is not None:
        raise imp.unsupported(f"dtype={dtype}")
    g, n = imp.g, imp.name
    axes = None if dim is None or (isinstance(dim, (list, tuple)) and not dim) else dim
    if ord == 2:
        return g.sqrt(g.sum(g.mul(x, x, name=f"{n}.sq"), axes, keepdim, name=f"{n}.sum"), name=n)
    if ord == 1:
        a = g.maximum(x, g.neg(x, name=f"{n}.neg"), name=f"{n}.abs")
        return g.sum(a, axes, keepdim, name=n)
    if ord in (math.inf, -math.inf):
        a = g.maximum(x, g.neg(x, name=f"{n}.neg"), name=f"{n}.abs")
        if ord > 0:
            return g.max(a, axes, keepdim, name=n)
        return g.neg(g.max(g.neg(a, name=f"{n}.nabs"), axes, keepdim, name=f"{n}.max"), name=n)
    raise imp.unsupported(f"ord={ord} (2, 1 and inf only)")


def _windows(imp: RuleContext, x: Tensor, kernel: Any, stride: Any, padding: Any,
             dilation: Any, ceil_mode: bool, fill: float) -> tuple[list[Tensor], list[int]]:
    """The strided slices of ``x`` (padded with ``fill``), one per window offset, each of the
    pooled output's shape; and the output's spatial size."""
    if ceil_mode:
        raise imp.unsupported("ceil_mode=True")
    k = _pair(kernel, 2)
    s = _pair(stride, 2) if stride else k
    p, d = _pair(padding, 2), _pair(dilation, 2)
    g, n = imp.g, imp.name
    xp = g.pad(x, [(0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])], fill, name=f"{n}.pad")
    out = [(xp.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    parts = []
    for a in range(k[0]):
        for b in range(k[1]):
            parts.append(g.slice(
                xp, [0, 0, a * d[0], b * d[1]], [x.shape[0], x.shape[1], out[0], out[1]],
                [1, 1, s[0], s[1]], name=f"{n}.win{a}_{b}"))
    return parts, out


@rule("aten.max_pool2d_with_indices.default")
def _max_pool2d(imp: RuleContext, x: Tensor, kernel_size: Any, stride: Any = (),
                padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    if x.ndim != 4:
        raise imp.unsupported(f"a {x.ndim}-D input (NCHW only)")
    parts, out = _windows(imp, x, kernel_size, stride, padding, dilation, ceil_mode, -math.inf)
    if any(u.args[1] != 0 for u in imp.node.users):  # the backward reads the argmax
        return _max_pool2d_indices(imp, x, parts, out, kernel_size, stride, padding, dilation)
    y = parts[0]
    for i, part in enumerate(parts[1:]):
        y = imp.g.maximum(y, part, name=imp.name if i == len(parts) - 2 else f"{imp.name}.max{i}")
    return y, None


def _max_pool2d_indices(imp: RuleContext, x: Tensor, parts: list[Tensor], out: list[int],
                        kernel: Any, stride: Any, padding: Any, dilation: Any) -> tuple:
    """The maxima and their flat ``h * W + w`` indices into each input plane, as PyTorch's
    CPU kernel picks them: window offsets in row-major order, a later value taken only if
    it is greater (or NaN), so the first of equal maxima wins. (A window whose every valid
    value is -inf keeps its first offset, which may be padding; PyTorch's keeps its first
    valid one.)"""
    g, n = imp.g, imp.name
    k = _pair(kernel, 2)
    s = _pair(stride, 2) if stride else k
    p, d = _pair(padding, 2), _pair(dilation, 2)
    width = x.shape[3]
    shape = (x.shape[0], x.shape[1], out[0], out[1])
    rows = g.iota(shape, 2, step=s[0] * width, dtype="i64", name=f"{n}.rows")
    base = g.add(rows, g.iota(shape, 3, step=s[1], dtype="i64", name=f"{n}.cols"),
                 name=f"{n}.base")
    best, index = parts[0], g.add(base, -p[0] * width - p[1], name=f"{n}.idx0")
    for i, part in enumerate(parts[1:], start=1):
        a, b = divmod(i, k[1])
        take = g.logical_or(g.gt(part, best, name=f"{n}.gt{i}"),
                            g.ne(part, part, name=f"{n}.nan{i}"), name=f"{n}.take{i}")
        offset = (a * d[0] - p[0]) * width + (b * d[1] - p[1])
        index = g.where(take, g.add(base, offset, name=f"{n}.idx{i}"), index,
                        name=f"{n}.index{i}")
        best = g.where(take, part, best, name=f"{n}.best{i}")
    return best, index


@rule("aten.avg_pool2d.default")
def _avg_pool2d(imp: RuleContext, x: Tensor, kernel_size: Any, stride: Any = (),
                padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> Tensor:
    if x.ndim != 4:
        raise imp.unsupported(f"a {x.ndim}-D input (NCHW only)")
    if not count_include_pad and any(_pair(padding, 2)):
        raise imp.unsupported("count_include_pad=False with padding")
    parts, _ = _windows(imp, x, kernel_size, stride, padding, 1, ceil_mode, 0.0)
    y = parts[0]
    for i, part in enumerate(parts[1:]):
        y = imp.g.add(y, part, name=f"{imp.name}.add{i}")
    return imp.g.mul(y, 1.0 / (divisor_override or len(parts)), name=imp.name)
