"""Scatter-adds as loops over their updates: each update read once, added into its row.

A scatter-add (``opfuse.analysis.scatter``: an embedding's gradient) is written as a
reduction over a one-hot comparison, ``rows x width x tokens`` additions as
``convert-linalg-to-loops`` would run it. This rewrite (on buffers, before the other
reductions are lowered) visits each point of the other loops once::

    for t in the reduction loops, w in the other parallel loops:   # in the generic's order
        <the payload, the comparison with the row loop known true>
        id = the index the payload compares
        if 0 <= id < rows:
            out[..id..] = out[..id..] + element

For each result element the updates arrive in the order of the reduction loops, the order
the generic sums them in: the result is the same, bit for bit, as the one-hot form's. An
index outside the rows matches no row and adds nothing, as written. The result buffer
holds its initial value (the fill before the generic) when the loops start.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf

from ...analysis.scatter import Scatter, recognize
from .reductions import loop_bounds, map_indices


def lower_scatters(module: ir.Module) -> int:
    """Rewrite every scatter-add ``linalg.generic`` on memrefs in ``module``; returns how
    many."""
    found: list[Scatter] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.generic" and not op.results:
            s = recognize(op)
            if s is not None:
                found.append(s)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for s in found:
        _lower(s)
    return len(found)


def _lower(s: Scatter) -> None:
    op = s.op
    view = op.opview
    ins, (out,) = list(view.inputs), list(view.outputs)
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    its = [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    body = op.regions[0].blocks[0]
    ops = [o.operation for o in body.operations]
    acc = body.arguments[len(ins)]
    with op.context, op.location:
        index = ir.IndexType.get()
        ip = ir.InsertionPoint(op)
        with ip:
            zero = arith.constant(index, 0)
            one = arith.constant(index, 1)
            bounds = loop_bounds(op, maps)
        ivs: list = [zero] * len(its)  # the row loop's stays 0: no input reads it
        order = [d for d, it in enumerate(its) if it == "reduction"]
        order += [d for d, it in enumerate(its) if it == "parallel" and d != s.dim]
        for d in order:
            with ip:
                loop = scf.ForOp(zero, bounds[d], one)
            with ir.InsertionPoint(loop.body):
                terminator = scf.YieldOp([])
            ivs[d] = loop.induction_variable
            ip = ir.InsertionPoint(terminator)
        with ip:
            loads = [memref.load(v, map_indices(m, ivs)) for v, m in zip(ins, maps[:len(ins)])]
            i1 = ir.IntegerType.get_signless(1)
            known = arith.ConstantOp(i1, ir.IntegerAttr.get(i1, 1))  # the comparison: true
        for arg, value in zip(list(body.arguments)[:len(ins)], loads):
            arg.replace_all_uses_with(value)
        index_value = s.compare.operands[s.index_operand]
        s.compare.results[0].replace_all_uses_with(known.result)
        dead = []  # the row loop's index and its cast, read only by the comparison
        for inner in ops[:-1]:
            if inner == s.compare or inner == s.combine:
                continue
            if inner.name == "linalg.index":
                dim = ir.IntegerAttr(inner.attributes["dim"]).value
                if dim == s.dim:
                    dead.append(inner)
                    continue
                inner.results[0].replace_all_uses_with(ivs[dim])
                inner.erase()
                continue
            if inner.name == "arith.index_cast" and _reads_row_index(inner, s.dim):
                dead.append(inner)
                continue
            inner.move_before(terminator)
        with ip:
            itype = index_value.type
            lo = arith.cmpi(arith.CmpIPredicate.sge, index_value, arith.constant(itype, 0))
            hi = arith.cmpi(arith.CmpIPredicate.slt, index_value, arith.constant(itype, s.rows))
            row = arith.index_cast(index, index_value)
            guard = scf.IfOp(arith.andi(lo, hi))
        with ir.InsertionPoint(guard.then_block):
            at = list(ivs)
            at[s.dim] = row
            where = map_indices(maps[-1], at)
            current = memref.load(out, where)
            end = scf.YieldOp([])
        s.combine.move_before(end)
        acc.replace_all_uses_with(current)
        with ir.InsertionPoint(end):
            memref.store(s.combine.results[0], out, where)
        s.compare.erase()
        for inner in reversed(dead):
            inner.erase()
    op.erase()


def _reads_row_index(op: ir.Operation, dim: int) -> bool:
    src = op.operands[0].owner
    src = src.operation if hasattr(src, "operation") else src
    return (not isinstance(src, ir.Block) and src.name == "linalg.index"
            and ir.IntegerAttr(src.attributes["dim"]).value == dim)


__all__ = ["lower_scatters"]
