"""Scatter-add kernels ("scatter" groups): each update read once and added into the row its
index picks (an embedding's gradient).

A scatter-add (``opfuse.analysis.scatter``) is written as a reduction over a one-hot
comparison: ``rows x width x tokens`` additions, almost all of zeros. This kernel gives one
thread to each point of the other loops (the index tensor's positions times the width),
the width innermost so that a warp reads consecutive updates. The thread evaluates the
index, and where ``0 <= id < rows`` adds the update into ``out[id, ...]`` with one
``memref.atomic_rmw addf`` (PTX ``atom.global.add.f32``): tokens with the same id add into
the same element from different threads. The result is zeroed by the runtime before the
launch (``KernelSpec.zeroed``; the generic's init is a zero fill). An index outside the
rows matches no row and adds nothing, as written.

The order of the additions is the hardware's: results may differ from run to run in the
last bits, as for torch's own CUDA ``index_put_(accumulate=True)``.

Accepted: a group whose one output is the scatter-add's f32 result, its other members
(reshapes and elementwise producers of the updates or the indices) evaluated at the
thread's point.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from ....analysis.scatter import recognize
from ..build.evaluate import Evaluator, Val, generic_domain, iterators_of, op_of
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, delinearize, numel
from .loop import launch_1d


def emit_scatter(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    require(len(group.outputs) == 1, "a scatter kernel with more than one output")
    (out,) = group.outputs
    op = op_of(out.value)
    s = recognize(op) if op is not None else None
    require(s is not None, "the output is not a scatter-add")
    require(str(out.element_type) == "f32", f"a {out.element_type} scatter-add (f32 atomics only)")
    dom = tuple(generic_domain(op))
    its = iterators_of(op)
    order = [d for d, it in enumerate(its) if it == "reduction"]
    order += [d for d, it in enumerate(its) if it == "parallel" and d != s.dim]
    n = numel(tuple(dom[d] for d in order))
    require(n > 0, "no updates")
    launch = launch_1d(group, module, name, n)
    kb = launch.kb
    flat = kb.add_dim(kb.apply(launch.index))
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=1)
    leaf = group.output_leaf(out, group.result_param(kb.params, out.index))
    n_in = len(op.opview.inputs)
    dummy = [Val(a, True) for a in list(op.regions[0].blocks[0].arguments)[n_in:]]

    def body() -> None:
        at = dict(zip(order, delinearize(flat, tuple(dom[d] for d in order))))
        point = [at.get(d, ir.AffineConstantExpr.get(0, module.context)) for d in range(len(dom))]
        index = ev.payload(op, point, dummy, upto=s.compare)[s.index_operand].ssa
        with kb.emitting():
            itype = index.type
            lo = arith.cmpi(arith.CmpIPredicate.sge, index, kb.const(itype, 0))
            hi = arith.cmpi(arith.CmpIPredicate.slt, index, kb.const(itype, s.rows))
            ok = arith.andi(lo, hi)
            row = arith.index_cast(ir.IndexType.get(module.context), index)
        point[s.dim] = kb.add_dim(row)
        with kb.if_(ok):
            element = ev.payload(op, point, dummy, upto=s.combine)[s.element_operand]
            kept = [e.maybe_downcast() for e in ir.AffineMapAttr(
                ir.ArrayAttr(op.attributes["indexing_maps"])[n_in]).value.results]
            ev.atomic_add(leaf, tuple(point[e.position] for e in kept), element)

    if launch.launched != n:
        with kb.if_(kb.cmp_lt(kb.apply(flat), kb.index(n))):
            body()
    else:
        body()
    kb.vector_lanes = 1
    kb.meta.update(zeroed=[out.index], atomics=n, rows=s.rows)
    return kb


__all__ = ["emit_scatter"]
