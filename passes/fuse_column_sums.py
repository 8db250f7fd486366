"""opfuse-fuse-column-sums: a column sum joins the row kernel, matmul or loop kernel that
computes what it sums.

A backward pass sums over the batch what its row kernels compute: LayerNorm's backward
is a row kernel over ``rows x cols`` (``dX`` needs two sums along each row), and beside it
stand the weight and bias gradients ``dgamma = (dY * xhat).sum(0)``, ``dbeta = dY.sum(0)``
and the next linear's ``db = dX.sum(0)``: column sums over the same ``rows x cols`` of
values the row kernel holds in registers. opfuse-fuse-reduction refuses them (reductions
over other rows) and opfuse-fuse-columns leaves them alone (what they read is also read
elsewhere), so each was a kernel of its own that read back what the row kernel had just
written. Here such a column group joins the row group, each merge asking the cost guard;
the row emitter adds every element into the sum with an f32 atomic (see
``backends/gpu/emit/column_sums.py``), and the CPU backend runs the sum as a loop
nest of the same function.

A candidate column group holds one column sum (``opfuse.analysis.column_sums``: an f32
``addf`` from a zero fill) and at most the views opfuse-fuse-producer-consumer cloned into
it; it reduces leading loops whose sizes multiply to the row group's row count and keeps
the row group's columns; every value it reads that a group computes comes from that one
row group. A matmul (an output group without batch dims, its result M x N) is such a
producer too: the sum reduces its M rows and keeps its N columns (a linear layer's bias
gradient summing the dY another matmul computed), and the matmul emitters add into it
from their epilogue. Runs after opfuse-fuse-columns (which gives column groups their
consumers and producers first) and after opfuse-fuse-epilogue (so a sum of a matmul's
epilogue finds the matmul), before opfuse-fuse-horizontal, which leaves such a matmul
alone. A loop group over the sum's points (GELU's backward, summed into the bias gradient
of the linear before it) is one too: each thread adds the elements it computes, into a
sum over any of the loops (a convolution's bias gradient sums N, H and W of an NCHW
gradient, keeping C).

A scatter-add (an embedding's gradient: ``opfuse.analysis.scatter``) joins the row or loop
kernel that computes its updates the same way: the updates' flat positions are that
kernel's points (LayerNorm's backward over the embeddings' ``tokens x width``), and each
thread adds the update it computed into the row its token id picks, with an f32 atomic
(``backends/gpu/emit/scatter.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.column_sums import leading_reductions, why_not_atomic_sum
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind
from opfuse.analysis.scatter import (ORDERED_ATTR, Scatter, reads_in_update_order,
                                    token_and_width_loops)
from opfuse.analysis.scatter import recognize as recognize_scatter

from .common import FusionOptions, plan_each_function, shape_str

NAME = "opfuse-fuse-column-sums"

#: Op classes a candidate may hold beside its sum: the views cloned into it.
_MOVERS = (OpKind.INJECTIVE, OpKind.BROADCAST)


@dataclass(frozen=True)
class Options(FusionOptions):
    """Guard thresholds, plus:

    Attributes:
        atomics: form the groups whose GPU kernels add into sums atomically (0: keep each
            column sum a kernel of its own, whose sum order is fixed: run-to-run identical
            results on the GPU, as ``torch.use_deterministic_algorithms`` asks; and mark
            every scatter-add ``opfuse.ordered``: its kernel adds each column's updates in
            order, one thread per column, without atomics).
    """

    atomics: bool = True


def run(module: ir.Module, options: Options = Options()) -> None:
    if options.atomics:
        plan_each_function(module, NAME, options, _plan)
        return

    def mark(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.generic" and recognize_scatter(op) is not None:
            op.attributes[ORDERED_ATTR] = ir.UnitAttr.get(op.context)
        return ir.WalkResult.ADVANCE

    module.operation.walk(mark)


def _plan(planner: Planner) -> None:
    for g in list(planner.groups()):
        if planner.find(g.gid) != g.gid:
            continue
        scatter = _scatter(planner, g)
        if scatter is not None:
            host = _update_group(planner, g, scatter)
            if host is not None:
                kind = host.forced_kind
                if planner.try_merge(host, g, why=f"scatter-add in the {host.kind} kernel"):
                    planner.group(host.gid).forced_kind = kind
            continue
        found = _column_sum(planner, g)
        if found is None:
            continue
        node, reduced = found
        rows = _row_group(planner, g, node, reduced)
        if rows is None:
            continue
        kind = rows.forced_kind
        if planner.try_merge(rows, g, why=f"column sum in the {rows.kind} kernel"):
            planner.group(rows.gid).forced_kind = kind  # the kernel's kind, not "columns"


def _column_sum(planner: Planner, g: Group):
    """``(node, reduced loops)`` of ``g``'s column sum when ``g`` is a candidate (one sum,
    any other members views); None otherwise (silently: most groups are not column sums)."""
    if g.kind != "columns":  # a row reduction is opfuse-fuse-reduction's (a row kernel)
        return None
    nodes = [planner.graph.nodes[m] for m in g.members]
    sums = [n for n in nodes if n.kind == OpKind.REDUCTION]
    if len(sums) != 1 or any(n.kind not in _MOVERS for n in nodes if n is not sums[0]):
        return None
    node = sums[0]
    if "parallel" not in node.info.iterators or set(g.outputs) != set(node.results):
        return None  # a sum to one value would have every thread add into one element
    return node, leading_reductions(node.info.iterators)


def _scatter(planner: Planner, g: Group) -> Scatter | None:
    """The scatter-add of ``g`` when ``g`` is a candidate (one scatter-add, any other
    members views, its result the group's one output)."""
    if g.kind != "scatter":
        return None
    nodes = [planner.graph.nodes[m] for m in g.members]
    found = [n for n in nodes if n.kind == OpKind.SCATTER]
    if len(found) != 1 or any(n.kind not in _MOVERS for n in nodes if n is not found[0]):
        return None
    if set(g.outputs) != set(found[0].results):
        return None
    return recognize_scatter(found[0].op)


def _one_producer(planner: Planner, g: Group, what: str) -> Group | None:
    """The one group whose values ``g`` reads (None, recording why, when there are several;
    None when there is none)."""
    producers = planner.producer_groups(g)
    if len(producers) > 1:
        planner.refuse(producers[0], g, f"{what} reads values of several kernels")
    return producers[0] if len(producers) == 1 else None


def _update_group(planner: Planner, g: Group, s: Scatter) -> Group | None:
    """The row or loop group computing ``s``'s updates that ``g`` may join: one producer
    group, whose points are the updates (a row kernel's rows the index tensor's positions,
    its columns the width; a loop kernel's points all of them, row-major)."""
    host = _one_producer(planner, g, "the scatter-add")
    if host is None or not (host.kind == "input" or host.is_loop):
        return None  # another kind's results: not this pass's question
    node = next(planner.graph.nodes[m] for m in g.members
                if planner.graph.nodes[m].kind == OpKind.SCATTER)
    if str(ir.ShapedType(node.results[0].type).element_type) != "f32":
        planner.refuse(host, g, "a scatter-add into f16/bf16 (the atomics add f32)")
        return None
    if not reads_in_update_order(s):
        planner.refuse(host, g, "the scatter-add reads its updates in another order")
        return None
    dom = tuple(node.info.domain)
    t_loops, w_loops = token_and_width_loops(s)
    tokens, width = tuple(dom[d] for d in t_loops), tuple(dom[d] for d in w_loops)
    if host.kind == "input":
        if host.row_domain is None:
            return None
        cols = tuple(host.domain[len(host.row_domain):])
        if math.prod(tokens) != math.prod(host.row_domain) or width != cols:
            planner.refuse(host, g, f"the scatter-add's updates are {shape_str(tokens)} of "
                                    f"{shape_str(width)}, not the kernel's "
                                    f"{shape_str(host.row_domain)} rows of {shape_str(cols)}")
            return None
        return host
    if not host.domain or math.prod(host.domain) != math.prod(tokens + width):
        planner.refuse(host, g, f"the scatter-add's updates are {shape_str(tokens + width)}, "
                                f"the loop runs over {shape_str(host.domain)}")
        return None
    return host


def _row_group(planner: Planner, g: Group, node, reduced: int) -> Group | None:
    """The row group ``g`` may join (recording why not where there is a producer to tell)."""
    rows = _one_producer(planner, g, "the column sum")
    if rows is None or not (rows.kind in ("input", "output") or rows.is_loop):
        return None  # another kind's results: not this pass's question
    why = why_not_atomic_sum(node.op)
    if why is not None:
        planner.refuse(rows, g, why)
        return None
    if not reduced and not rows.is_loop:
        planner.refuse(rows, g, "the sum keeps a loop before one it reduces (only a loop "
                                "kernel adds into such a sum)")
        return None
    if rows.kind == "input" and rows.row_domain is not None:
        n_rows = math.prod(rows.row_domain)
        cols = tuple(rows.domain[len(rows.row_domain):])
        what = f"{shape_str(rows.row_domain)} rows"
    elif rows.kind == "output":
        mn = _matmul_rows(planner, rows)
        if mn is None:
            planner.refuse(rows, g, "a matmul with batch dims, several contractions, or "
                                    "a result other than its M x N")
            return None
        n_rows, cols = mn[0], (mn[1],)
        what = f"{n_rows} rows (M)"
    elif rows.is_loop and rows.domain:
        # every point of the loop's domain is one of the sum's, in row-major order (the
        # emitter maps its flat position onto the sum's loops, whichever they reduce)
        if math.prod(rows.domain) != math.prod(node.info.domain):
            planner.refuse(rows, g, f"the sum runs over {shape_str(tuple(node.info.domain))}, "
                                    f"the loop over {shape_str(rows.domain)}")
            return None
        return rows
    else:
        return None  # a row group without rows
    dom = tuple(node.info.domain)
    # a row kernel's sum may keep some row loops after those it reduces (summed over the
    # batch, kept per position); a matmul's reduces all of M
    lead = len(dom) - len(cols) if rows.kind == "input" else reduced
    if not 0 < reduced <= lead or math.prod(dom[:lead]) != n_rows or dom[lead:] != cols:
        planner.refuse(rows, g, f"the sum reduces {shape_str(dom[:reduced])} of "
                                f"{shape_str(dom)}, not the kernel's {what} of {shape_str(cols)}")
        return None
    return rows


def _matmul_rows(planner: Planner, g: Group) -> tuple[int, int] | None:
    """``(M, N)`` of an output group's one contraction when it has no batch dims and its
    result is ``M x N`` in that order (what the matmul emitters' column sums take)."""
    nodes = [planner.graph.nodes[m] for m in g.members if
             planner.graph.nodes[m].kind == OpKind.CONTRACTION]
    if len(nodes) != 1:
        return None
    info = nodes[0].info
    out = info.output_maps[0] if info.output_maps else None
    if out is None or list(info.iterators).count("parallel") != 2 or len(out.results) != 2:
        return None
    dims = [e.maybe_downcast() for e in out.results]
    if not all(isinstance(d, ir.AffineDimExpr) for d in dims):
        return None
    m, n = (d.position for d in dims)
    if info.iterators[m] != "parallel" or info.iterators[n] != "parallel":
        return None
    return info.domain[m], info.domain[n]
