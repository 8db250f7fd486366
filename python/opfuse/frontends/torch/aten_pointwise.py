"""ATen rules for pointwise ops: arithmetic, activations, clamps, comparisons, selection,
boolean logic, casts, and the ops that only copy.

Each becomes a builder elementwise op or a short chain of them (``abs`` is ``max(x, -x)``,
``clamp`` a ``maximum`` then a ``minimum``, ``alpha=`` a ``mul``). Tensor operands are first
cast to the dtype torch computes in (``aten_rule.promote``). Comparisons and the
logical ops give the builder's i8 booleans; ``where`` and ``masked_fill`` are
``Graph.where`` (``masked_fill(x, m, v)`` is ``where(m, v, x)``); the bitwise ops take
booleans only. ``_to_copy`` with a ``dtype=`` is ``Graph.cast``; the copies (``clone``,
``_to_copy`` without one, eval-mode ``dropout``) become nothing: builder values have no
memory format. How rules are written: ``aten_rule``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ..builder.graph import Tensor
from .aten_rule import (
    Rule,
    RuleContext,
    builder_dtype,
    operand_dtype,
    promote,
    registrar,
)

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


def _scaled(imp: RuleContext, y: Any, alpha: Any) -> Any:
    """``alpha * y`` for the ``alpha=`` of add/sub."""
    if alpha == 1:
        return y
    if isinstance(y, Tensor):
        return imp.g.mul(y, alpha, name=f"{imp.name}.alpha")
    return y * alpha


@rule("aten.add.Tensor", "aten.add.Scalar")
def _add(imp: RuleContext, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    x, y = promote(imp, x, y)
    return imp.g.add(x, _scaled(imp, y, alpha), name=imp.name)


@rule("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(imp: RuleContext, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    x, y = promote(imp, x, y)
    return imp.g.sub(x, _scaled(imp, y, alpha), name=imp.name)


@rule("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(imp: RuleContext, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    x, y = promote(imp, x, y)
    return imp.g.sub(y, _scaled(imp, x, alpha), name=imp.name)


@rule("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(imp: RuleContext, x: Any, y: Any) -> Tensor:
    return imp.g.mul(*promote(imp, x, y), name=imp.name)


@rule("aten.div.Tensor", "aten.div.Scalar")
def _div(imp: RuleContext, x: Any, y: Any) -> Tensor:
    return imp.g.div(*promote(imp, x, y), name=imp.name)


@rule("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(imp: RuleContext, x: Any, y: Any, *, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode is not None:
        raise imp.unsupported(f"rounding_mode={rounding_mode!r}")
    return imp.g.div(*promote(imp, x, y), name=imp.name)


@rule("aten.maximum.default")
def _maximum(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.maximum(*promote(imp, x, y), name=imp.name)


@rule("aten.minimum.default")
def _minimum(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.minimum(*promote(imp, x, y), name=imp.name)


@rule("aten.clamp.default", "aten.clamp_min.default")
def _clamp(imp: RuleContext, x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        raise imp.unsupported("tensor bounds")
    (x,) = promote(imp, x)
    y = x
    if min is not None:
        y = imp.g.maximum(y, min, name=imp.name if max is None else f"{imp.name}.min")
    if max is not None:
        y = imp.g.minimum(y, max, name=imp.name)
    return y


@rule("aten.clamp_max.default")
def _clamp_max(imp: RuleContext, x: Tensor, max: Any) -> Tensor:
    return _clamp(imp, x, None, max)


@rule("aten.hardtanh.default")
def _hardtanh(imp: RuleContext, x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return _clamp(imp, x, min_val, max_val)


_UNARY = {
    "aten.neg.default": "neg",
    "aten.exp.default": "exp",
    "aten.log.default": "log",
    "aten.tanh.default": "tanh",
    "aten.erf.default": "erf",
    "aten.sin.default": "sin",
    "aten.cos.default": "cos",
    "aten.sqrt.default": "sqrt",
    "aten.rsqrt.default": "rsqrt",
    "aten.relu.default": "relu",
    "aten.sigmoid.default": "sigmoid",
}


def _unary(fn: str, imp: RuleContext, x: Tensor) -> Tensor:
    (x,) = promote(imp, x)  # exp of an integer tensor is a float
    return getattr(imp.g, fn)(x, name=imp.name)


for _op, _fn in _UNARY.items():
    RULES[_op] = functools.partial(_unary, _fn)
del _op, _fn


@rule("aten.abs.default")
def _abs(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.maximum(x, imp.g.neg(x, name=f"{imp.name}.neg"), name=imp.name)


@rule("aten.reciprocal.default")
def _reciprocal(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.div(1.0, *promote(imp, x), name=imp.name)


@rule("aten.pow.Tensor_Scalar")
def _pow(imp: RuleContext, x: Tensor, exponent: Any) -> Tensor:
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise imp.unsupported(f"exponent {exponent!r}")
    return imp.g.pow(*promote(imp, x), exponent, name=imp.name)


@rule("aten.pow.Scalar")
def _scalar_pow(imp: RuleContext, base: Any, exponent: Tensor) -> Tensor:
    """``base ** exponent`` for a number raised to a tensor (Adam's ``beta ** step``): for
    ``base > 0``, ``exp(exponent · ln base)`` (within a few ulps of ``powf``)."""
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 0:
        raise imp.unsupported(f"base {base!r} (a positive number only)")
    (e,) = promote(imp, exponent)
    if e.dtype not in ("f32", "f16", "bf16"):
        e = imp.g.cast(e, "f32", name=f"{imp.name}.float")  # torch: an int power is float
    if base == 1:
        return imp.g.full(e.shape, 1.0, dtype=e.dtype, name=imp.name)
    return imp.g.exp(imp.g.mul(e, math.log(base), name=f"{imp.name}.log"), name=imp.name)


@rule("prims.fma.default")
def _fma(imp: RuleContext, a: Any, b: Any, c: Any) -> Tensor:
    """``a * b + c``, rounded twice (a multiply, then an add): within an ulp of the fused
    multiply-add. Core ATen's ``lerp`` (Adam's moment update) is written with it."""
    product = imp.g.mul(*promote(imp, a, b), name=f"{imp.name}.mul")
    return imp.g.add(*promote(imp, product, c), name=imp.name)


@rule("aten.gelu.default")
def _gelu(imp: RuleContext, x: Tensor, *, approximate: str = "none") -> Tensor:
    return imp.g.gelu(x, approximate, name=imp.name)


@rule("aten.silu.default")
def _silu(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.silu(x, name=imp.name)


@rule("aten._to_copy.default")
def _to_copy(imp: RuleContext, x: Tensor, *, dtype: Any = None, **_: Any) -> Tensor:
    # device/layout/memory format do not change values; a dtype does
    return x if dtype is None else imp.g.cast(x, builder_dtype(imp, dtype), name=imp.name)


# ----------------------------------------------------------------- comparisons, selection


def _compare(fn: str, imp: RuleContext, x: Any, y: Any) -> Tensor:
    x, y = promote(imp, x, y, dtype=operand_dtype(imp))  # int_tensor < 0.5 compares floats
    return getattr(imp.g, fn)(x, y, name=imp.name)


for _fn in ("eq", "ne", "lt", "le", "gt", "ge"):
    rule(f"aten.{_fn}.Tensor", f"aten.{_fn}.Scalar")(functools.partial(_compare, _fn))
del _fn


@rule("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(imp: RuleContext, cond: Tensor, x: Any, y: Any) -> Tensor:
    (cond,) = promote(imp, cond, dtype="i8")
    x, y = promote(imp, x, y)
    # two numbers make a tensor of the graph's f32: cast to torch's dtype if that differs
    (out,) = promote(imp, imp.g.where(cond, x, y, name=imp.name))
    return out


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(imp: RuleContext, x: Tensor, mask: Tensor, value: Any) -> Tensor:
    (value,) = promote(imp, value)
    return imp.g.where(mask, value, x, name=imp.name)


@rule("aten.logical_not.default")
def _logical_not(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.logical_not(x, name=imp.name)


@rule("aten.logical_and.default")
def _logical_and(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.logical_and(x, y, name=imp.name)


@rule("aten.logical_or.default")
def _logical_or(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.logical_or(x, y, name=imp.name)


def _booleans(imp: RuleContext, *xs: Any) -> None:
    """The bitwise ops are the logical ones on booleans; on integers they are not."""
    if any(not isinstance(x, Tensor) or x.dtype != "i8" for x in xs):
        raise imp.unsupported("bitwise ops on integers (booleans only)")


@rule("aten.bitwise_not.default")
def _bitwise_not(imp: RuleContext, x: Tensor) -> Tensor:
    _booleans(imp, x)
    return imp.g.logical_not(x, name=imp.name)


@rule("aten.bitwise_and.Tensor")
def _bitwise_and(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    _booleans(imp, x, y)
    return imp.g.logical_and(x, y, name=imp.name)


@rule("aten.bitwise_or.Tensor")
def _bitwise_or(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    _booleans(imp, x, y)
    return imp.g.logical_or(x, y, name=imp.name)


@rule(
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.contiguous.default",
)
def _identity(imp: RuleContext, x: Tensor, **_: Any) -> Tensor:
    return x  # value semantics: copies and memory formats are not ops


#: Why training-mode dropout stays eager: it draws from PyTorch's generator there, and the
#: rest of the graph compiles around it (its backward, a multiply by the saved mask, does).
_TRAINING_DROPOUT = ("training-mode dropout: PyTorch's random numbers (opfuse has no "
                     "random-number kernels yet; model.eval() turns dropout off)")


@rule("aten.dropout.default")
def _dropout(imp: RuleContext, x: Tensor, p: float, train: bool) -> Tensor:
    if train and p > 0:
        raise imp.unsupported(_TRAINING_DROPOUT)
    return x


@rule("aten.native_dropout.default")
def _native_dropout(imp: RuleContext, x: Tensor, p: float, train: bool | None) -> tuple:
    if train and p > 0:
        raise imp.unsupported(_TRAINING_DROPOUT)
    if any(u.args[1] == 1 for u in imp.node.users):
        raise imp.unsupported("the dropout mask (a bool tensor)")
    return x, None
