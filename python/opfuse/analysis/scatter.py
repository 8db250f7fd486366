"""Recognizing a scatter-add (rows summed by an index: an embedding's gradient) in a
``linalg.generic``.

linalg has no scatter on tensors that the upstream passes lower, so a sum into rows picked
by an index tensor is written as a reduction over a one-hot comparison (the builder's
``scatter_add``, torch's ``embedding_dense_backward``): one parallel loop ``v`` runs over the
result's rows and is read by no input; the reduction loops ``t`` run over the index tensor;
the payload adds the element where the index read at ``t`` equals ``v``::

    ^bb0(%id: i64, %x: f32, %acc: f32):
      %v = linalg.index 0 : index
      %vi = arith.index_cast %v : index to i64
      %hit = arith.cmpi eq, %id, %vi : i64        (operands either way round)
      %ok = arith.andi %hit, %keep : i1            (optional: a padding index skipped)
      %s = arith.select %ok, %x, %zero : f32
      %r = arith.addf %acc, %s : f32
      linalg.yield %r : f32

As written that is ``rows x width x tokens`` additions, almost all of zeros; recognized, it
is ``OpKind.SCATTER`` and a kernel of its own kind (``scatter``), which visits each
``(t, width)`` point once and adds the element into row ``id`` of the result, when
``0 <= id < rows`` (any other index matches no row: it adds nothing, as written). The
recognition is structural (maps, iterators, the payload's dataflow), not by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

#: Ops every scatter's body has at its top level: a body without one of them is no scatter.
BODY_OPS = frozenset({"arith.select", "arith.cmpi", "linalg.index", "arith.addf"})
#: Marks a scatter-add whose GPU kernel adds in a fixed order, without atomics (set by
#: opfuse-fuse-column-sums under ``atomics=0``, read by ``backends/gpu/emit/scatter.py``).
ORDERED_ATTR = "opfuse.ordered"
_EQ = 0  # arith::CmpIPredicate::eq


@dataclass(frozen=True)
class Scatter:
    """A recognized scatter-add: the generic ``op`` adds, at each point, the element into
    the result's row picked by an index (loop ``dim`` of the result set to the index).

    Attributes:
        dim: the loop that runs over the result's rows (read by no input).
        compare: the ``arith.cmpi eq`` of the index with that loop's index.
        index_operand: which operand of ``compare`` is the index (the other is the loop's).
        combine: the ``arith.addf`` that adds the element to the accumulator.
        element_operand: which operand of ``combine`` is the (selected) element.
        rows: the result's row count (loop ``dim``'s size).
    """

    op: ir.Operation
    dim: int
    compare: ir.Operation
    index_operand: int
    combine: ir.Operation
    element_operand: int
    rows: int


def _owner(v: ir.Value) -> ir.Operation | None:
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _dims(amap: ir.AffineMap) -> list[int | None]:
    return [e.position if isinstance(e, ir.AffineDimExpr) else None
            for e in (x.maybe_downcast() for x in amap.results)]


def recognize(op: ir.Operation) -> Scatter | None:
    """The scatter-add ``op`` (a ``linalg.generic``) computes, or None if it is anything else."""
    if op.name != "linalg.generic":
        return None
    view = op.opview
    ins, outs = list(view.inputs), list(view.outputs)  # on tensors or on buffers
    if len(outs) != 1:
        return None
    attrs = op.attributes
    its = _iterators(op)
    if "reduction" not in its or "parallel" not in its:
        return None
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(attrs["indexing_maps"])]
    n_in = len(ins)
    out_dims = _dims(maps[-1])
    if None in out_dims or sorted(out_dims) != [i for i, it in enumerate(its) if it == "parallel"]:
        return None
    block = op.regions[0].blocks[0]
    acc = block.arguments[n_in]
    body = [o.operation for o in block.operations]
    yielded = list(body[-1].operands)
    comb = _owner(yielded[0]) if len(yielded) == 1 else None
    if comb is None or comb.name != "arith.addf":
        return None
    terms = list(comb.operands)
    if terms.count(acc) != 1 or _uses(acc, block) != 1:
        return None
    element_operand = 1 - terms.index(acc)
    sel = _owner(terms[element_operand])
    if sel is None or sel.name != "arith.select" or not _is_zero(sel.operands[2]):
        return None
    compare = _equality_under(sel.operands[0], block)
    if compare is None:
        return None
    dim, index_operand, cmp_op = compare
    if its[dim] != "parallel" or dim not in out_dims:
        return None
    # the rows loop is read by no input, and by the payload only through the comparison
    if any(dim in _dims(m) for m in maps[:n_in]) or not _index_only_in(dim, cmp_op, block):
        return None
    if not _independent_of(cmp_op.operands[index_operand], dim, acc, block):
        return None
    rows = ir.ShapedType(outs[0].type).shape[out_dims.index(dim)]
    return Scatter(op, dim, cmp_op, index_operand, comb, element_operand, rows)


def token_and_width_loops(s: Scatter) -> tuple[list[int], list[int]]:
    """The loops of an update's point, in the order the updates are laid out: the
    reduction loops (the index tensor's positions), then the other parallel loops (the
    width)."""
    its = _iterators(s.op)
    return ([d for d, it in enumerate(its) if it == "reduction"],
            [d for d, it in enumerate(its) if it == "parallel" and d != s.dim])


def update_loops(s: Scatter) -> list[int]:
    """:func:`token_and_width_loops`, one after the other."""
    tokens, width = token_and_width_loops(s)
    return tokens + width


def reads_in_update_order(s: Scatter) -> bool:
    """Every input is read at ``(t.., w..)`` in :func:`update_loops` order, or (the index)
    at ``(t..)``: the updates' flat position is the kernel's point, row-major, so a kernel
    that computes them can add each one where it computes it."""
    tokens, width = token_and_width_loops(s)
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(s.op.attributes["indexing_maps"])]
    return all(_dims(m) in (tokens + width, tokens) for m in maps[:-1])


def _iterators(op: ir.Operation) -> list[str]:
    return [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def _uses(v: ir.Value, block: ir.Block) -> int:
    return sum(1 for o in block.operations for x in o.operands if x == v)


def _is_zero(v: ir.Value) -> bool:
    o = _owner(v)
    if o is None or o.name != "arith.constant":
        return False
    attr = o.attributes["value"]
    return isinstance(attr, ir.FloatAttr) and ir.FloatAttr(attr).value == 0.0


def _loop_of(v: ir.Value) -> int | None:
    """The loop whose index ``v`` is (``linalg.index d``, maybe through an index_cast)."""
    o = _owner(v)
    if o is not None and o.name == "arith.index_cast":
        o = _owner(o.operands[0])
    if o is None or o.name != "linalg.index":
        return None
    return ir.IntegerAttr(o.attributes["dim"]).value


def _equality_under(cond: ir.Value, block: ir.Block):
    """``(dim, index_operand, cmpi)`` of the one equality of a loop index with a value that
    ``cond`` requires (``cond`` is it, or an ``andi`` of it with other conditions)."""
    o = _owner(cond)
    if o is None:
        return None
    if o.name == "arith.andi":
        found = [f for f in (_equality_under(x, block) for x in o.operands) if f is not None]
        return found[0] if len(found) == 1 else None
    if o.name != "arith.cmpi" or ir.IntegerAttr(o.attributes["predicate"]).value != _EQ:
        return None
    loops = [_loop_of(x) for x in o.operands]
    if (loops[0] is None) == (loops[1] is None):
        return None
    index_operand = 0 if loops[0] is None else 1
    return loops[1 - index_operand], index_operand, o


def _index_only_in(dim: int, compare: ir.Operation, block: ir.Block) -> bool:
    """Loop ``dim``'s index is read only by ``compare`` (through its index_cast)."""
    for o in block.operations:
        o = o.operation
        if o.name == "linalg.index" and ir.IntegerAttr(o.attributes["dim"]).value == dim:
            for use in o.results[0].uses:
                user = use.owner
                if user == compare:
                    continue
                if user.name != "arith.index_cast" or any(
                        u.owner != compare for u in user.results[0].uses):
                    return False
    return True


def _independent_of(v: ir.Value, dim: int, acc: ir.Value, block: ir.Block) -> bool:
    """``v`` is computed without the accumulator and without loop ``dim``'s index."""
    stack = [v]
    while stack:
        x = stack.pop()
        if x == acc:
            return False
        o = _owner(x)
        if o is None or o.parent is None or o.parent.operation != block.owner.operation:
            continue  # an input element, or a value from outside the generic
        if o.name == "linalg.index" and ir.IntegerAttr(o.attributes["dim"]).value == dim:
            return False
        stack.extend(o.operands)
    return True


__all__ = ["BODY_OPS", "ORDERED_ATTR", "Scatter", "reads_in_update_order", "recognize",
           "token_and_width_loops", "update_loops"]
