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

A view of the kernel's inputs that is also returned or read elsewhere — a decoder's
permuted K and V, returned as its KV cache — does not stop the merge: the attention kernel
reads through its own view of them, and a copy of the view's ops outside it (one loop
kernel per layer and shape) writes the returned tensor. The guard counts what that copy
reads again in Q_fused and its launch against the launches saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse import cost
from opfuse.analysis.attention import match
from opfuse.analysis.graph import GROUP_ATTR, KIND_ATTR, FuncGraph, Node
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import LOOP_KINDS, OpKind, forget_graphs, op_key, tensor_bytes

from .common import FusionOptions, plan_with_twins

NAME = "opfuse-fuse-attention"
KIND = "attention"


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    copies: list[_CopyOut] = []
    plan_with_twins(module, NAME, options, lambda planner, twin: _plan(planner, twin, copies))
    for copy in copies:  # after write_back: the attention groups are in the IR
        _copy_out(copy)


@dataclass
class _CopyOut:
    """Views an attention group computes from its inputs that are also read outside it:
    ``chain`` (the group's mover ops that compute ``values``, in block order) is cloned
    outside the group for the readers outside it."""

    func: ir.Operation
    chain: list[ir.Operation]
    values: list[ir.Value]


def _plan(planner: Planner, twin, copies: list[_CopyOut]) -> None:
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
        why_not, views = _escapes(planner, groups, allowed)
        copy_cost = _copy_cost(planner, views)
        fused = planner.try_merge_set(
            groups,
            why="attention",
            producer=graph.nodes[qk],
            consumer=node,
            kind=KIND,
            registers=cost.attention_registers(
                max(found.head_dim, found.value_dim), _pointers(groups), planner.options.target
            ),
            check=lambda merged: why_not,
            beside=lambda merged: copy_cost[:2],
            numbers={"q_s": q_s, "head_dim": found.head_dim, "value_dim": found.value_dim,
                     **({"causal_offset": found.causal} if found.causal is not None else {}),
                     **({"q_copy": copy_cost[1] + copy_cost[2]} if views else {})},
            note=note + _copy_note(planner, views),
        )
        if fused:
            copies += [_CopyOut(graph.func, [graph.nodes[i].op for i in chain], values)
                       for chain, values in _copy_sets(planner, views)]
            _prologues(planner, node, found, {i for chain in views.values() for i in chain})


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


#: What a prologue candidate may hold (a reduction only to say why it is refused).
_PROLOGUE_KINDS = LOOP_KINDS | {OpKind.REDUCTION}


def _prologues(planner: Planner, pv: Node, found, copied: set[int]) -> None:
    """Take in, each as its own guard candidate, the groups that compute the attention's
    Q or K pointwise from other tensors (the rotary embedding: ``q * cos +
    rotate_half(q) * sin`` on the projection's heads) and that only the attention reads.
    The kernels evaluate such a prologue while they stage Q (once per query block) or a
    K tile, so its result never goes through device memory: the guard sees the write and
    read of the rotated Q or K saved. Left apart: a prologue whose result is returned or
    read elsewhere (a KV cache holding the rotated K), one on V's side (the kernels stage
    V as a view), one that reduces or gathers, one feeding a view the attention copies
    out (its chain would read a value the kernel does not write)."""
    graph = planner.graph
    v_side = _upstream(graph, pv.op.operands[1])
    tried: set[int] = set()
    while True:
        att = planner.group(pv.index)
        candidates = [g for g in planner.producer_groups(att) if g.gid not in tried
                      and OpKind.ELEMENTWISE in g.kinds and g.kinds <= _PROLOGUE_KINDS]
        if not candidates:
            return
        g = candidates[0]
        tried.add(g.gid)
        why_not = _prologue_refusal(planner, g, att, v_side, copied)
        numbers, note = {}, ""
        if why_not is None:
            operand = next(iter(g.outputs))
            side = "K" if _feeds(graph, operand, found.qk.op.operands[1]) else "Q"
            reread = cost.prologue_l2_rereads(sum(g.reads.values()), tensor_bytes(operand.type),
                                              _reads_per_element(planner, found, operand))
            numbers = {"prologue": side, "l2_reread": reread}
            note = f"{side} prologue: {side} computed where the kernel stages it, never written"
            if reread:
                note += (f"; the GPU kernel recomputes it for each query block: {reread} B more "
                         "read from L2, not from device memory, which is what the guard counts")
        planner.try_merge_set(
            [g, att],
            why="attention prologue",
            producer=graph.nodes[g.last],
            consumer=pv,
            kind=KIND,
            registers=cost.attention_registers(
                max(found.head_dim, found.value_dim), _pointers([g, att]),
                planner.options.target, prologue_live=len(g.reads) + g.peak),
            check=lambda merged, why_not=why_not: why_not,
            numbers=numbers,
            note=note,
        )


def _prologue_refusal(planner: Planner, g: Group, att: Group, v_side: set[int],
                      copied: set[int]) -> str | None:
    graph = planner.graph
    label = graph.nodes[g.last].label
    if OpKind.REDUCTION in g.kinds:
        return f"{label} reduces: no pointwise prologue of the attention"
    if any(graph.nodes[m].gathers for m in g.members):
        return f"{label} gathers: no pointwise prologue of the attention"
    if any(v in graph.returned for v in g.outputs):
        return f"{label} is also returned: the attention kernel writes only its result"
    outside = [graph.nodes[r].label for v in g.outputs for r in graph.readers(v)
               if r not in att.members]
    if outside:
        return f"{label} is also read by {outside[0]}: the attention kernel writes only its result"
    if len(g.outputs) != 1:
        return f"{label} computes {len(g.outputs)} operands of the attention (a prologue computes one)"
    if set(g.members) & v_side:
        return f"{label} computes V (the kernels stage V as a view of its input)"
    views = [graph.nodes[r].label for v in g.outputs for r in graph.readers(v) if r in copied]
    if views:
        return (f"{label} is also returned or read elsewhere through {views[0]}, which the "
                "attention copies out: the kernel writes only its result")
    return None


def _upstream(graph: FuncGraph, value: ir.Value) -> set[int]:
    """The nodes ``value`` is computed from, transitively."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        p = graph.producer.get(stack.pop())
        if p is not None and p not in seen:
            seen.add(p)
            stack += list(graph.nodes[p].reads)
    return seen


def _feeds(graph: FuncGraph, value: ir.Value, operand: ir.Value) -> bool:
    p = graph.producer.get(value)
    return p is not None and p in _upstream(graph, operand)


def _reads_per_element(planner: Planner, found, operand: ir.Value) -> int:
    """How often the GPU kernel reads each element of ``operand`` (Q: once; K: once per
    query block of every query head that shares it)."""
    if not _feeds(planner.graph, operand, found.qk.op.operands[1]):
        return 1
    block_m = cost.attention_tile(planner.options.target, max(found.head_dim, found.value_dim)).block_m
    heads_sharing = max(1, _numel(found.batch) * found.keys * found.head_dim
                        // _numel(ir.ShapedType(operand.type).shape))
    return -(-found.queries // block_m) * heads_sharing


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _epilogue_op(node) -> bool:
    """A reshape or a transpose of the result, or a pointwise op on it: the output cast
    that the unit-dim fold leaves behind a collapse_shape (``1x3x64`` P·V, collapsed,
    rounded to bf16), which the epilogue pass could not reach through the reshape, and
    the heads merged back after that cast (``O.transpose(1, 2)``, a transpose the
    epilogue pass does not take): the kernels write O in the merged order."""
    return (node.op.name in _RESHAPES or node.op.name == "linalg.transpose"
            or node.kind == OpKind.ELEMENTWISE)


def _downstream(graph: FuncGraph, start: int, within: set[int]) -> set[int]:
    """``start`` and the nodes of ``within`` that read its results, transitively."""
    seen, stack = {start}, [start]
    while stack:
        for u in graph.nodes[stack.pop()].users:
            if u in within and u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def _escapes(planner: Planner, groups: list[Group],
             allowed: set[int]) -> tuple[str | None, dict[ir.Value, list[int]]]:
    """Why ``groups`` merged cannot be one attention kernel: a value it would have to
    write other than P·V's result (or what is computed from it) and other than a view of
    its inputs; and those views, each with the chain of member ops computing it."""
    graph = planner.graph
    members = {m for g in groups for m in g.members}
    views: dict[ir.Value, list[int]] = {}
    for v in (v for g in groups for v in g.outputs):
        outside = [graph.nodes[r].label for r in graph.readers(v) if r not in members]
        p = graph.producer.get(v)
        if p in allowed or (not outside and v not in graph.returned):
            continue
        chain = _view_chain(planner, members, p) if p is not None else None
        if chain is not None:
            views[v] = chain
            continue
        label = graph.nodes[p].label if p is not None else "an argument"
        where = f"also read by {outside[0]}" if outside else "also returned"
        return (f"{label} is {where}: the attention kernel keeps S and P on chip and writes "
                "only its result"), {}
    return None, views


def _view_chain(planner: Planner, members: set[int], start: int) -> list[int] | None:
    """The members computing node ``start``'s result from the group's inputs by data
    movement alone (transposes, reshapes, slices, broadcasts), in block order; None when
    one of them computes (S, P, a scaled Q: the kernel would have to write it)."""
    graph = planner.graph
    seen, stack = {start}, [start]
    while stack:
        node = graph.nodes[stack.pop()]
        if node.kind not in _MOVES or node.gathers:
            return None
        for v in node.reads:
            p = graph.producer.get(v)
            if p is not None and p in members and p not in seen:
                seen.add(p)
                stack.append(p)
    return sorted(seen)


def _copy_sets(planner: Planner, views: dict[ir.Value, list[int]]) -> list[tuple[list[int], list[ir.Value]]]:
    """The copy kernels: the views of one shape share one loop kernel (K and V of a layer)."""
    by_shape: dict[str, tuple[set[int], list[ir.Value]]] = {}
    for v, chain in views.items():
        nodes, values = by_shape.setdefault(str(v.type), (set(), []))
        nodes.update(chain)
        values.append(v)
    return [(sorted(nodes), values) for nodes, values in by_shape.values()]


def _copy_cost(planner: Planner, views: dict[ir.Value, list[int]]) -> tuple[int, int, int]:
    """(kernels, bytes read, bytes written) of the copy kernels: each reads its chain's
    inputs and writes its views. The writes only move (the merged group would write the
    views otherwise); the reads are what the copies add."""
    graph = planner.graph
    kernels = read = written = 0
    for chain, values in _copy_sets(planner, views):
        kernels += 1
        inside = set(chain)
        reads: dict[ir.Value, int] = {}
        for i in chain:
            node = graph.nodes[i]
            for v in node.reads:
                if graph.producer.get(v) not in inside:
                    reads[v] = max(reads.get(v, 0), node.read_bytes(v))
        read += sum(reads.values())
        written += sum(tensor_bytes(v.type) for v in values)
    return kernels, read, written


def _copy_note(planner: Planner, views: dict[ir.Value, list[int]]) -> str:
    if not views:
        return ""
    graph = planner.graph
    names = ", ".join(graph.nodes[graph.producer[v]].label for v in views)
    kernels, read, written = _copy_cost(planner, views)
    return (f"; {names} also read outside: copied out by {kernels} kernel"
            f"{'s' if kernels > 1 else ''} beside it ({read} B read again)")


def _copy_out(copy: _CopyOut) -> None:
    """Clone ``copy.chain`` in front of the first reader outside the attention group (the
    return, or another kernel) and point those readers at the clones; the clones form a
    group of their own."""
    group = copy.chain[0].attributes[GROUP_ATTR]  # the attention group's id
    block = copy.func.regions[0].blocks[0]
    order = {op_key(op.operation): i for i, op in enumerate(block.operations)}
    outside: dict[int, ir.Operation] = {}
    for v in copy.values:
        for use in v.uses:
            owner = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if GROUP_ATTR not in owner.attributes or owner.attributes[GROUP_ATTR] != group:
                outside[op_key(owner)] = owner
    if not outside:
        return
    first = min(outside.values(), key=lambda op: order[op_key(op)])
    i64 = ir.IntegerType.get_signless(64, copy.func.context)
    gid = 1 + max((ir.IntegerAttr(op.attributes[GROUP_ATTR]).value for op in block.operations
                   if GROUP_ATTR in op.attributes), default=-1)
    mapping: dict[ir.Value, ir.Value] = {}
    with ir.InsertionPoint(first):
        for op in copy.chain:
            clone = op.clone().operation
            for old, new in mapping.items():
                clone.replace_uses_of_with(old, new)
            for name in (GROUP_ATTR, KIND_ATTR):
                if name in clone.attributes:
                    del clone.attributes[name]
            if len(copy.chain) > 1:
                clone.attributes[GROUP_ATTR] = ir.IntegerAttr.get(i64, gid)
            mapping.update(zip(op.results, clone.results))
    for owner in outside.values():
        for v in copy.values:
            owner.replace_uses_of_with(v, mapping[v])
    forget_graphs()


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
