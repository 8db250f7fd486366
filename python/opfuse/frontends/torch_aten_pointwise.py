"""ATen rules for pointwise ops: arithmetic, activations, clamps, and the ops that only copy.

Each becomes a builder elementwise op or a short chain of them (``abs`` is ``max(x, -x)``,
``clamp`` a ``maximum`` then a ``minimum``, ``alpha=`` a ``mul``). The copies (``clone``,
``_to_copy`` without a cast, eval-mode ``dropout``) become nothing: builder values have no
memory format. How rules are written: ``torch_aten_rule``.
"""

from __future__ import annotations

import functools
from typing import Any

from .builder import Tensor
from .torch_aten_rule import Rule, RuleContext, const_dtype, registrar

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
    return imp.g.add(x, _scaled(imp, y, alpha), name=imp.name)


@rule("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(imp: RuleContext, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    return imp.g.sub(x, _scaled(imp, y, alpha), name=imp.name)


@rule("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(imp: RuleContext, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    return imp.g.sub(y, _scaled(imp, x, alpha), name=imp.name)


@rule("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(imp: RuleContext, x: Any, y: Any) -> Tensor:
    return imp.g.mul(x, y, name=imp.name)


@rule("aten.div.Tensor", "aten.div.Scalar")
def _div(imp: RuleContext, x: Any, y: Any) -> Tensor:
    return imp.g.div(x, y, name=imp.name)


@rule("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(imp: RuleContext, x: Any, y: Any, *, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode is not None:
        raise imp.unsupported(f"rounding_mode={rounding_mode!r}")
    return imp.g.div(x, y, name=imp.name)


@rule("aten.maximum.default")
def _maximum(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.maximum(x, y, name=imp.name)


@rule("aten.minimum.default")
def _minimum(imp: RuleContext, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.minimum(x, y, name=imp.name)


@rule("aten.clamp.default", "aten.clamp_min.default")
def _clamp(imp: RuleContext, x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        raise imp.unsupported("tensor bounds")
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
    "aten.sqrt.default": "sqrt",
    "aten.rsqrt.default": "rsqrt",
    "aten.relu.default": "relu",
    "aten.sigmoid.default": "sigmoid",
}


def _unary(fn: str, imp: RuleContext, x: Tensor) -> Tensor:
    return getattr(imp.g, fn)(x, name=imp.name)


for _op, _fn in _UNARY.items():
    RULES[_op] = functools.partial(_unary, _fn)
del _op, _fn


@rule("aten.abs.default")
def _abs(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.maximum(x, imp.g.neg(x, name=f"{imp.name}.neg"), name=imp.name)


@rule("aten.reciprocal.default")
def _reciprocal(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.div(1.0, x, name=imp.name)


@rule("aten.pow.Tensor_Scalar")
def _pow(imp: RuleContext, x: Tensor, exponent: Any) -> Tensor:
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise imp.unsupported(f"exponent {exponent!r}")
    return imp.g.pow(x, exponent, name=imp.name)


@rule("aten.gelu.default")
def _gelu(imp: RuleContext, x: Tensor, *, approximate: str = "none") -> Tensor:
    return imp.g.gelu(x, approximate, name=imp.name)


@rule("aten.silu.default")
def _silu(imp: RuleContext, x: Tensor) -> Tensor:
    return imp.g.silu(x, name=imp.name)


@rule("aten._to_copy.default")
def _to_copy(imp: RuleContext, x: Tensor, *, dtype: Any = None, **_: Any) -> Tensor:
    const_dtype(imp, x, dtype)  # device/layout/memory format do not change values
    return x


@rule(
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.contiguous.default",
)
def _identity(imp: RuleContext, x: Tensor, **_: Any) -> Tensor:
    return x  # value semantics: copies and memory formats are not ops


@rule("aten.dropout.default")
def _dropout(imp: RuleContext, x: Tensor, p: float, train: bool) -> Tensor:
    if train and p > 0:
        raise imp.unsupported("training-mode dropout (call model.eval())")
    return x


@rule("aten.native_dropout.default")
def _native_dropout(imp: RuleContext, x: Tensor, p: float, train: bool | None) -> tuple:
    if train and p > 0:
        raise imp.unsupported("training-mode dropout (call model.eval())")
    if any(u.args[1] == 1 for u in imp.node.users):
        raise imp.unsupported("the dropout mask (a bool tensor)")
    return x, None
