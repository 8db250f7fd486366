"""Column sums added atomically by the kernel that computes what they sum
(opfuse-fuse-column-sums): the bias and LayerNorm weight gradients of a backward pass.

A column sum reduces leading loops and keeps trailing ones (``db = dY.sum(0)``,
``dgamma = (dY * xhat).sum(0)``). It rides along with

* a row kernel over ``rows x cols`` (:mod:`.rows`): no team holds a column, so every
  thread adds the elements of the row it owns (:func:`accumulate`);
* a matmul without batch dims (:mod:`.matmul`'s ``store_outputs``): the epilogue adds
  each element of C's tile, the sum reducing C's M rows and keeping its N columns;

with one ``memref.atomic_rmw addf`` per element (PTX ``atom.global.add.f32``), the result
zeroed by the runtime before the launch (``KernelSpec.zeroed``). The order of those
additions is the hardware's: results may differ from run to run in the last bits, as for
any atomically accumulated sum (XLA's and Inductor's GPU reductions with atomics too).

Accepted (``opfuse.analysis.column_sums``): f32 sums (``arith.addf``) whose accumulator
starts at zero, reducing leading loops whose sizes multiply to the kernel's row count (the
row dims, or a view that splits or collapses them) and keeping exactly its columns.
Anything else is Unsupported here, and the pass does not form such a group.

Cost: one atomic per element of the summed value (rows x cols); reducing across a block's
rows first (in registers or shared memory, one atomic per column per block) is not built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mlir import ir

from ....analysis.column_sums import leading_reductions, why_not_atomic_sum
from ..build.evaluate import Evaluator, Val, generic_domain, iterators_of, maps_of, n_inputs
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, delinearize


@dataclass
class ColumnSum:
    op: ir.Operation  # the linalg.generic
    combine: ir.Operation  # its arith.addf
    x_operand: int  # which operand of ``combine`` is the element
    rows: tuple[int, ...]  # the sizes of its leading reduced loops (a row kernel's: its row loops)
    kept: tuple[int, ...]  # its parallel loops, in the order its result is indexed

    @property
    def value(self) -> ir.Value:
        return self.op.results[0]

    def at(self, point: tuple) -> tuple:
        """The result's index at loop point ``point``."""
        return tuple(point[i] for i in self.kept)


def is_column_sum(op: ir.Operation) -> bool:
    """A generic whose reduction loops all come before its parallel ones (and which keeps
    at least one): what this module may take, before the checks of :func:`column_sum`."""
    return leading_reductions(iterators_of(op)) > 0


def is_partial_sum(op: ir.Operation) -> bool:
    """A generic that reduces some loops and keeps others, in any order (what a loop
    kernel may add into: :func:`partial_sum`)."""
    its = iterators_of(op)
    return "reduction" in its and "parallel" in its


def partial_sum(op: ir.Operation) -> ColumnSum:
    """``op`` as a sum a kernel adds into atomically: an f32 sum from zero whose result is
    indexed by its parallel loops."""
    why = why_not_atomic_sum(op)
    require(why is None, why or "")
    its = iterators_of(op)
    dims = [e.maybe_downcast() for e in maps_of(op)[n_inputs(op)].results]
    require(all(isinstance(d, ir.AffineDimExpr) for d in dims)
            and sorted(d.position for d in dims) == [i for i, it in enumerate(its)
                                                      if it == "parallel"],
            "a sum whose result is not indexed by its kept loops")
    block = op.regions[0].blocks[0]
    acc = block.arguments[n_inputs(op)]
    comb = list(block.operations)[-1].operands[0].owner
    comb = comb.operation if hasattr(comb, "operation") else comb
    dom = tuple(generic_domain(op))
    p = leading_reductions(its)
    return ColumnSum(op, comb, 1 - list(comb.operands).index(acc), dom[:p],
                     tuple(d.position for d in dims))


def column_sum(op: ir.Operation, n_rows: int, cols: tuple[int, ...]) -> ColumnSum:
    """``op`` as a column sum of a kernel over ``n_rows`` rows of ``cols``: its loops are
    the rows' (in a shape of their own) then ``cols``, its leading loops reduced (all the
    row loops, or the first of them: GPT-2's position-embedding gradient sums a
    ``batch x positions`` row kernel over the batch), its result indexed by the others in
    order. ``rows`` of the result: the sizes of the sum's row loops."""
    dom = tuple(generic_domain(op))
    p = leading_reductions(iterators_of(op))
    k = len(dom) - len(cols)
    require(0 < p <= k and math.prod(dom[:k]) == n_rows and dom[k:] == cols,
            f"a column sum over {list(dom)}, not over the kernel's {n_rows} rows of "
            f"{list(cols)}")
    cs = partial_sum(op)
    require(cs.kept == tuple(range(p, len(dom))), "a column sum whose result is not its kept loops")
    return replace(cs, rows=dom[:k])


def add_at(kb: KernelBuilder, ev: Evaluator, group: Group, cs: ColumnSum, out,
           point: tuple, kept: tuple, pred) -> None:
    """Add ``cs``'s element at its loop point ``point`` (kept part ``kept``: where it goes
    in the result) into output ``out``, one atomic per lane, under ``pred``."""
    leaf = group.output_leaf(out, group.result_param(kb.params, out.index))
    # the accumulator is not read before the combiner (checked by column_sum)
    dummy = [Val(a, True) for a in list(cs.op.regions[0].blocks[0].arguments)[n_inputs(cs.op):]]
    operands = ev.payload(cs.op, point, dummy, upto=cs.combine)
    if pred is None:
        ev.atomic_add(leaf, kept, operands[cs.x_operand])
    else:
        with kb.if_(pred):
            ev.atomic_add(leaf, kept, operands[cs.x_operand])


def accumulate(kb: KernelBuilder, ev: Evaluator, group: Group, cs: ColumnSum, out,
               row: ir.AffineExpr, chunks, row_ok) -> None:
    """The row kernel's part: add this thread's elements of its row of ``cs`` into output
    ``out`` (a group output whose value is ``cs.value``), masked like the row's stores."""
    point_rows = tuple(delinearize(row, cs.rows))

    def add(idx, ok, accs):
        point = point_rows + tuple(idx)
        add_at(kb, ev, group, cs, out, point, cs.at(point), kb.and_(ok, row_ok))
        return []

    chunks.fold([], add)


__all__ = ["ColumnSum", "accumulate", "add_at", "column_sum", "is_column_sum", "is_partial_sum",
           "partial_sum"]
