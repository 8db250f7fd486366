"""Index algebra on affine expressions: row-major (de)linearization, composing indexing
maps with a point, and where a read of a view (reshape, slice) lands in its source.

Both the fusion analysis (which asks "which element of S does this op read?") and the
code generators (which turn the same question into address arithmetic) use these, so the
two always agree on what a view means.
"""

from __future__ import annotations

from typing import Sequence

from mlir import ir

Index = tuple  # tuple[ir.AffineExpr, ...]


def maps_of(op: ir.Operation) -> list[ir.AffineMap]:
    """The indexing maps of a ``linalg.generic``."""
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def iterators_of(op: ir.Operation) -> list[str]:
    """The iterator types of a ``linalg.generic`` (``parallel``, ``reduction``)."""
    return [
        str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])
    ]


def n_inputs(op: ir.Operation) -> int:
    return len(op.operands) - len(op.results)


def op_of(v: ir.Value) -> ir.Operation | None:
    """The defining op of ``v`` (None for a block argument)."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def delinearize(flat: ir.AffineExpr, shape: Sequence[int]) -> list[ir.AffineExpr]:
    """Row-major indices of the flat position ``flat`` in ``shape`` (affine floordiv/mod).

    ``flat`` is in ``[0, numel(shape))``, so a dim needs no ``mod`` when every dim before it
    has size 1 (``[1, 8]`` gives ``(0, flat)``), and a size-1 dim's index is 0.
    """
    exprs = []
    stride = numel(shape)
    leading = 1  # elements of the dims before this one
    for d in shape:
        stride //= d
        e = flat if stride == 1 else ir.AffineExpr.get_floor_div(flat, stride)
        if d == 1:
            e = ir.AffineConstantExpr.get(0, flat.context)
        elif leading > 1:
            e = ir.AffineExpr.get_mod(e, d)
        leading *= d
        exprs.append(e)
    return exprs


def linearize(exprs: Sequence[ir.AffineExpr], shape: Sequence[int]) -> ir.AffineExpr:
    """The flat row-major position of index ``exprs`` in ``shape``."""
    total = None
    stride = 1
    for e, d in reversed(list(zip(exprs, shape))):
        term = e * stride if stride != 1 else e
        total = term if total is None else total + term
        stride *= d
    return total if total is not None else ir.AffineConstantExpr.get(0)


def compose(amap: ir.AffineMap, point: Sequence[ir.AffineExpr], n_dims: int, ctx) -> Index:
    """``amap`` applied to ``point`` (expressions over ``n_dims`` dims)."""
    pmap = ir.AffineMap.get(n_dims, 0, list(point), ctx)
    return tuple(r.compose(pmap).maybe_downcast() for r in amap.results)


def point_of(out_map: ir.AffineMap, idx: Index) -> list[ir.AffineExpr] | None:
    """The loop point of a generic whose result (indexed by ``out_map``, a permutation)
    is read at ``idx``; None for any other output map."""
    point: list = [None] * out_map.n_dims
    for t, res in enumerate(out_map.results):
        res = res.maybe_downcast()
        if not isinstance(res, ir.AffineDimExpr):
            return None
        point[res.position] = idx[t]
    if any(p is None for p in point):
        return None
    return point


def shape_of(t: ir.Type) -> tuple[int, ...]:
    return tuple(ir.ShapedType(t).shape)


def reassociation(op: ir.Operation) -> list[list[int]]:
    return [
        [ir.IntegerAttr(i).value for i in ir.ArrayAttr(g)]
        for g in ir.ArrayAttr(op.attributes["reassociation"])
    ]


def expand_source(op: ir.Operation, idx: Index) -> Index:
    """Where a read of ``tensor.expand_shape`` at ``idx`` lands in its source."""
    shape = shape_of(op.results[0].type)
    return tuple(
        linearize([idx[i] for i in group], [shape[i] for i in group])
        for group in reassociation(op)
    )


def collapse_source(op: ir.Operation, idx: Index) -> Index:
    """Where a read of ``tensor.collapse_shape`` at ``idx`` lands in its source."""
    src_shape = shape_of(op.operands[0].type)
    if not idx:  # to a 0-d tensor: every source dim has size 1
        return tuple(ir.AffineConstantExpr.get(0, op.context) for _ in src_shape)
    out = []
    for t, group in enumerate(reassociation(op)):
        out.extend(delinearize(idx[t], [src_shape[i] for i in group]))
    return tuple(out)


def reshape_source(op: ir.Operation, idx: Index) -> Index | None:
    """A general reshape (same elements, row-major), through the flat position; None when
    either shape is dynamic."""
    src, out = op.operands[0].type, op.results[0].type
    if not (ir.ShapedType(src).has_static_shape and ir.ShapedType(out).has_static_shape):
        return None
    flat = linearize(idx, shape_of(out))
    return tuple(delinearize(flat, shape_of(src)))


def slice_source(op: ir.Operation, idx: Index) -> Index:
    """Where a read of a static ``tensor.extract_slice`` at ``idx`` lands in its source.

    Raises:
        ValueError: dynamic offsets or sizes, or a rank reduction that cannot be matched.
    """
    if len(op.operands) > 1:
        raise ValueError("tensor.extract_slice with dynamic offsets or sizes")
    offs = list(ir.DenseI64ArrayAttr(op.attributes["static_offsets"]))
    strides = list(ir.DenseI64ArrayAttr(op.attributes["static_strides"]))
    sizes = list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))
    kept = kept_dims(sizes, shape_of(op.results[0].type))
    out = []
    for d, (o, st) in enumerate(zip(offs, strides)):
        if kept[d] is None:  # a dropped unit dim (torch's select): its offset
            out.append(ir.AffineConstantExpr.get(o, op.context))
            continue
        e = idx[kept[d]]
        e = e * st if st != 1 else e
        out.append(e + o if o else e)
    return tuple(out)


def kept_dims(sizes: Sequence[int], result: Sequence[int]) -> list[int | None]:
    """For each source dim of an extract_slice, the result dim it becomes, or None when
    a rank-reducing slice drops it (a unit size). Greedy from the left, as MLIR matches
    a rank-reduced result type against the slice sizes.

    Raises:
        ValueError: the sizes cannot produce the result shape.
    """
    kept: list[int | None] = []
    j = 0
    for d, size in enumerate(sizes):
        must_keep = len(result) - j >= len(sizes) - d  # as many dims left as result dims
        if j < len(result) and (size == result[j] and (size != 1 or must_keep)):
            kept.append(j)
            j += 1
        elif size == 1:
            kept.append(None)
        else:
            raise ValueError(f"tensor.extract_slice sizes {list(sizes)} -> {list(result)}")
    if j != len(result):
        raise ValueError(f"tensor.extract_slice sizes {list(sizes)} -> {list(result)}")
    return kept


def dims_of(e: ir.AffineExpr) -> set[int]:
    """Positions of the dims ``e`` involves."""
    e = e.maybe_downcast()
    if isinstance(e, ir.AffineDimExpr):
        return {e.position}
    if isinstance(e, ir.AffineBinaryExpr):
        return dims_of(e.lhs) | dims_of(e.rhs)
    return set()


def substitute(exprs: Sequence[ir.AffineExpr], subst: Sequence[ir.AffineExpr], n_dims: int,
               ctx) -> Index:
    """``exprs`` (over ``len(subst)`` dims) with dim ``i`` replaced by ``subst[i]``
    (expressions over ``n_dims`` dims)."""
    pmap = ir.AffineMap.get(n_dims, 0, list(subst), ctx)
    return tuple(e.compose(pmap).maybe_downcast() for e in exprs)
