"""Column-reduction kernels (``columns`` groups: opfuse-fuse-columns).

The group's largest reduction (its *root*) reduces axes that are not the innermost ones over
a domain ``D``, keeping the points ``K`` (mean pooling: ``D = B x S x H``, the sum over
``S`` keeps ``K = B x H``). Each thread owns one kept point ``k`` (consecutive threads:
consecutive points of ``K`` in row-major order, so along the innermost kept axis, which in
``D`` is contiguous: warps read consecutive addresses on every step of the column). The
thread

1. computes the group's results over ``K`` at ``k`` (``sum / count``): each reduction they
   read is a sequential loop over its reduced axes at ``k`` (the evaluator's ``scf.for``),
   its elementwise producers evaluated in the loop (the embedding gather, the mask
   product), so nothing but the group's inputs is read from memory;
2. then, for results over ``D`` (``v / ||v||``), walks its column again: a loop nest over
   the root's reduced axes evaluates the result at each of the column's points, reading
   the reductions at ``k`` from registers (computed once, before the loop).

A reduction of another shape that the group reads through a broadcast (the mask count, one
value per batch row) is computed by each thread that reads it, at the point it reads.
Outputs of any other shape are left to the fallback (Unsupported). One element per thread
(scalar code), blocks of up to 256 threads, the last block guarded.
"""

from __future__ import annotations

import contextlib
import math

from mlir import ir

from ..build.evaluate import Evaluator, generic_domain, iterators_of, maps_of, n_inputs
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, delinearize, numel
from .loop import launch_1d


def column_root(group: Group) -> ir.Operation:
    """The group's largest reduction; Unsupported unless it keeps an axis after a reduced
    one (a column reduction: a row reduction is the rows emitter's)."""
    reductions = [op for op in group.ops()
                  if op.name == "linalg.generic" and "reduction" in iterators_of(op)]
    require(bool(reductions), "no reduction")
    root = max(reductions, key=lambda op: math.prod(generic_domain(op)))
    its = iterators_of(root)
    require("parallel" in its[its.index("reduction"):], "a row reduction, not a column one")
    return root


def emit_columns(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    root = column_root(group)
    its, dom = iterators_of(root), tuple(generic_domain(root))
    kept = [i for i, it in enumerate(its) if it == "parallel"]
    reduced = [i for i, it in enumerate(its) if it == "reduction"]
    k_shape = tuple(dom[i] for i in kept)
    outs = group.outputs
    require(bool(outs), "no outputs")
    for o in outs:
        require(o.shape in (k_shape, dom), f"an output of shape {list(o.shape)}, neither the "
                f"columns' results {list(k_shape)} nor their domain {list(dom)}")
    n = numel(k_shape)
    require(n > 0, "an empty output")
    launch = launch_1d(group, module, name, n)
    kb = launch.kb
    first = kb.apply(launch.index)
    k = delinearize(kb.add_dim(first), k_shape) if k_shape else []
    ev = Evaluator(kb, group.func, group.leaves(kb.params), sequential=True)
    n_in = n_inputs(root)

    def store(o, idx) -> None:
        val = ev.value(o.value, idx)
        ev.store(group.output_leaf(o, group.result_param(kb.params, o.index)), tuple(idx), val)

    def column(o) -> None:
        """Result ``o`` over ``D`` at every point of the thread's column."""
        point: list = [None] * len(dom)
        for axis, e in zip(kept, k):
            point[axis] = e

        def nest(level: int) -> None:
            def body(iv, _):
                point[reduced[level]] = kb.add_dim(iv)
                if level + 1 < len(reduced):
                    nest(level + 1)
                else:
                    store(o, point)
                return []

            kb.for_(kb.index(0), kb.index(dom[reduced[level]]), kb.index(1), [], body)

        nest(0)

    def body() -> None:
        # the root's results at k, once: what both passes read (each result's dims are
        # kept loops, in the order its map gives them)
        at_k = dict(zip(kept, k))
        for r, res in enumerate(root.results):
            if list(res.uses):
                dims = [x.maybe_downcast() for x in maps_of(root)[n_in + r].results]
                require(all(isinstance(x, ir.AffineDimExpr) and x.position in at_k for x in dims),
                        "a column reduction whose result is not indexed by its kept loops")
                ev.value(res, [at_k[x.position] for x in dims])
        for o in outs:
            if o.shape == k_shape:
                store(o, k)
        for o in outs:
            if o.shape == dom and o.shape != k_shape:
                column(o)

    guard = kb.if_(kb.cmp_lt(first, kb.index(n))) if launch.launched != n else contextlib.nullcontext()
    with guard:
        body()
    kb.vector_lanes = 1
    kb.meta.update(columns=n, column_length=math.prod(dom[i] for i in reduced))
    return kb
