"""opfuse-fuse-columns: a column reduction takes its consumers and its broadcast producers.

A column reduction reduces axes that are not the innermost ones: mean pooling sums a
B x S x H embedding over the sequence S (kept: B x H), a weight norm sums a filter over its
leading axes. opfuse-fuse-reduction fuses such a reduction's producers only ("reduce while
computing"): its consumers need the whole reduction first, and a row kernel does not hold a
column. The column kernel (``backends/gpu/emit/columns.py``) gives each kept point ``k`` to one
thread, which loops over the reduced axes; neighbouring threads read neighbouring
elements, so the loads stay coalesced. Then a thread holds every reduction at its ``k``,
and this pass merges into the reduction's group, each candidate asking the cost guard:

* a loop group over the kept domain K that reads the reduction (``sum / count``): the
  thread computes it at ``k`` from its registers;
* a loop group over the reduction's domain D (``v / ||v||``: the weight norm): the thread
  walks its column a second time;
* a producer group whose results only the column group reads, each through a broadcast
  (the mask count ``m.sum(1).clamp(1)`` of mean pooling, one value per batch row read at
  every hidden unit, and the mask cast it shares with the embedding product): the thread
  computes the values it reads again, so the merge is judged in time by
  ``cost.recompute_guard`` (its flops at every point it is read against its round trip
  through memory and its launch), like opfuse-fuse-recompute's copies.

Every group holding a column reduction is given kind ``columns`` (kept in ``opfuse.kind``),
merged or not, so the GPU backend builds it with the column emitter; the CPU backend lowers
it like any group. Runs after opfuse-fuse-reduction (which builds the groups of producers
and the row kernels) and before opfuse-fuse-epilogue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.graph import Node
from opfuse.analysis.opinfo import OpKind

from .common import FusionOptions, plan_each_function, shape_str
from .fuse_recompute import copy_group, read_repeatedly

NAME = "opfuse-fuse-columns"
KIND = "columns"

#: Group kinds that may be recomputed inside a column kernel: loop groups and reductions
#: (the column emitter computes any reduction it reads sequentially, at the thread's point).
_PRODUCER_KINDS = ("loop", "input")


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_each_function(module, NAME, options, _plan)


def column_root(planner: Planner, g: Group) -> Node | None:
    """The reduction that makes ``g`` a column group: its largest reduction (by points),
    when that one keeps an axis after a reduced one (not a row reduction: row kernels are
    opfuse-fuse-reduction's); None otherwise."""
    if g.kind not in ("input", KIND):
        return None
    nodes = [planner.graph.nodes[m] for m in g.members]
    reductions = [n for n in nodes if n.kind == OpKind.REDUCTION]
    if not reductions:
        return None
    root = max(reductions, key=lambda n: (n.info.points, -n.index))
    its = root.info.iterators
    first_reduced = its.index("reduction")
    return root if "parallel" in its[first_reduced:] else None


def kept_domain(root: Node) -> tuple[int, ...]:
    """The kept (parallel) loop sizes of a reduction, in loop order: its result's points."""
    return tuple(d for d, it in zip(root.info.domain, root.info.iterators) if it == "parallel")


def _plan(planner: Planner) -> None:
    tried: set[tuple[int, int]] = set()
    for g in list(planner.groups()):
        if planner.find(g.gid) != g.gid or column_root(planner, g) is None:
            continue
        while _grow(planner, planner.group(g.gid), tried):
            pass
        planner.group(g.gid).forced_kind = KIND


def _grow(planner: Planner, g: Group, tried: set[tuple[int, int]]) -> bool:
    """One merge into column group ``g`` (a consumer, else a broadcast producer); whether
    one was made."""
    root = column_root(planner, g)
    if root is None:
        return False
    kept, full = kept_domain(root), tuple(root.info.domain)
    for d in planner.consumer_groups(g):
        if (g.gid, d.gid) in tried:
            continue
        tried.add((g.gid, d.gid))
        if not d.is_loop:
            planner.refuse(g, d, f"the consumer is an '{d.kind}' group, not a loop group")
            continue
        if d.domain not in (kept, full):
            planner.refuse(g, d, f"consumer iterates over {shape_str(d.domain)}, not over the "
                                 f"columns' results {shape_str(kept)} or their domain {shape_str(full)}")
            continue
        if planner.try_merge(g, d, why="after column reduction"):
            return True
    for p in planner.producer_groups(g):
        if (p.gid, g.gid) in tried:
            continue
        tried.add((p.gid, g.gid))
        why_not = _why_not_recomputed(planner, p, g)
        if why_not is not None:
            planner.refuse(p, g, why_not)
            continue
        flops = copy_group(p, g).flops
        if planner.try_merge_recomputed(p, g, flops_fused=flops, why="recomputed in columns"):
            return True
    return False


def _why_not_recomputed(planner: Planner, p: Group, g: Group) -> str | None:
    """None when column group ``g`` may compute producer ``p`` again where it reads it:
    ``p`` is a loop or reduction group, nothing but ``g`` reads its results, and ``g``
    reads each of them at several of its points (a broadcast)."""
    if p.kind not in _PRODUCER_KINDS:
        return f"a '{p.kind}' group is not recomputed in a column kernel"
    graph = planner.graph
    for v in p.outputs:
        if v in graph.returned or any(planner.group(r) not in (p, g) for r in graph.readers(v)):
            return f"{_label(planner, v)} is also read outside the column kernel"
        if not read_repeatedly(planner, g, v):
            return (f"{_label(planner, v)} is read once per point, not through a broadcast "
                    "(not recomputation)")
        if any(planner.group(r) is g and v in graph.nodes[r].gathers for r in graph.readers(v)):
            return f"{_label(planner, v)} is gathered (read at data-dependent positions)"
    if math.prod(p.domain) >= math.prod(g.domain):
        return f"producer iterates over {shape_str(p.domain)}, no fewer points than the columns"
    return None


def _label(planner: Planner, v: ir.Value) -> str:
    i = planner.graph.producer.get(v)
    return planner.graph.nodes[i].label if i is not None else "an argument"
