"""opfuse-fuse-recompute, second form: an elementwise producer of a gathered tensor is
computed at the gathered positions.

A gather reads its source with ``tensor.extract`` at data-dependent positions, so the
source's producer can never join the gather's kernel as it is (``Planner.gather_via``: the
tensor must be complete first). When that producer is one elementwise ``linalg.generic``
(HF's ``attention_mask.to(bool)`` read by the padding-mask gather ``mask[batch, kv]``), the
gather can instead extract the producer's *inputs* at the same position and apply its
payload there: the producer's value at that element, computed where it is needed. The
gather's body is rewritten so; the producer is erased when nothing else reads it.

Only producers whose inputs are read through projected permutations (identity, transposed
or broadcast maps) and whose body does not read its output qualify: then the input element
behind result element ``i`` is ``in[map(i)]``, and ``linalg.index d`` in the payload is
``i[d]``.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, tensor

from opfuse.analysis.graph import Node
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind, element_bytes, forget, forget_graphs


def gathered_producer(planner: Planner, p: Group) -> ir.Value | None:
    """The result of ``p`` that some gather reads and that can be computed at the gathered
    positions instead (``p`` is one qualifying generic), or None."""
    if len(p.members) != 1 or len(p.outputs) != 1:
        return None
    node = planner.graph.nodes[p.members[0]]
    if not _qualifies(node):
        return None
    v = next(iter(p.outputs))
    if any(v in planner.graph.nodes[r].gathers for r in planner.graph.readers(v)):
        return v
    return None


def _qualifies(node: Node) -> bool:
    op, info = node.op, node.info
    if op.name != "linalg.generic" or node.kind != OpKind.ELEMENTWISE or len(op.results) != 1:
        return False
    if node.gathers or info.payload is None or any(info.payload.used_outputs):
        return False
    if any(it != "parallel" for it in info.iterators):
        return False
    out_map = info.output_maps[0] if info.output_maps else None
    if out_map is None or not _is_identity(out_map):
        return False
    return all(m is not None and _projected_permutation(m) for m in info.input_maps)


def _is_identity(m: ir.AffineMap) -> bool:
    return len(m.results) == m.n_dims and all(
        dim_of(r) == i for i, r in enumerate(m.results))


def dim_of(expr: ir.AffineExpr) -> int | None:
    """The position of a dim expression (``d2``: 2), None for any other expression."""
    e = expr.maybe_downcast() if hasattr(expr, "maybe_downcast") else expr
    return e.position if isinstance(e, ir.AffineDimExpr) else None


def _zero(expr: ir.AffineExpr) -> bool:
    e = expr.maybe_downcast() if hasattr(expr, "maybe_downcast") else expr
    return isinstance(e, ir.AffineConstantExpr) and e.value == 0


def _projected_permutation(m: ir.AffineMap) -> bool:
    return all(dim_of(r) is not None or _zero(r) for r in m.results)


def gathered_cost(planner: Planner, p: Group, v: ir.Value, c: Group) -> tuple[int, int]:
    """(Q, W) of gather group ``c`` once it computes ``p``'s value ``v`` where it reads it:
    the elements it gathers from ``v`` come from ``p``'s inputs instead, each with ``p``'s
    flops per point."""
    node = planner.graph.nodes[p.members[0]]
    elements = c.reads.get(v, 0) // max(1, element_bytes(v.type))
    reads = {u: b for u, b in c.reads.items() if u != v}
    for u in node.reads:
        b = min(planner.graph.nodes[p.members[0]].read_bytes(u), elements * element_bytes(u.type))
        reads[u] = max(b, reads.get(u, 0))
    q = sum(reads.values()) + sum(c.outputs.values())
    return q, c.flops + node.info.flops_per_point * elements


def inline_into_gathers(planner: Planner, p: Group, v: ir.Value, targets: list[Group]) -> None:
    """Rewrite every ``tensor.extract`` of ``v`` in the members of ``targets`` to compute
    ``p``'s payload at that position; erase ``p``'s op if nothing reads ``v`` any more."""
    producer = planner.graph.nodes[p.members[0]].op
    members = {m for c in targets for m in c.members}
    for m in sorted(members):
        node = planner.graph.nodes[m]
        if v not in node.gathers:
            continue
        extracts: list[ir.Operation] = []
        _collect_extracts(node.op, v, extracts)
        for ex in extracts:
            _inline_at(producer, ex)
        if extracts:
            forget(node.op)  # its body changed: its cached description (payload, flops) too
    if not any(True for _ in v.uses):
        forget(producer)
        producer.erase()


def _collect_extracts(op: ir.Operation, v: ir.Value, out: list[ir.Operation]) -> None:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name == "tensor.extract" and inner.operands[0] == v:
                    out.append(inner)
                _collect_extracts(inner, v, out)


def _inline_at(producer: ir.Operation, ex: ir.Operation) -> None:
    """Replace ``ex`` (``tensor.extract %v[%i...]``, ``%v`` = ``producer``'s result) by the
    producer's payload applied to its inputs' elements at ``%i``."""
    coords = list(ex.operands)[1:]
    body = producer.regions[0].blocks[0]
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(producer.attributes["indexing_maps"])]
    n_in = len(producer.operands) - len(producer.results)
    mapping: dict[ir.Value, ir.Value] = {}
    with ir.InsertionPoint(ex), ex.location:
        zero = None
        for k in range(n_in):
            src = producer.operands[k]
            idx = []
            for r in maps[k].results:
                d = dim_of(r)
                if d is None:
                    if zero is None:
                        zero = arith.ConstantOp(ir.IndexType.get(), 0).result
                    idx.append(zero)
                else:
                    idx.append(coords[d])
            mapping[body.arguments[k]] = tensor.ExtractOp(src, idx).result
        result = None
        for inner in body.operations:
            inner = inner.operation
            if inner.name == "linalg.yield":
                result = mapping.get(inner.operands[0], inner.operands[0])
                break
            if inner.name == "linalg.index":
                mapping[inner.results[0]] = coords[ir.IntegerAttr(inner.attributes["dim"]).value]
                continue
            clone = inner.clone().operation
            for old, new in mapping.items():
                clone.replace_uses_of_with(old, new)
            mapping.update(zip(inner.results, clone.results))
    ex.results[0].replace_all_uses_with(result)
    ex.erase()
    forget_graphs()  # the gather's body now reads the producer's inputs
