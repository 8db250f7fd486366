"""ATen rules for the ops that read a tensor at computed positions: ``embedding``, ``gather``,
``index.Tensor`` and ``index_select``, each the builder's ``take`` (``builder_gather``: a
generic reading through ``tensor.extract``, its indices wrapped if negative and clamped to
the tensor, so an out-of-range index reads an edge element where torch raises).

``embedding``'s ``padding_idx``, ``scale_grad_by_freq`` and ``sparse`` change only the
gradient; the gradient, ``embedding_dense_backward``, is the builder's ``scatter_add``. A boolean index tensor (``x[mask]``) has a data-dependent shape: not supported
(export makes such a shape dynamic anyway). How rules are written: ``aten_rule``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..builder.graph import Tensor
from .aten_rule import Rule, RuleContext, registrar

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


def _integers(imp: RuleContext, *indices: Any) -> None:
    for i in indices:
        if isinstance(i, Tensor) and i.dtype not in ("i64", "i32"):
            raise imp.unsupported(f"a {i.dtype} index tensor (integer indices only)")


@rule("aten.embedding.default")
def _embedding(imp: RuleContext, weight: Tensor, indices: Tensor, *_: Any, **__: Any) -> Tensor:
    _integers(imp, indices)
    return imp.g.embedding(weight, indices, name=imp.name)


@rule("aten.embedding_dense_backward.default")
def _embedding_dense_backward(imp: RuleContext, grad: Tensor, indices: Tensor, num_weights: int,
                              padding_idx: int, scale_grad_by_freq: bool) -> Tensor:
    """The embedding's weight gradient: the output gradients summed into the rows their
    token ids pick (``Graph.scatter_add``), ``padding_idx``'s row left zero."""
    _integers(imp, indices)
    if scale_grad_by_freq:
        raise imp.unsupported("scale_grad_by_freq (the decomposition table keeps it)")
    skip = padding_idx if padding_idx >= 0 else None
    return imp.g.scatter_add(grad, indices, num_weights, skip=skip, name=imp.name)


@rule("aten.gather.default")
def _gather(imp: RuleContext, x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False
            ) -> Tensor:
    _integers(imp, index)
    return imp.g.gather(x, dim, index, name=imp.name)


@rule("aten.index_select.default")
def _index_select(imp: RuleContext, x: Tensor, dim: int, index: Tensor) -> Tensor:
    _integers(imp, index)
    return imp.g.index_select(x, dim, index, name=imp.name)


@rule("aten.index.Tensor")
def _index(imp: RuleContext, x: Tensor, indices: Sequence[Tensor | None]) -> Tensor:
    _integers(imp, *indices)
    return imp.g.index(x, indices, name=imp.name)
