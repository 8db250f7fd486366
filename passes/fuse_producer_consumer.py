"""opfuse-fuse-producer-consumer: injective and broadcast ops join the kernels around them.

Transposes, reshapes, slices, concats and broadcasts only move data, so the kernel that
consumes their result can read their input directly. Four steps, in this order:

1. A producer read by several consumer groups is duplicated into each of them only when
   the model says recomputation beats the round trip: re-reading the producer's inputs
   once per consumer moves fewer bytes than writing its result and reading it back in
   every consumer (``Q_dup < Q_keep``).
2. A producer with a single consumer group is merged into it (guarded); reshapes of
   arguments or constants always (a view is free in the consumer, and as a kernel of its
   own a copy: the guard alone would keep a convolution's reshaped filter apart, a few
   percent of the kernel's bytes).
3. An injective op other than a concat is merged into the group that computes its input
   when it is that group's only reader (a reshape of a kernel's result is done in the
   kernel; a concat would add its other inputs to, say, a matmul kernel's reads), and a
   reshape that is a result of the function into the loop group that computes its input
   even where others read that input too (one more output of the loop's size, not a copy
   kernel).
4. A loop group whose results are read only by injective ops of one loop group joins it
   (``neg`` into the ``cat`` of RoPE's ``rotate_half``, an ``exp`` into the slice of it
   that is used): the kernel computes each element where the injective op reads it, so
   nothing is recomputed, and the intermediate never goes to memory. Consumers first, so
   that a chain of such producers joins one after the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.graph import GROUP_ATTR, FuncGraph, Node, func_graph, functions, value_bytes
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind, forget, forget_graphs, op_key
from opfuse.analysis import ledger

from .common import FusionOptions

NAME = "opfuse-fuse-producer-consumer"
_MOVERS = frozenset({OpKind.INJECTIVE, OpKind.BROADCAST})


@dataclass(frozen=True)
class Options(FusionOptions):
    """Guard thresholds, plus:

    Attributes:
        duplicate: allow duplicating a multi-consumer producer into its consumers.
        max_duplicates: never make more copies of one producer than this.
    """

    duplicate: bool = True
    max_duplicates: int = 8


def run(module: ir.Module, options: Options = Options()) -> None:
    for func_op in functions(module):
        graph = func_graph(func_op)
        if not any(node.kind in _MOVERS for node in graph.nodes):
            continue  # nothing to move: leave the groups as they are
        planner = Planner(graph, NAME, options)
        if options.duplicate:
            planner = _duplicate_all(func_op, planner, options)
        _merge(planner)
        planner.write_back()


def _is_mover(g: Group) -> bool:
    return g.kinds <= _MOVERS


#: Rounds of duplication per function: a chain of movers (collapse -> expand, each with
#: several consumers) needs one round per link, since a duplicated producer changes what
#: its consumers read. Real chains are a few links long.
_MAX_ROUNDS = 8


def _duplicate_all(func_op: ir.Operation, planner: Planner, options: Options) -> Planner:
    """Duplicate movers round by round, re-planning after each round that changed the IR
    (the graph of the round before describes erased ops); returns the current planner."""
    decided: set[int] = set()  # op_key of movers already decided (the ledger has them)
    for _ in range(_MAX_ROUNDS):
        changed, pending = _duplicate_producers(planner, options, decided)
        if not changed and not pending:
            break
        # the IR changed: re-plan; a producer of what was duplicated may now have several
        # consumers itself (a collapse feeding the copies of an expand)
        planner = Planner(func_graph(func_op), NAME, options)
    return planner


def _duplicate_producers(planner: Planner, options: Options,
                         decided: set[int]) -> tuple[bool, bool]:
    """Duplicate multi-consumer movers where the model says so. Returns (whether the IR
    changed, whether a mover was left for the next round because what it reads was
    duplicated in this one)."""
    changed = pending = False
    graph = planner.graph
    stale: set[ir.Value] = set()  # values whose producer or readers this round rewrote
    for node in list(graph.nodes):
        if op_key(node.op) in decided:
            continue
        p = planner.group(node.index)
        if len(p.members) != 1 or not _is_mover(p) or len(node.results) != 1:
            continue
        if any(v in stale for v in node.reads):  # its producer was erased: next round
            pending = True
            continue
        consumers = planner.consumer_groups(p)
        if len(consumers) < 2:
            continue
        v = node.results[0]
        if any(v in graph.nodes[r].gathers for r in graph.readers(v)):
            continue  # a gather reads it whole (in a body or through tensor.extract): one tensor
        out_bytes = value_bytes(v)
        # a mover reads at most one input element per element it writes: a copy of a
        # slice re-reads the slice, not the tensor it is cut from
        in_bytes = min(sum(node.read_bytes(r) for r in node.reads), out_bytes)
        q_keep = out_bytes * (1 + len(consumers))  # write once, read back by every consumer
        q_dup = in_bytes * len(consumers) + (out_bytes if v in graph.returned else 0)
        numbers = {"q_keep": q_keep, "q_dup": q_dup, "copies": len(consumers),
                   "w_extra": node.info.flops * (len(consumers) - 1)}
        decided.add(op_key(node.op))
        ok = q_dup < q_keep and len(consumers) <= options.max_duplicates
        reason = (f"recompute moves {q_dup} B < round trip {q_keep} B" if ok else
                  f"too many consumers ({len(consumers)} > max-duplicates {options.max_duplicates})"
                  if q_dup < q_keep else f"recompute moves {q_dup} B >= round trip {q_keep} B")
        step, would = None, None
        if ok:  # one duplication is one fusion for --fusion-fuel, however many copies
            step = ledger.spend_fuel()
            if step is None:
                ok = False
                reason, would = ledger.fuel_refusal()
        for c in consumers:
            first = graph.nodes[min(r for r in graph.readers(v) if planner.group(r) is c)]
            ledger.record(ledger.Decision(NAME, node.label, first.label,
                                          first.location, ok, reason,
                                          action="duplicate", numbers=numbers,
                                          would_fuse_with=would, step=step or None))
        if ok:
            stale.add(v)
            if v not in graph.returned:
                decided.discard(op_key(node.op))  # erased: its address may be reused
            _clone_into_consumers(node.op, v, consumers, planner)
            changed = True
    return changed, pending


def _clone_into_consumers(op: ir.Operation, v: ir.Value, consumers: list[Group],
                          planner: Planner) -> None:
    graph = planner.graph
    for c in consumers:
        readers = sorted(r for r in graph.readers(v) if planner.group(r) is c)
        first = graph.nodes[readers[0]].op
        with ir.InsertionPoint(first):
            clone = op.clone()
        if GROUP_ATTR in first.attributes:
            clone.attributes[GROUP_ATTR] = first.attributes[GROUP_ATTR]
        for r in readers:
            graph.nodes[r].op.replace_uses_of_with(v, clone.results[0])
    forget_graphs()
    if v not in graph.returned:
        forget(op)
        op.erase()


def _merge(planner: Planner) -> None:
    considered: set[tuple[int, int]] = set()
    for node in planner.graph.nodes:
        p = planner.group(node.index)
        if not _is_mover(p):
            continue
        consumers = planner.consumer_groups(p)
        if len(consumers) == 1 and consumers[0].kind != "opaque":
            c = consumers[0]
            if (p.gid, c.gid) not in considered:
                considered.add((p.gid, c.gid))
                if _views_memory(planner, p) and not planner.evaluate(p, c).fuse:
                    planner.merge_view(p, c, why="merge into consumer")
                else:
                    planner.try_merge(p, c, why="merge into consumer")
            continue
        if consumers or node.kind != OpKind.INJECTIVE or node.op.name == "tensor.concat":
            continue
        # an injective op at the end of the graph: fold it into its only producer group
        producers = planner.producer_groups(p)
        if len(producers) == 1 and producers[0].kind != "opaque":
            q = producers[0]
            if (q.gid, p.gid) in considered:
                continue
            if planner.consumer_groups(q) == [p] or _reshapes_a_loop_result(planner, q, p):
                considered.add((q.gid, p.gid))
                planner.try_merge(q, p, why="merge into producer")
    _merge_into_injective_readers(planner)


def _reshapes_a_loop_result(planner: Planner, q: Group, p: Group) -> bool:
    """``p`` only reshapes a result of loop group ``q`` (which others read too) into a result
    of the function (a training forward saves the attention mask as ``mask[:, None]``):
    the loop kernel writes it as one more output of its size, instead of a kernel copying it."""
    graph = planner.graph
    return (q.is_loop and bool(q.domain)
            and all(graph.nodes[m].op.name in _UNIT_RESHAPES for m in p.members)
            and all(math.prod(ir.ShapedType(v.type).shape) == math.prod(q.domain)
                    for v in p.outputs))


def _views_memory(planner: Planner, p: Group) -> bool:
    """``p`` only reshapes (expand/collapse) function arguments or data constants."""
    graph = planner.graph
    return all(
        graph.nodes[m].op.name in _UNIT_RESHAPES
        and all(graph.producer.get(v) is None or graph.producer[v] in p.members
                for v in graph.nodes[m].reads)
        for m in p.members
    )


def _merge_into_injective_readers(planner: Planner) -> None:
    """Step 4 (module docstring), from the last group to the first."""
    graph = planner.graph
    seen: set[int] = set()
    for node in reversed(graph.nodes):
        p = planner.group(node.index)
        if p.gid in seen or not p.is_loop or not p.outputs:
            continue
        seen.add(p.gid)
        consumers = planner.consumer_groups(p)
        if len(consumers) != 1 or not consumers[0].is_loop:
            continue
        c = consumers[0]
        if any(v in graph.returned for v in p.outputs):
            continue  # a result of p's size next to c's: not one loop kernel
        points = math.prod(c.domain)
        readers = {r for v in p.outputs for r in graph.readers(v)}
        if all(_reads_once(graph, graph.nodes[r], points) for r in readers):
            planner.try_merge(p, c, why="merge into injective reader")


_UNIT_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


def _reads_once(graph: FuncGraph, node: Node, points: int) -> bool:
    """An injective op whose result has one element per point of its kernel: it reads each
    element of its input at most once per kernel. A reshape moves no element, so it reads
    once when all its readers do (a width-1 part of a concat reaches it through the
    expand_shape that opfuse-fold-unit-dims left)."""
    if node.kind != OpKind.INJECTIVE or len(node.results) != 1:
        return False
    t = node.results[0].type
    if not (isinstance(t, ir.ShapedType) and t.has_static_shape):
        return False
    if math.prod(t.shape) == points:
        return True
    readers = graph.readers(node.results[0])
    return (
        node.op.name in _UNIT_RESHAPES
        and bool(readers)
        and node.results[0] not in graph.returned
        and all(_reads_once(graph, graph.nodes[r], points) for r in readers)
    )
