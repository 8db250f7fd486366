"""Recognizing a scan (an inclusive running sum, ``cumsum``) in a ``linalg.generic``.

linalg has no scan op on tensors that the upstream passes lower, so producers write a
running sum as a reduction over a triangular domain (``builder_reductions.cumsum``,
torch's ``aten.cumsum``): the result's loops ``d0 .. d(n-1)`` plus one reduction loop
``r = d(n)`` along the scanned axis ``a``; the input is read at the result's index with
``r`` in place of ``d(a)``, and the payload adds the element where ``r <= d(a)``::

    ^bb0(%x, %acc):
      %j = linalg.index a      %r = linalg.index n
      %in = arith.cmpi ule, %r, %j        (or sle; or uge/sge with the operands swapped)
      %s = arith.addf %acc, %x            (addi; %x may be extended first: f16 -> f32)
      %y = arith.select %in, %s, %acc
      linalg.yield %y

That is ``O(n²)`` work per row as written; recognized, it is ``OpKind.SCAN`` and a
kernel of its own kind (``scan``: a warp/block scan on the GPU, ``backends/gpu/emit/scan.py``).
The recognition is structural (maps, iterators, the payload's dataflow), not by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

#: Combiners a scan may use (associative; the identity of each is 0).
COMBINERS = ("arith.addf", "arith.addi")
#: Ops every scan's body has at its top level (the select of what :func:`recognize` yields,
#: its compare, the compared loop indices): a body without one of them is no scan.
BODY_OPS = frozenset({"arith.select", "arith.cmpi", "linalg.index"})
# predicate of ``cmpi <pred>, r, j`` that means r <= j, and the same with the operands swapped
_LE = {"ule": True, "sle": True, "uge": False, "sge": False}
_PREDICATES = {0: "eq", 1: "ne", 2: "slt", 3: "sle", 4: "sgt", 5: "sge", 6: "ult", 7: "ule",
               8: "ugt", 9: "uge"}  # arith::CmpIPredicate


@dataclass(frozen=True)
class Scan:
    """A recognized scan: the generic ``op`` sums its input along result dim ``axis``.

    Attributes:
        axis: the scanned dim of the result (and of the input).
        combine: the payload op that adds an element to the running sum.
        element: the payload value added (the input element, maybe extended).
    """

    op: ir.Operation
    axis: int
    combine: ir.Operation
    element: ir.Value


def _owner(v: ir.Value) -> ir.Operation | None:
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _index_dim(v: ir.Value) -> int | None:
    op = _owner(v)
    if op is None or op.name != "linalg.index":
        return None
    return ir.IntegerAttr(op.attributes["dim"]).value


def _dims(amap: ir.AffineMap) -> list[int | None]:
    return [e.position if isinstance(e, ir.AffineDimExpr) else None
            for e in (x.maybe_downcast() for x in amap.results)]


def recognize(op: ir.Operation) -> Scan | None:
    """The scan ``op`` (a ``linalg.generic``) computes, or None if it is anything else."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return None
    attrs = op.attributes
    its = [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(attrs["iterator_types"])]
    n = len(its) - 1
    if n < 1 or its != ["parallel"] * n + ["reduction"]:
        return None
    operands = list(op.operands)
    if len(operands) != 2 or not all(isinstance(v.type, ir.ShapedType) for v in operands):
        return None
    in_map, out_map = (ir.AffineMapAttr(a).value for a in ir.ArrayAttr(attrs["indexing_maps"]))
    if _dims(out_map) != list(range(n)):
        return None
    src = _dims(in_map)
    if len(src) != n or src.count(n) != 1:
        return None
    axis = src.index(n)
    if src != [n if k == axis else k for k in range(n)]:
        return None
    block = op.regions[0].blocks[0]
    x_arg, acc = block.arguments[0], block.arguments[1]
    body = [o.operation for o in block.operations]
    yielded = body[-1].operands
    sel = _owner(yielded[0]) if len(yielded) == 1 else None
    if sel is None or sel.name != "arith.select" or sel.operands[2] != acc:
        return None
    cond, comb = _owner(sel.operands[0]), _owner(sel.operands[1])
    if cond is None or comb is None or cond.name != "arith.cmpi" or comb.name not in COMBINERS:
        return None
    pred = _PREDICATES.get(ir.IntegerAttr(cond.attributes["predicate"]).value)
    if pred not in _LE:
        return None
    a, b = (_index_dim(v) for v in cond.operands)
    if (a, b) != ((n, axis) if _LE[pred] else (axis, n)):
        return None
    terms = list(comb.operands)
    if acc not in terms or terms.count(acc) != 1:
        return None
    element = terms[1 - terms.index(acc)]
    if not _from_element_only(element, x_arg, block):
        return None
    return Scan(op, axis, comb, element)


def _from_element_only(v: ir.Value, x_arg: ir.Value, block: ir.Block) -> bool:
    """``v`` is the input element, or computed from it (and constants) alone by payload
    ops: no accumulator, no loop index."""
    stack = [v]
    while stack:
        x = stack.pop()
        if x == x_arg:
            continue
        owner = x.owner
        if isinstance(owner, ir.Block):
            if owner == block:
                return False  # the accumulator
            continue  # a value from outside the generic: uniform
        o = _owner(x)
        if o.name == "linalg.index":
            return False
        if o.parent is not None and o.parent.operation == block.owner.operation:
            stack.extend(o.operands)
    return True
