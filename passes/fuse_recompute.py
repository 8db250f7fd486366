"""opfuse-fuse-recompute: a cheap producer read through a broadcast is recomputed inside
its consumers.

A loop group ``P`` whose result a larger loop or reduction group ``C`` reads through a
broadcasting map (position ids ``arange + past_length`` read by the position embedding at
every hidden unit, a 1x8x32 position embedding added to a 2x8x32 token embedding, a 1x1x8x8
causal mask and-ed with a 2x1x1x8 padding mask into 2x1x8x8) cannot join ``C`` as an
elementwise producer over the same iteration space (opfuse-fuse-elementwise refuses:
"iteration spaces differ"): ``C`` needs each value of ``P`` at several of its own points.
XLA and Inductor fuse it anyway by computing ``P``'s value again at every point of ``C``
that reads it; this pass does the same when the cost model says so
(``cost.recompute_guard``): the recomputed flops ``W`` against the round trip of ``P``'s
result through memory and ``P``'s launch, in time.

``P``'s ops are cloned into each consumer ``C`` that reads it through a broadcast (they join
``C``'s group, so the emitters evaluate them per point of ``C``), and ``P`` itself is erased
when nothing else reads it; when other ops still read it (or it is returned), ``P`` stays a
kernel and the copies are duplication, judged with ``P``'s kernel kept. One candidate at a
time, the producer latest in the function first, so a chain of such producers (position ids
into the position embedding into the embedding sum) folds into the last consumer one after
the other; the groups are re-planned from the IR after every rewrite.

Runs after the other fusion passes, on their final groups: a row reduction has claimed the
values it broadcasts (``x - mean``) and a matmul its epilogue, so what is left as a small
loop group next to a larger kernel is exactly what only recomputation can fuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir

from opfuse import cost
from opfuse.analysis.graph import GROUP_ATTR, KIND_ATTR, func_graph, functions
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import forget, forget_graphs, op_key
from opfuse.analysis import ledger

from .common import FusionOptions
from .recompute_gathered import dim_of, gathered_cost, gathered_producer, inline_into_gathers

NAME = "opfuse-fuse-recompute"

#: The group kinds a producer may be recomputed into: their emitters evaluate an in-group
#: producer at every point they need it (loop kernels, and the elementwise prologue of a
#: row reduction).
_CONSUMER_KINDS = ("loop", "input")

#: Ops that only rename ``v``'s elements: whoever reads their result reads ``v``.
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape")

#: Rewrites per function; each removes or duplicates one producer group. Real programs have
#: a handful of broadcast producers (position ids, position embeddings, mask pieces).
_MAX_REWRITES = 64


@dataclass(frozen=True)
class Options(FusionOptions):
    """Guard thresholds, plus:

    Attributes:
        max_copies: never recompute one producer in more consumers than this while it also
            stays a kernel of its own (or in more than this many consumers at all).
    """

    max_copies: int = 8


def run(module: ir.Module, options: Options = Options()) -> None:
    for func_op in functions(module):
        planner = recompute_all(func_op, Planner(func_graph(func_op), NAME, options), options)
        planner.write_back()


def recompute_all(func_op: ir.Operation, planner: Planner, options: Options) -> Planner:
    """Recompute broadcast producers of ``func_op`` where the guard says so; returns the
    planner of the function as it is afterwards."""
    decided: set[int] = set()  # op_key of the last member of producers already judged
    for _ in range(_MAX_REWRITES):
        found = _next_candidate(planner, decided)
        if found is None:
            break
        p, targets, gathered = found
        decided.add(op_key(planner.graph.nodes[p.last].op))
        if _decide(planner, p, targets, gathered, options):
            if gathered is None:
                _rewrite(func_op, planner, p, targets)
            else:
                inline_into_gathers(planner, p, gathered, targets)
            planner = Planner(func_graph(func_op), NAME, options)
    return planner


def _points(domain: tuple[int, ...]) -> int:
    return math.prod(domain) if domain else 1


def _next_candidate(planner: Planner, decided: set[int]
                    ) -> tuple[Group, list[Group], ir.Value | None] | None:
    """The latest loop group not yet judged that larger groups read through a broadcast, or
    that gathers read and that can be computed at the gathered positions (the value they
    gather), with those consumers."""
    graph = planner.graph
    for p in sorted(planner.groups(), key=lambda g: g.last, reverse=True):
        if p.kind != "loop" or not p.outputs or op_key(graph.nodes[p.last].op) in decided:
            continue
        gathered = gathered_producer(planner, p)
        if gathered is not None:
            targets = [planner.group(r) for r in graph.readers(gathered)
                       if gathered in graph.nodes[r].gathers]
            return p, list({id(c): c for c in targets}.values()), gathered
        targets = [c for c in planner.consumer_groups(p) if _reads_through_broadcast(planner, p, c)]
        clonable = []
        for c in targets:
            first = _first_reader(planner, p, c)
            if _clonable_before(planner, p, first):
                clonable.append(c)
            else:
                planner.refuse(p, c, f"{graph.nodes[p.last].label} reads values defined "
                                     f"after its first reader {graph.nodes[first].label}: "
                                     "no copy can go there")
        if clonable:
            return p, clonable, None
        if targets:
            decided.add(op_key(graph.nodes[p.last].op))  # refused once, not again
    return None


def _clonable_before(planner: Planner, p: Group, first: int) -> bool:
    """Whether ``p``'s ops can be cloned in front of node ``first`` (where ``_rewrite`` puts
    the copies): every value they read from outside ``p`` (their ``tensor.empty`` inits
    included) is defined before it. A member of ``p`` after ``first`` reads values defined
    after it (Adam's step, where one parameter's update reads the bias corrections that
    the next parameter's also reads); cloned in front of ``first``, it would read them
    before their definition."""
    graph = planner.graph
    where = graph.nodes[first].op
    inside = {graph.nodes[m].op for m in p.members}
    for m in p.members:
        for v in graph.nodes[m].op.operands:
            owner = v.owner
            if not isinstance(owner, (ir.Operation, ir.OpView)):
                continue  # a block argument: defined before every op of the block
            owner = owner.operation
            if owner in inside or owner.parent != where.parent:
                continue
            if not owner.is_before_in_block(where):
                return False
    return True


def _reads_through_broadcast(planner: Planner, p: Group, c: Group) -> bool:
    """Whether ``c`` can take a copy of ``p``: a loop or reduction group over more points
    than ``p``'s that reads some element of ``p``'s results at several of its points
    (``read_repeatedly``: what only recomputation can fuse; a concat or a slice reading a
    small part once is the other passes' and their byte guard's business), as operands (a
    gather's body reading them at data-dependent positions needs them whole), and gathering
    nothing ``c`` computes."""
    if c.kind not in _CONSUMER_KINDS or _points(c.domain) <= _points(p.domain):
        return False
    graph = planner.graph
    for v in p.outputs:
        if any(planner.group(r) is c and v in graph.nodes[r].gathers for r in graph.readers(v)):
            return False
    return any(read_repeatedly(planner, c, v) for v in p.outputs) and planner.gather_via(c, p) is None


def read_repeatedly(planner: Planner, c: Group, v: ir.Value, depth: int = 0) -> bool:
    """Whether ops of ``c`` read some element of ``v`` at more than one point of ``c``: a
    linalg op through a map without some loop dim (a broadcast) or over fewer points than
    ``c`` (a copy recomputed at each of ``c``'s points), an op that takes ``v`` twice
    (``concat([a, a])``), or the same through a reshape of ``v``."""
    graph = planner.graph
    for r in graph.readers(v):
        node = graph.nodes[r]
        if planner.group(r) is not c:
            continue
        maps = node.info.input_maps
        if maps:
            if _points(node.info.domain) < _points(c.domain):
                return True
            for operand, m in zip(list(node.op.operands)[:len(maps)], maps):
                if operand == v and m is not None and \
                        len({d for d in map(dim_of, m.results) if d is not None}) < m.n_dims:
                    return True
        elif sum(1 for o in node.op.operands if o == v) > 1:
            return True
        elif node.op.name in _RESHAPES and depth < 4 and \
                read_repeatedly(planner, c, node.op.results[0], depth + 1):
            return True
    return False


def copy_group(p: Group, c: Group) -> Group:
    """``c`` with a copy of ``p`` inside: it reads ``p``'s inputs instead of its results and
    computes ``p`` at each of its points (the registers and bytes of that kernel)."""
    reads = {v: b for v, b in c.reads.items() if v not in p.outputs}
    for v, b in p.reads.items():
        reads[v] = max(b, reads.get(v, 0))
    scale = _points(c.domain) / max(1, _points(p.domain))
    k = sum(1 for v in p.outputs if v in c.reads)
    return Group(c.gid, [], reads, dict(c.outputs), c.flops + round(p.flops * scale),
                 max(p.peak, c.peak + k), max(p.elem_bytes, c.elem_bytes), p.kinds | c.kinds,
                 domain=c.domain)


def _decide(planner: Planner, p: Group, targets: list[Group], gathered: ir.Value | None,
            options: Options) -> bool:
    """Ask the guard about recomputing ``p`` in every group of ``targets`` (one candidate);
    records one ledger entry per target."""
    graph = planner.graph
    others = [c for c in planner.consumer_groups(p) if c not in targets]
    kept = bool(others) or any(v in graph.returned for v in p.outputs)
    before = [(p.q, p.flops)] + [(c.q, c.flops) for c in targets]
    if gathered is None:
        copies = [copy_group(p, c) for c in targets]
        after = [(g.q, g.flops) for g in copies]
        r_fused = max(g.registers() for g in copies)
    else:  # the gathers' kernels read p's inputs instead, and compute p's payload
        after = [gathered_cost(planner, p, gathered, c) for c in targets]
        r_fused = max(c.registers() + p.peak for c in targets)
    after = ([(p.q, p.flops)] if kept else []) + after
    verdict = cost.recompute_guard(r_fused, before, after, options)
    verdict.numbers.update(copies=len(targets), producer_kept=int(kept))
    if verdict.fuse and len(targets) > options.max_copies:
        verdict.fuse = False
        verdict.reason = f"too many consumers ({len(targets)} > max-copies {options.max_copies})"
    step = None
    if verdict.fuse:  # one recomputation is one fusion for --fusion-fuel, however many copies
        step = ledger.spend_fuel()
        if step is None:
            verdict.fuse = False
            verdict.reason, verdict.would_fuse_with = ledger.fuel_refusal()
    producer = graph.nodes[p.last].label
    for c in targets:
        first = graph.nodes[_first_reader(planner, p, c)]
        ledger.record(ledger.Decision(NAME, producer, first.label, first.location,
                                      verdict.fuse, verdict.reason, action="recompute",
                                      numbers=dict(verdict.numbers),
                                      would_fuse_with=verdict.would_fuse_with, step=step or None))
    return verdict.fuse


def _first_reader(planner: Planner, p: Group, c: Group) -> int:
    return min(r for v in p.outputs for r in planner.graph.readers(v) if planner.group(r) is c)


def _rewrite(func_op: ir.Operation, planner: Planner, p: Group, targets: list[Group]) -> None:
    """Clone ``p``'s ops in front of each target's first reader, into its group; erase
    ``p`` if nothing reads it any more."""
    graph = planner.graph
    planner.write_back()  # the current groups, so that the copies can join by attribute
    i64 = ir.IntegerType.get_signless(64, func_op.context)
    next_gid = 1 + max((n.op.attributes[GROUP_ATTR].value for n in graph.nodes
                        if GROUP_ATTR in n.op.attributes), default=-1)
    members = [graph.nodes[m].op for m in sorted(p.members)]
    for c in targets:
        first = graph.nodes[_first_reader(planner, p, c)].op
        anchor = graph.nodes[min(c.members)].op
        if GROUP_ATTR not in anchor.attributes:  # a single op: give it a group to join
            anchor.attributes[GROUP_ATTR] = ir.IntegerAttr.get(i64, next_gid)
            next_gid += 1
        gid = anchor.attributes[GROUP_ATTR]
        mapping: dict[ir.Value, ir.Value] = {}
        with ir.InsertionPoint(first):
            for op in members:
                clone = op.clone().operation
                for old, new in mapping.items():
                    clone.replace_uses_of_with(old, new)
                clone.attributes[GROUP_ATTR] = gid
                if KIND_ATTR in clone.attributes:
                    del clone.attributes[KIND_ATTR]
                mapping.update(zip(op.results, clone.results))
        for m in c.members:
            for old, new in mapping.items():
                graph.nodes[m].op.replace_uses_of_with(old, new)
    forget_graphs()
    for op in reversed(members):  # users first: each op is dead once its readers are gone
        if not any(True for v in op.results for _ in v.uses):
            forget(op)
            op.erase()
