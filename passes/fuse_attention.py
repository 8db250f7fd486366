"""opfuse-fuse-attention: Q·Kᵀ → scale/masks → row softmax → P·V as one ``attention`` kernel.

FlashAttention's fusion, decided by the cost guard like every other merge. Unfused (or
fused by the earlier passes) attention is three kernels, and the scores S and the
probabilities P — batch × heads × queries × keys, quadratic in the sequence — go through
device memory between them:

    Q_unfused = Q_QK + Q_S + Q_PV        Q_fused = Q_QK + Q_PV        Q_saved = Q_S

where Q_QK reads Q and K, Q_PV reads V (and any mask) and writes O. The attention kernel
computes S a tile at a time, keeps the running row max and sum (online softmax) and the
P·V accumulators on chip, so S and P never reach memory.

The subgraph is recognized structurally (``opfuse.analysis.attention``): the softmax that
``P @ V`` reads, its scores read pointwise from ``Q @ Kᵀ``, whatever reshapes, transposes,
broadcasts (grouped-query heads), scales and masks sit in between. The groups holding the
pattern's ops merge into one; a group holding only mask computations (iota, comparisons)
joins when nothing else reads it (a mask shared by several layers stays a tensor the
kernels read). Refused, with the reason in the ledger: a value between Q·Kᵀ and P·V that
something else reads too (S, P or the softmax statistics would have to be written: the
kernel writes only O), a merge that would make the kernel graph cyclic, and whatever the
guard says no to.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse import cost
from opfuse.analysis.attention import match
from opfuse.analysis.graph import FuncGraph
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind, tensor_bytes

from .common import FusionOptions, plan_with_twins

NAME = "opfuse-fuse-attention"
KIND = "attention"


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_with_twins(module, NAME, options, _plan)


def _plan(planner: Planner, twin) -> None:
    graph = planner.graph
    index_of = {n.op: n.index for n in graph.nodes}
    for node in graph.nodes:
        if node.kind != OpKind.CONTRACTION:
            continue
        found = match(node.op, twin)
        if found is None:
            continue
        if isinstance(found, str):
            planner.refuse(planner.group(node.index), planner.group(node.index), found)
            continue
        qk = index_of.get(found.qk.op)
        if qk is None or planner.group(qk) is planner.group(node.index):
            continue  # already one kernel
        pattern = {index_of[op] for op in found.ops if op in index_of}
        groups = _groups(planner, pattern, qk)
        groups += _views_around(planner, groups)
        allowed = _downstream(graph, node.index, {m for g in groups for m in g.members})
        q_s = _q_s(planner, groups)
        note = f"Q_S {q_s} B stays on chip"
        if found.causal is not None:
            note += f", causal: keys > query + {found.causal} skipped"
        planner.try_merge_set(
            groups,
            why="attention",
            producer=graph.nodes[qk],
            consumer=node,
            kind=KIND,
            registers=cost.attention_registers(
                max(found.head_dim, found.value_dim), _pointers(groups), planner.options.target
            ),
            check=lambda merged: _escapes(planner, merged, allowed),
            numbers={"q_s": q_s, "head_dim": found.head_dim, "value_dim": found.value_dim,
                     **({"causal_offset": found.causal} if found.causal is not None else {})},
            note=note,
        )


def _groups(planner: Planner, pattern: set[int], qk: int) -> list[Group]:
    """The groups to merge: every group holding an op that depends on Q·Kᵀ's result, and
    the groups of the pattern's other ops (masks) that only the pattern reads."""
    graph = planner.graph
    core = _downstream(graph, qk, pattern)
    groups = {planner.group(i).gid: planner.group(i) for i in core}
    members = {m for g in groups.values() for m in g.members}
    for i in sorted(pattern - core):
        g = planner.group(i)
        if g.gid in groups:
            continue
        readers = {r for v in g.outputs for r in graph.readers(v)}
        if readers <= pattern | members and not any(v in graph.returned for v in g.outputs):
            groups[g.gid] = g
    return list(groups.values())


_MOVES = frozenset({OpKind.INJECTIVE, OpKind.BROADCAST})
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


def _views_around(planner: Planner, groups: list[Group]) -> list[Group]:
    """Groups of pure data movement next to the attention that the earlier passes left
    apart (the guard found a view's copy not worth a merge on its own): producers of Q, K
    or V (transposes, head splits, grouped-query broadcasts) read only by the attention,
    and reshapes of its result or pointwise ops reading only it (casts). The kernel reads
    through them and writes O once."""
    graph = planner.graph
    members = {m for g in groups for m in g.members}
    extra: dict[int, Group] = {}
    changed = True
    while changed:
        changed = False
        for g in [planner.group(p) for m in members for v in graph.nodes[m].reads
                  if (p := graph.producer.get(v)) is not None and p not in members]:
            if g.gid in extra or not g.kinds <= _MOVES:
                continue
            if any(v in graph.returned for v in g.outputs):
                continue
            if all(r in members for v in g.outputs for r in graph.readers(v)):
                extra[g.gid] = g
                members |= set(g.members)
                changed = True
        for g in [planner.group(r) for m in members for v in graph.nodes[m].results
                  for r in graph.readers(v) if r not in members]:
            if g.gid in extra or not all(_epilogue_op(graph.nodes[m]) for m in g.members):
                continue
            if all(graph.producer.get(v) in members for v in g.reads):
                extra[g.gid] = g
                members |= set(g.members)
                changed = True
    return list(extra.values())


def _epilogue_op(node) -> bool:
    """A reshape of the result, or a pointwise op on it: the output cast that the unit-dim
    fold leaves behind a collapse_shape (``1x3x64`` P·V, collapsed, rounded to bf16), which
    the epilogue pass could not reach through the reshape."""
    return node.op.name in _RESHAPES or node.kind == OpKind.ELEMENTWISE


def _downstream(graph: FuncGraph, start: int, within: set[int]) -> set[int]:
    """``start`` and the nodes of ``within`` that read its results, transitively."""
    seen, stack = {start}, [start]
    while stack:
        for u in graph.nodes[stack.pop()].users:
            if u in within and u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def _escapes(planner: Planner, merged: Group, allowed: set[int]) -> str | None:
    """Why the merged group cannot be one attention kernel: a value it would have to
    write other than P·V's result (or what is computed from it)."""
    graph = planner.graph
    for v in merged.outputs:
        p = graph.producer.get(v)
        if p in allowed:
            continue
        label = graph.nodes[p].label if p is not None else "an argument"
        outside = [graph.nodes[r].label for r in graph.readers(v) if planner.group(r) is not merged]
        where = f"also read by {outside[0]}" if outside else "also returned"
        return (f"{label} is {where}: the attention kernel keeps S and P on chip and writes "
                "only its result")
    return None


def _pointers(groups: list[Group]) -> int:
    reads = {v for g in groups for v in g.reads}
    outputs = {v for g in groups for v in g.outputs}
    return len(reads - outputs) + 1


def _q_s(planner: Planner, groups: list[Group]) -> int:
    """Q_S: the bytes the unfused kernels move through memory between Q·Kᵀ and P·V (each
    intermediate written once and read by each kernel that reads it)."""
    members = {m for g in groups for m in g.members}
    total = 0
    for g in groups:
        for v in g.outputs:
            readers = {planner.group(r).gid for r in planner.graph.readers(v) if r in members}
            readers.discard(g.gid)
            if readers:  # an intermediate: written once, read by each kernel reading it
                total += tensor_bytes(v.type) * (1 + len(readers))
    return total
