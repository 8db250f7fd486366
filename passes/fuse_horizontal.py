"""opfuse-fuse-horizontal: sibling matmuls that read the same LHS become one kernel.

The Transformer's Q, K and V projections (and SwiGLU's ``x @ W1`` and ``x @ W3``) are
separate matmuls over one input: unfused, each kernel reads the LHS again and each is a
launch. Fused, one kernel covers the concatenation of their N ranges, each N tile reading
its own weight (no weight is copied or concatenated at run time) and applying its own
epilogue; where an epilogue reads both siblings at the same point (SwiGLU's
``silu(x @ W1) * (x @ W3)``), one tile computes both and applies it (backends/gpu/emit/horizontal.py).
The CPU backend runs the group as one function.

Candidates: contractions in matmul ("output") groups with one contraction each, whose LHS
is the same tensor read the same way (followed through reshapes: ``x.view(b * t, d)``
written once per projection is one LHS) with the same M, K and batch loops, and where
neither contraction depends on the other (the epilogue of one may read the other: that
is the SwiGLU product). The cost guard decides the set of siblings as one candidate, like
every other merge: R_fused (one more set of accumulators for a paired sibling, a pointer
per weight), and the saving on bytes — the LHS read once instead of k times — with k - 1
launches fewer in T_saved. One ledger entry per set (first -> last sibling), and one per
sibling left out with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse import cost
from opfuse.analysis.attention import _Trees, contraction
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.indexing import compose
from opfuse.analysis.opinfo import OpKind

from .common import FusionOptions, plan_with_twins

NAME = "opfuse-fuse-horizontal"
KIND = "horizontal"
#: Accumulators a paired sibling adds per thread (the SIMT tile: 4 x 4).
PAIRED_REGS = 16


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_with_twins(module, NAME, options, _plan)


def _plan(planner: Planner, twin) -> None:
    graph = planner.graph
    siblings: dict[tuple, list[int]] = {}
    for node in graph.nodes:
        if node.kind != OpKind.CONTRACTION:
            continue
        key = _lhs_key(node.op, twin)
        if key is not None:
            siblings.setdefault(key, []).append(node.index)
    for nodes in siblings.values():
        if len(nodes) < 2:
            continue
        first = nodes[0]
        chosen = [first]
        for other in nodes[1:]:
            p, c = planner.group(first), planner.group(other)
            if p is c:
                continue
            why_not = next(filter(None, (_independent(planner, m, other) for m in chosen)), None)
            if why_not is None and not (_single_matmul(planner, p) and _single_matmul(planner, c)):
                why_not = f"{graph.nodes[other].label}'s kernel is not one matmul with its epilogue"
            if why_not is not None:
                planner.try_merge_set([p, c], why="horizontal", producer=graph.nodes[first],
                                      consumer=graph.nodes[other], kind=KIND,
                                      check=lambda _, w=why_not: w)
                continue
            chosen.append(other)
        if len(chosen) < 2:
            continue
        # one candidate for the whole set: the LHS read once instead of k times, k - 1
        # launches fewer (the guard's delta on the set's bytes, like every other merge)
        groups = [planner.group(i) for i in chosen]
        paired = any(_reads_each_other(planner, a, b)
                     for n, a in enumerate(groups) for b in groups[n + 1:])
        registers = max(g.registers() for g in groups) + (PAIRED_REGS if paired else 0)
        registers += cost.REGS_PER_POINTER * sum(len(g.reads) for g in groups[1:])
        lhs_bytes = sum(b for g in groups[1:] for v, b in groups[0].reads.items() if v in g.reads)
        planner.try_merge_set(
            groups, why="horizontal", producer=graph.nodes[first],
            consumer=graph.nodes[chosen[-1]], kind=KIND, registers=registers,
            numbers={"lhs_bytes_saved": lhs_bytes, "siblings": len(groups)},
            note=f"{len(groups)} siblings, one LHS read"
            + (", the siblings' product in one tile" if paired else ""),
        )


def _lhs_key(op: ir.Operation, twin) -> tuple | None:
    """What makes two contractions siblings: the tensor their LHS reads (through views)
    and how (the index at a symbolic (batch, m, k) point), M, K and the batch loops."""
    c = contraction(op, twin(op))
    if c is None:
        return None
    ctx = op.context
    with ctx:
        dims = [ir.AffineDimExpr.get(i) for i in range(len(c.dom))]
    idx = compose(c.maps[0], dims, len(dims), ctx)
    base, idx = _Trees(twin, len(dims), ctx).through_views(op.operands[0], idx)
    batch = tuple(c.dom[b] for b in c.batch)
    roles = tuple(str(dims[i]) for i in (*c.batch, c.m, c.k))
    return (base, tuple(str(e) for e in idx), roles, c.dom[c.m], c.dom[c.k], batch,
            str(ir.ShapedType(op.operands[0].type).element_type))


def _single_matmul(planner: Planner, g: Group) -> bool:
    """One matmul with its epilogue, and no column sum of its result (opfuse-fuse-column-sums:
    the horizontal kernels do not add into sums)."""
    kinds = [planner.graph.nodes[m].kind for m in g.members]
    return (g.kind == "output" and kinds.count(OpKind.CONTRACTION) == 1
            and OpKind.REDUCTION not in kinds)


def _independent(planner: Planner, a: int, b: int) -> str | None:
    """Why matmuls ``a`` and ``b`` cannot run side by side: one's operands depend on the
    other's result."""
    graph = planner.graph
    for x, y in ((a, b), (b, a)):
        seen, stack = {x}, [x]
        while stack:
            for u in graph.nodes[stack.pop()].users:
                if u == y:
                    return f"{graph.nodes[y].label} depends on {graph.nodes[x].label}"
                if u not in seen and u < y:  # edges go forward: nothing after y reaches it
                    seen.add(u)
                    stack.append(u)
    return None


def _reads_each_other(planner: Planner, p: Group, c: Group) -> bool:
    """One group's epilogue reads the other's results (SwiGLU): one tile computes both."""
    return any(v in c.reads for v in p.outputs) or any(v in p.reads for v in c.outputs)
