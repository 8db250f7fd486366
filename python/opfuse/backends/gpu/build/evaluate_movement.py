"""The evaluator's data movement with bounds: ``tensor.pad``, ``tensor.insert_slice``, and
where a group's output sits on a root's result (``placement``).

Both ops pick, per element, one of two sources by a bounds test: the value inside the
padded (inserted) region, or the padding value (the destination) outside it. The test is
one unsigned compare per dim (``i - low < size``: a negative index wraps to a huge one),
the source is read at the index clamped into its bounds (``min``, also unsigned), so every
load is in bounds, and an ``arith.select`` picks. When the tested index varies across the
thread's lanes (padding along the vector dim: a convolution's input columns), each lane is
evaluated on its own, as a scalar (:func:`per_lane`), as the concat does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from mlir import ir
from mlir.dialects import arith, vector

from ....analysis import indexing
from .kernel import Unsupported, delinearize, numel, shape_of
from .lanes import Kind

if TYPE_CHECKING:
    from .evaluate import Evaluator, Index, Val


def per_lane(ev: "Evaluator", v: ir.Value, idx: "Index", what: str) -> "Val":
    """The value of ``v`` at ``idx`` lane by lane: each vector dim replaced by a new index
    variable holding the dim's value in that lane (uniform), the lanes' scalars joined
    into one vector."""
    from .evaluate import Val

    kb = ev.kb
    n = len(kb.dims)
    elems = []
    for lane in range(ev.lanes):
        subst = [ir.AffineDimExpr.get(i, ev.ctx) for i in range(n)]
        for d in ev.vdim:
            if d < n:
                subst[d] = kb.add_dim(kb.apply(subst[d] + lane))
        pmap = ir.AffineMap.get(len(kb.dims), 0, subst, ev.ctx)
        lane_idx = tuple(e.compose(pmap).maybe_downcast() for e in idx)
        val = ev.value(v, lane_idx)
        if not val.uniform:
            raise Unsupported(f"a lane of a {what} that varies across lanes")
        elems.append(val.ssa)
    with kb.emitting():
        return Val(vector.from_elements(ev._vt(elems[0].type), elems), False)


def _static(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _bounded(ev: "Evaluator", rel: Sequence[ir.AffineExpr], sizes: Sequence[int],
             tested: Sequence[int]):
    """(condition, clamped index): ``rel[k]`` in ``[0, sizes[k])`` for every dim in
    ``tested`` (None: no test), and ``rel`` with those dims clamped into bounds."""
    kb = ev.kb
    cond, clamped = None, list(rel)
    for k in tested:
        r = kb.apply(rel[k])
        cond = kb.and_(cond, kb.cmp_lt(r, kb.index(sizes[k])))
        clamped[k] = kb.add_dim(kb.min_index(r, kb.index(sizes[k] - 1)))
    return cond, clamped


def _select(ev: "Evaluator", cond, inside: "Val", outside: "Val") -> "Val":
    from .evaluate import Val

    if cond is None:
        return inside
    kb = ev.kb
    if inside.uniform and outside.uniform:
        with kb.emitting():
            return Val(arith.select(cond, inside.ssa, outside.ssa), True)
    a, b = ev.as_vector(inside), ev.as_vector(outside)
    with kb.emitting():
        return Val(arith.select(cond, a, b), False)


def _varies(ev: "Evaluator", exprs: Sequence[ir.AffineExpr]) -> bool:
    return ev.lanes > 1 and any(ev.lanes_of(e).kind != Kind.INVARIANT for e in exprs)


def pad(ev: "Evaluator", op: ir.Operation, idx: "Index") -> "Val":
    """``tensor.pad``: the source at ``idx - low`` inside it, else the padding value."""
    from .evaluate import Val

    if len(op.operands) != 1:
        raise Unsupported("tensor.pad with dynamic padding")
    low, high = _static(op, "static_low"), _static(op, "static_high")
    src = op.operands[0]
    shape = shape_of(src.type)
    tested = [k for k in range(len(shape)) if low[k] or high[k]]
    rel = [e - low[k] if low[k] else e for k, e in enumerate(idx)]
    if _varies(ev, [rel[k] for k in tested]):
        return per_lane(ev, op.results[0], idx, "tensor.pad")
    block = op.regions[0].blocks[0]
    value = list(block.operations)[-1].operands[0]  # tensor.yield's
    owner = value.owner
    if isinstance(owner, ir.Block) and owner == block:
        raise Unsupported("a tensor.pad whose value depends on the position")
    if not isinstance(owner, ir.Block) and owner.operation.parent.operation == op:
        if owner.operation.name != "arith.constant":
            raise Unsupported("a tensor.pad whose value is computed in its body")
        padding = Val(ev.kb.const_attr(owner.operation.attributes["value"]), True)
    else:  # a constant or a scalar argument of the function
        padding = ev.scalar(value)
    cond, clamped = _bounded(ev, rel, shape, tested)
    return _select(ev, cond, ev.value(src, clamped), padding)


def insert_slice(ev: "Evaluator", op: ir.Operation, idx: "Index") -> "Val":
    """``tensor.insert_slice``: the source inside the slice, the destination elsewhere."""
    if len(op.operands) != 2:
        raise Unsupported("tensor.insert_slice with dynamic offsets or sizes")
    offs, sizes = _static(op, "static_offsets"), _static(op, "static_sizes")
    if any(s != 1 for s in _static(op, "static_strides")):
        raise Unsupported("tensor.insert_slice with strides")
    src, dest = op.operands[0], op.operands[1]
    dest_shape = shape_of(dest.type)
    tested = [k for k in range(len(dest_shape)) if offs[k] or sizes[k] != dest_shape[k]]
    rel = [e - offs[k] if offs[k] else e for k, e in enumerate(idx)]
    if _varies(ev, [rel[k] for k in tested]):
        return per_lane(ev, op.results[0], idx, "tensor.insert_slice")
    cond, clamped = _bounded(ev, rel, sizes, tested)
    kept = indexing.kept_dims(sizes, shape_of(src.type))  # a rank-reducing insert drops unit dims
    src_idx = tuple(clamped[k] for k in range(len(dest_shape)) if kept[k] is not None)
    return _select(ev, cond, ev.value(src, src_idx), ev.value(dest, idx))


def pull(v: ir.Value, target: ir.Value, idx: "Index", n: int, ctx: ir.Context, *,
         unit_dims_at_zero: bool = True) -> "Index | None":
    """``target``'s index read when ``v`` is read at ``idx`` (expressions over ``n`` dims),
    through pointwise generics and reshapes; the first operand path that reaches it.
    ``unit_dims_at_zero``: write the index of every size-1 dim on the way as 0 (its only
    value), so that reshapes adding or dropping unit dims give plain dims."""
    from .evaluate import (
        canonical_index,
        compose,
        iterators_of,
        loop_point,
        maps_of,
        n_inputs,
        op_of,
    )

    if unit_dims_at_zero:
        idx = canonical_index(v, idx, ctx)
    if v == target:
        return tuple(idx)
    op = op_of(v)
    if op is None:
        return None
    again = dict(unit_dims_at_zero=unit_dims_at_zero)
    if op.name == "tensor.expand_shape":
        return pull(op.operands[0], target, indexing.expand_source(op, idx), n, ctx, **again)
    if op.name == "tensor.collapse_shape":
        return pull(op.operands[0], target, indexing.collapse_source(op, idx), n, ctx, **again)
    if op.name != "linalg.generic" or "reduction" in iterators_of(op):
        return None
    maps = maps_of(op)
    n_in = n_inputs(op)
    try:
        point = loop_point(maps[n_in + ir.OpResult(v).result_number], idx)
    except Unsupported:
        return None
    for j in range(n_in):
        operand = op.operands[j]
        if isinstance(operand.type, ir.ShapedType):
            found = pull(operand, target, compose(maps[j], point, n, ctx), n, ctx, **again)
            if found is not None:
                return found
    return None


def placement(ev: "Evaluator", v: ir.Value, target: ir.Value) -> list[list[int]] | None:
    """Where output ``v`` sits on ``target`` (a root's result), when ``v`` is ``target`` seen
    through elementwise ops and reshapes: for each dim of ``v``, the dims of ``target``
    whose row-major position it is (``[1, 2]``: torch-mlir's grouped convolution
    collapses G x F/G into F; ``[]``: a unit dim; one dim: a permutation); None otherwise.
    A guess cannot produce a wrong kernel: the emitter evaluates ``v`` at the index this
    gives, and misses the root's preset values (Unsupported) if it is not where ``v``
    reads them."""
    shape_v, shape_t = shape_of(v.type), shape_of(target.type)
    q = [ir.AffineDimExpr.get(i, ev.ctx) for i in range(len(shape_v))]
    pulled = pull(v, target, tuple(q), len(q), ev.ctx)
    if pulled is None:
        return None
    groups: list[list[int]] = [[] for _ in shape_v]
    for j, e in enumerate(pulled):
        if shape_t[j] == 1:
            continue
        deps = [i for i in range(len(q)) if _depends(e, i, len(q), ev.ctx)]
        if len(deps) != 1:
            return None
        groups[deps[0]].append(j)
    for i, js in enumerate(groups):
        sizes = [shape_t[j] for j in js]
        if numel(sizes) != shape_v[i]:
            return None
        if js and tuple(delinearize(q[i], sizes)) != tuple(pulled[j] for j in js):
            return None
    return groups


def _depends(e: ir.AffineExpr, dim: int, n: int, ctx) -> bool:
    subst = [ir.AffineDimExpr.get(k, ctx) for k in range(n)]
    subst[dim] = ir.AffineConstantExpr.get(0, ctx)
    return e.compose(ir.AffineMap.get(n, 0, subst, ctx)) != e
