"""The evaluator's values and index helpers (see :mod:`.evaluate`).

:class:`Val` (a scalar or a vector SSA value in the kernel) and :class:`Leaf` (a tensor
held by a kernel parameter), and the index arithmetic :class:`~.evaluate.Evaluator` uses:
a generic's loop sizes and loop point, canonical (memo) indices, a concat's parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mlir import ir

from ....analysis import indexing
from ....analysis.indexing import Index, maps_of
from .kernel import Unsupported, shape_of


@dataclass(frozen=True)
class Val:
    """A value in the kernel: a scalar (``uniform``: the same for every lane) or a vector
    with one element per lane of the thread's vector dim."""

    ssa: ir.Value
    uniform: bool


@dataclass(frozen=True)
class Leaf:
    """A tensor that lives in a kernel parameter: the (flat) memref and the shape it is
    read with (a reshape of a parameter is the same bytes with another shape)."""

    mem: ir.Value
    shape: tuple[int, ...]
    element_type: ir.Type


def result_number(v: ir.Value) -> int:
    return ir.OpResult(v).result_number


def generic_domain(op: ir.Operation) -> list[int]:
    """Loop sizes of a ``linalg.generic`` from its operands' static shapes."""
    maps = maps_of(op)
    dom: list[int | None] = [None] * maps[0].n_dims
    for value, amap in zip(op.operands, maps):
        if not isinstance(value.type, ir.ShapedType):
            continue
        for size, res in zip(shape_of(value.type), amap.results):
            res = res.maybe_downcast()
            if isinstance(res, ir.AffineDimExpr):
                dom[res.position] = size
    if any(d is None for d in dom):
        raise Unsupported("a loop of a linalg.generic has no static size")
    return dom  # type: ignore[return-value]


def _computed_from(op: ir.Operation) -> set[ir.Value]:
    """Every value ``op``'s operands are computed from, through the ops that define them."""
    seen: set[ir.Value] = set()
    stack = list(op.operands)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        owner = v.owner
        if not isinstance(owner, ir.Block):
            stack.extend((owner.operation if hasattr(owner, "operation") else owner).operands)
    return seen


def canonical_index(v: ir.Value, idx: Sequence[ir.AffineExpr], ctx: ir.Context) -> Index:
    """``idx`` with ``0`` at every size-1 dim of ``v`` (its only valid index), so that a
    value reached through reshapes that add or drop unit dims (``tensor<8x16xf32>``
    collapsed from ``1x8x16``) has one memo key however its index was written."""
    shape = shape_of(v.type) if isinstance(v.type, ir.ShapedType) else ()
    if 1 not in shape:
        return tuple(idx)
    zero = ir.AffineConstantExpr.get(0, ctx)
    return tuple(zero if d == 1 else e for e, d in zip(idx, shape))


def loop_point(out_map: ir.AffineMap, idx: Index) -> list[ir.AffineExpr]:
    """The loop point of a generic whose result (indexed by ``out_map``, a permutation)
    is read at ``idx``. Raises Unsupported for any other output map."""
    point = indexing.point_of(out_map, idx)
    if point is None:
        raise Unsupported("an output indexing map that is not a permutation of every loop")
    return point


def _concat_parts(op: ir.Operation) -> tuple[int, list[int]]:
    """The axis of a ``tensor.concat`` and where each input starts along it."""
    axis = ir.IntegerAttr(op.attributes["dim"]).value
    starts, at = [], 0
    for v in op.operands:
        t = ir.ShapedType(v.type)
        if not t.has_static_shape:
            raise Unsupported("tensor.concat with a dynamic shape")
        starts.append(at)
        at += t.shape[axis]
    return axis, starts


def _shifted(idx: Index, axis: int, start: int) -> Index:
    """``idx`` moved back by ``start`` along ``axis``."""
    return tuple(e - start if k == axis and start else e for k, e in enumerate(idx))
