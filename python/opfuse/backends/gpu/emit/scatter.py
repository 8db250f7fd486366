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

from ....analysis.scatter import (ORDERED_ATTR, Scatter, recognize, token_and_width_loops,
                                  update_loops)
from ..build.evaluate import Evaluator, Val, generic_domain, maps_of, op_of
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, delinearize, numel
from .loop import launch_1d


def emit_scatter(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    require(len(group.outputs) == 1, "a scatter kernel with more than one output")
    (out,) = group.outputs
    s = scatter_of(out)
    if ORDERED_ATTR in s.op.attributes:
        return _emit_ordered(group, module, name, out, s)
    dom = tuple(generic_domain(s.op))
    order = update_loops(s)
    n = numel(tuple(dom[d] for d in order))
    require(n > 0, "no updates")
    launch = launch_1d(group, module, name, n)
    kb = launch.kb
    flat = kb.add_dim(kb.apply(launch.index))
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=1)

    def body() -> None:
        at = dict(zip(order, delinearize(flat, tuple(dom[d] for d in order))))
        add_update(kb, ev, group, s, out, at)

    _guarded(kb, launch, flat, n, body)
    kb.vector_lanes = 1
    kb.meta.update(zeroed=[out.index], atomics=n, rows=s.rows)
    return kb


def _emit_ordered(group: Group, module: ir.Module, name: str, out, s: Scatter) -> KernelBuilder:
    """The deterministic variant (``opfuse.ordered``: ``torch.use_deterministic_algorithms``):
    one thread per point of the width, walking the index tensor's positions in order and
    adding each update into its row with a plain load and store (no other thread touches
    that column): the CPU's order, run-to-run identical. Parallel over the width only."""
    dom = tuple(generic_domain(s.op))
    t_loops, w_loops = token_and_width_loops(s)
    tokens = tuple(dom[d] for d in t_loops)
    width = tuple(dom[d] for d in w_loops)
    n = numel(width)
    require(n > 0 and numel(tokens) > 0, "no updates")
    launch = launch_1d(group, module, name, n)
    kb = launch.kb
    flat = kb.add_dim(kb.apply(launch.index))
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=1, sequential=True)
    at_w = dict(zip(w_loops, delinearize(flat, width)))

    def walk(iv, _):
        at_t = dict(zip(t_loops, delinearize(kb.add_dim(iv), tokens)))
        add_update(kb, ev, group, s, out, {**at_w, **at_t}, atomic=False)
        return []

    def body() -> None:
        kb.for_(kb.index(0), kb.index(numel(tokens)), kb.index(1), [], walk)

    _guarded(kb, launch, flat, n, body)
    kb.vector_lanes = 1
    kb.meta.update(zeroed=[out.index], atomics=0, rows=s.rows, ordered=True)
    return kb


def _guarded(kb: KernelBuilder, launch, flat, n: int, body) -> None:
    """``body()`` for the first ``n`` threads (the last block may have more)."""
    if launch.launched != n:
        with kb.if_(kb.cmp_lt(kb.apply(flat), kb.index(n))):
            body()
    else:
        body()


def scatter_of(out) -> Scatter:
    """The scatter-add a group output is the result of; Unsupported for anything else
    (or for a result other than f32: the atomics add f32)."""
    op = op_of(out.value)
    s = recognize(op) if op is not None else None
    require(s is not None, "the output is not a scatter-add")
    require(str(out.element_type) == "f32", f"a {out.element_type} scatter-add (f32 atomics only)")
    return s


def add_update(kb: KernelBuilder, ev: Evaluator, group: Group, s: Scatter, out, at: dict,
               pred=None, atomic: bool = True) -> None:
    """Add the update at loop point ``at`` (every loop but the rows one: an affine expr
    each) into output ``out`` at the row its index picks, when ``0 <= id < rows`` (and
    ``pred``): one atomic per lane. The index must be the same for every lane (it is read
    at the reduction loops only, and a thread's lanes run along the innermost other loop)."""
    op = s.op
    n_in = len(op.opview.inputs)
    dummy = [Val(a, True) for a in list(op.regions[0].blocks[0].arguments)[n_in:]]
    zero = ir.AffineConstantExpr.get(0, kb.ctx)
    point = [at.get(d, zero) for d in range(len(generic_domain(op)))]
    index = ev.payload(op, point, dummy, upto=s.compare)[s.index_operand]
    require(index.uniform, "a scatter index that differs between a thread's lanes")
    index = index.ssa
    with kb.emitting():
        itype = index.type
        lo = arith.cmpi(arith.CmpIPredicate.sge, index, kb.const(itype, 0))
        hi = arith.cmpi(arith.CmpIPredicate.slt, index, kb.const(itype, s.rows))
        ok = arith.andi(lo, hi)
        row = arith.index_cast(ir.IndexType.get(op.context), index)
    point[s.dim] = kb.add_dim(row)
    leaf = group.output_leaf(out, group.result_param(kb.params, out.index))
    kept = [e.maybe_downcast().position for e in maps_of(op)[n_in].results]
    with kb.if_(kb.and_(ok, pred)):
        element = ev.payload(op, point, dummy, upto=s.combine)[s.element_operand]
        where = tuple(point[d] for d in kept)
        if atomic:
            ev.atomic_add(leaf, where, element)
        else:  # the caller's thread owns this element (the ordered kernel's column)
            current = ev.load(leaf, where)
            with kb.emitting():
                total = arith.addf(current.ssa, element.ssa)
            ev.store(leaf, where, Val(total, True))


def scatter_rows(kb: KernelBuilder, ev: Evaluator, group: Group, s: Scatter, out,
                 row: ir.AffineExpr, chunks, row_ok) -> None:
    """The row kernel's part (``rows.py``): add this thread's elements of its row (the
    update at row ``row`` of the index tensor's positions) into output ``out``, masked like
    the row's stores."""
    dom = generic_domain(s.op)
    t_loops, w_loops = token_and_width_loops(s)
    at_row = dict(zip(t_loops, delinearize(row, tuple(dom[d] for d in t_loops))))

    def add(idx, ok, accs):
        add_update(kb, ev, group, s, out, {**at_row, **dict(zip(w_loops, idx))},
                   kb.and_(ok, row_ok))
        return []

    chunks.fold([], add)


__all__ = ["add_update", "emit_scatter", "scatter_of", "scatter_rows"]
