"""ATen rules for reductions and the ops built from them: softmax, variance, layer/RMS norm.

The builder's own composites (``softmax``, ``layernorm``, ``rms_norm``) are used where ATen
keeps the op whole, so an imported norm fuses like a hand-written one; ``var``,
``log_softmax`` and the statistics ``native_layer_norm`` returns for training are spelled
out in sums and means. How rules are written: ``aten_rule``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

from ..builder.graph import Tensor
from .aten_rule import Rule, RuleContext, promote, registrar, with_dtype

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


def _floats(imp: RuleContext, x: Tensor) -> Tensor:
    """Reductions are on floats (a sum of booleans is a count: ``_count``)."""
    if x.dtype not in ("f32", "f16", "bf16"):
        raise imp.unsupported(f"a reduction of {x.dtype} values (booleans or integers)")
    return x


def _dims(dim: Any) -> Any:
    """ATen's reduction dims (None or [] mean all) as the builder's ``axis``."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


def _sum_or_mean(
    fn: str,
    imp: RuleContext,
    x: Tensor,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: Any = None,
) -> Tensor:
    if fn == "sum" and dtype is None and x.dtype == "i8":
        return _count(imp, x, dim, keepdim)
    x = with_dtype(imp, _floats(imp, x) if dtype is None else x, dtype)
    return getattr(imp.g, fn)(x, _dims(dim), keepdim, name=imp.name)


#: The most booleans a count sums: below 2**24 every partial sum is exact in float32.
COUNT_LIMIT = 1 << 24


def _count(imp: RuleContext, x: Tensor, dim: Any, keepdim: bool) -> Tensor:
    """A sum of booleans (torch: an int64 count), summed as float32 and converted back:
    exact, since no count can exceed the number of booleans summed, which is checked to be
    at most :data:`COUNT_LIMIT`."""
    axes = _dims(dim)
    reduced = range(x.ndim) if axes is None else (
        [axes] if isinstance(axes, int) else list(axes))
    n = math.prod(x.shape[a] for a in reduced) if x.ndim else 1
    if n > COUNT_LIMIT:
        raise imp.unsupported(f"a count of {n} booleans (at most {COUNT_LIMIT} are exact)")
    g, name = imp.g, imp.name
    total = g.sum(g.cast(x, "f32", name=f"{name}.float"), axes, keepdim, name=f"{name}.sum")
    return g.cast(total, "i64", name=name)


# sum and mean take the same arguments and differ only in the builder op they become.
rule("aten.sum.dim_IntList", "aten.sum.default")(functools.partial(_sum_or_mean, "sum"))
rule("aten.mean.dim", "aten.mean.default")(functools.partial(_sum_or_mean, "mean"))


@rule("aten.amax.default")
def _amax(imp: RuleContext, x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return imp.g.max(_floats(imp, x), _dims(dim), keepdim, name=imp.name)


@rule("aten.var.correction")
def _var(
    imp: RuleContext, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> Tensor:
    g, n = imp.g, imp.name
    axes = g._axes(x, _dims(dim))
    count = math.prod(x.shape[a] for a in axes)
    ddof = 1 if correction is None else correction
    if count - ddof <= 0:
        raise imp.unsupported(f"correction={ddof} with {count} elements")
    d = g.sub(x, g.mean(x, axes, keepdims=True, name=f"{n}.mean"), name=f"{n}.sub")
    s = g.sum(g.mul(d, d, name=f"{n}.sq"), axes, keepdim, name=f"{n}.sum")
    return g.mul(s, 1.0 / (count - ddof), name=n)


def _to_float(imp: RuleContext, x: Tensor, half_to_float: bool) -> Tensor:
    """``x`` in f32 if ``half_to_float`` (softmax of a half tensor computed and returned in f32)."""
    return imp.g.cast(x, "f32", name=f"{imp.name}.cast") if half_to_float else x


@rule("aten._softmax.default")
def _softmax(imp: RuleContext, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return imp.g.softmax(_to_float(imp, x, half_to_float), dim, name=imp.name)


@rule("aten._safe_softmax.default", "aten.softmax.int")
def _safe_softmax(imp: RuleContext, x: Tensor, dim: int, dtype: Any = None) -> Tensor:
    # _safe_softmax gives 0 instead of NaN on a row that is all -inf (a fully masked
    # attention row); causal masks never mask a whole row, and softmax is what G5/G6 use.
    # (A mask that does gives a NaN row here.)
    return imp.g.softmax(with_dtype(imp, x, dtype), dim, name=imp.name)


@rule("aten._log_softmax.default")
def _log_softmax(imp: RuleContext, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    x = _to_float(imp, x, half_to_float)
    g, n = imp.g, imp.name
    s = g.sub(x, g.max(x, dim, keepdims=True, name=f"{n}.max"), name=f"{n}.sub")
    total = g.sum(g.exp(s, name=f"{n}.exp"), dim, keepdims=True, name=f"{n}.sum")
    return g.sub(s, g.log(total, name=f"{n}.log"), name=n)


# ----------------------------------------------------------------- normalizations


def _fold_trailing(imp: RuleContext, x: Tensor | None, k: int, what: str) -> Tensor | None:
    """``x`` with its last ``k`` dims folded into one (norms over several dims)."""
    if x is None or k == 1:
        return x
    return imp.g.reshape(x, (*x.shape[:-k], -1), name=f"{imp.name}.{what}")


@rule("aten.native_layer_norm.default")
def _native_layer_norm(
    imp: RuleContext,
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> tuple:
    g, n, k = imp.g, imp.name, len(normalized_shape)
    xf = _fold_trailing(imp, x, k, "flat")
    wf, bf = _fold_trailing(imp, weight, k, "wflat"), _fold_trailing(imp, bias, k, "bflat")
    if not any(u.args[1] in (1, 2) for u in imp.node.users):
        y = g.layernorm(xf, wf, bf, eps, name=n)
        return (y if k == 1 else g.reshape(y, x.shape, name=f"{n}.unflat")), None, None
    # a training graph also reads the mean and 1/std: layernorm's math spelled out, so
    # that the normalization and the statistics share one mean and one variance (one row
    # kernel), rather than a second pair of reductions beside the composite's
    stats = (*x.shape[:-k], *[1] * k)
    mean = g.mean(xf, -1, keepdims=True, name=f"{n}.mean")
    d = g.sub(xf, mean, name=f"{n}.d")
    var = g.mean(g.mul(d, d, name=f"{n}.sq"), -1, keepdims=True, name=f"{n}.var")
    rstd = g.rsqrt(g.add(var, eps, name=f"{n}.eps"), name=f"{n}.rstd")
    y = g.mul(d, rstd, name=f"{n}.norm")
    y = y if wf is None else g.mul(y, wf, name=f"{n}.scale")
    y = y if bf is None else g.add(y, bf, name=f"{n}.shift")
    if k == 1:  # the statistics' keepdims shape is the one ATen returns: kept lazy, so a
        return y, mean, rstd  # graph output returns them without a copy (importer.py)
    return (
        g.reshape(y, x.shape, name=f"{n}.unflat"),
        g.reshape(mean, stats, name=f"{n}.mean_out"),
        g.reshape(rstd, stats, name=f"{n}.rstd_out"),
    )


@rule("aten.rms_norm.default")
def _rms_norm(
    imp: RuleContext,
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    import torch

    if eps is None:  # torch's default: the dtype's machine epsilon
        eps = torch.finfo(
            {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[x.dtype]
        ).eps
    k = len(normalized_shape)
    xf = _fold_trailing(imp, x, k, "flat")
    y = imp.g.rms_norm(xf, _fold_trailing(imp, weight, k, "wflat"), eps, name=imp.name)
    return y if k == 1 else imp.g.reshape(y, x.shape, name=f"{imp.name}.unflat")


@rule("aten.cumsum.default")
def _cumsum(imp: RuleContext, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    # integers and booleans sum in int64 unless dtype= says otherwise: torch's result dtype
    (x,) = promote(imp, x)
    return imp.g.cumsum(x, dim, name=imp.name)
