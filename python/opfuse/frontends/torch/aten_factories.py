"""ATen rules for the ops that make a tensor from nothing but numbers: ``arange``, ``full``,
``full_like`` and ``scalar_tensor``. The decompositions of ``tril``/``triu``, ``masked_fill``,
``ones_like``, ``zeros`` and ``nn.Transformer.generate_square_subsequent_mask`` produce them.

``arange`` is ``Graph.iota``; the others are ``Graph.full``, which the elementwise op that
reads one usually folds into a constant of its body. The dtype is the one torch gives the
node (``arange(8)`` is int64: the builder's i64); device, layout and pin_memory do not
change values. How rules are written: ``aten_rule``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..builder.graph import Tensor
from .aten_rule import Rule, RuleContext, registrar, result_dtype

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


@rule("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(imp: RuleContext, *bounds: Any, **_: Any) -> Tensor:
    # arange(end), arange(start, end), arange(start, end, step)
    start = bounds[0] if len(bounds) > 1 else 0
    step = bounds[2] if len(bounds) > 2 else 1
    (n,) = imp.node.meta["val"].shape  # torch's length: ceil((end - start) / step)
    dtype = result_dtype(imp)
    return imp.g.iota((int(n),), 0, start=start, step=step, dtype=dtype, name=imp.name)


def _full(imp: RuleContext, shape: Sequence[int], value: Any) -> Tensor:
    dtype = result_dtype(imp)
    if isinstance(value, bool) and dtype != "i8":
        value = int(value)  # full((2,), True, dtype=torch.float32) holds 1.0
    return imp.g.full(shape, value, dtype=dtype, name=imp.name)


@rule("aten.full.default")
def _full_default(imp: RuleContext, size: Sequence[int], fill_value: Any, **_: Any) -> Tensor:
    return _full(imp, size, fill_value)


@rule("aten.full_like.default")
def _full_like(imp: RuleContext, x: Tensor, fill_value: Any, **_: Any) -> Tensor:
    return _full(imp, x.shape, fill_value)


@rule("aten.scalar_tensor.default")
def _scalar_tensor(imp: RuleContext, value: Any, **_: Any) -> Tensor:
    return _full(imp, (), value)
