"""opfuse-outline: every group becomes ``func.func private @fusion_<N>_<kind>``.

The function body keeps only calls, in a topological order of the group graph: it is the
host schedule. Ops in no group are outlined one per function, so the unfused baseline (no
fusion passes, then this pass) is compiled and measured exactly like the fused program.
Free ops (constants, ``tensor.empty``, ``linalg.fill``) are cloned into every kernel that
uses them. Each kernel carries its ledger figures as attributes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Iterable

from mlir import ir
from mlir.dialects import func

from opfuse.analysis.graph import (GROUP_ATTR, KIND_ATTR, external_values, func_graph, functions,
                                   sealed_walk)
from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import is_free_op
from opfuse.cost import GuardOptions
from opfuse.ir import walk_nested

NAME = "opfuse-outline"
KERNEL_ATTR = "opfuse.kernel"


@dataclass(frozen=True)
class Options:
    """Attributes:
    prefix: name prefix of the outlined functions.
    """

    prefix: str = "fusion"


def run(module: ir.Module, options: Options = Options()) -> None:
    counter = 0
    for func_op in functions(module):
        counter = _outline_function(module, func_op, options, counter)


def _outline_function(module: ir.Module, func_op: ir.Operation, options: Options, counter: int) -> int:
    planner = Planner(func_graph(func_op), NAME, GuardOptions())
    graph = planner.graph
    block = func_op.regions[0].blocks[0]
    terminator = list(block.operations)[-1]
    for g in _topological(planner):
        kernel_name = f"{options.prefix}_{counter}_{g.kind}"
        counter += 1
        members = [graph.nodes[i].op for i in sorted(g.members)]
        outputs = [v for m in members for v in m.results if v in g.outputs]
        walk = sealed_walk(graph.nodes[i] for i in g.members)
        kernel, args = _make_kernel(func_op, kernel_name, members, outputs, g, walk)
        with ir.InsertionPoint(terminator), members[-1].location:
            call = func.CallOp([v.type for v in outputs], ir.FlatSymbolRefAttr.get(kernel_name), args)
        for v, new in zip(outputs, call.results):
            _replace_uses_outside(v, new, kernel)
    _erase_dead_free_ops(block)
    return counter


def _make_kernel(host: ir.Operation, name: str, members: list[ir.Operation],
                 outputs: list[ir.Value], g: Group,
                 walk: Callable[[ir.Operation], Iterable[ir.Operation]]) -> tuple[ir.Operation, list[ir.Value]]:
    """Move ``members`` into a new private function placed before ``host``; returns it and
    the host values to pass as its arguments. ``walk``: the ops of a member whose operands
    may be host values (see ``external_values``)."""
    ctx = host.context
    free_ops, args = external_values(host, members, walk)
    with ir.InsertionPoint(host), members[-1].location:
        kernel = func.FuncOp(name, ([a.type for a in args], [v.type for v in outputs]),
                             visibility="private")
        entry = kernel.add_entry_block()
    mapping = dict(zip(args, entry.arguments))
    ip = ir.InsertionPoint(entry)
    with ip:
        for op in free_ops:  # clones: the host keeps its own for other users
            clone = op.clone()
            for old, new in zip(op.results, clone.results):
                mapping[old] = new
            _remap(clone, mapping)
    for op in members:
        op.detach_from_parent()
        ip.insert(op)
        for attr in (GROUP_ATTR, KIND_ATTR):
            if attr in op.attributes:
                del op.attributes[attr]
        _remap(op, mapping, walk)
    with ip, members[-1].location:
        func.ReturnOp(outputs)
    i64 = ir.IntegerType.get_signless(64, ctx)
    figures = {
        "opfuse.ops": len(members),
        "opfuse.bytes_read": sum(g.reads.values()),
        "opfuse.bytes_written": sum(g.outputs.values()),
        "opfuse.flops": g.flops,
        "opfuse.registers": g.registers(),
    }
    attrs = kernel.operation.attributes
    attrs[KERNEL_ATTR] = ir.UnitAttr.get(ctx)
    attrs[KIND_ATTR] = ir.StringAttr.get(g.kind, ctx)
    for key, value in figures.items():
        attrs[key] = ir.IntegerAttr.get(i64, value)
    return kernel.operation, args


def _remap(op: ir.Operation, mapping: dict[ir.Value, ir.Value],
           walk: Callable[[ir.Operation], Iterable[ir.Operation]] = walk_nested) -> None:
    for inner in walk(op):
        for i, v in enumerate(inner.operands):
            new = mapping.get(v)
            if new is not None:
                inner.operands[i] = new


def _replace_uses_outside(v: ir.Value, new: ir.Value, kernel: ir.Operation) -> None:
    for use in list(v.uses):
        owner = use.owner.operation
        if not _inside(owner, kernel):
            owner.operands[use.operand_number] = new


def _inside(op: ir.Operation, ancestor: ir.Operation) -> bool:
    while op is not None:
        if op == ancestor:
            return True
        parent = op.parent
        op = parent.operation if parent is not None else None
    return False


def _erase_dead_free_ops(block: ir.Block) -> None:
    for op in reversed([o.operation for o in block.operations]):
        if is_free_op(op) and all(not list(r.uses) for r in op.results):
            op.erase()


def _topological(planner: Planner) -> list[Group]:
    """Groups in a topological order of the group graph, earliest first member first."""
    groups = planner.groups()
    indeg = {g.gid: 0 for g in groups}
    succ: dict[int, list[Group]] = {g.gid: [] for g in groups}
    for g in groups:
        for c in planner.consumer_groups(g):
            succ[g.gid].append(c)
            indeg[c.gid] += 1
    ready = [(g.first, g.gid, g) for g in groups if indeg[g.gid] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, _, g = heapq.heappop(ready)
        out.append(g)
        for c in succ[g.gid]:
            indeg[c.gid] -= 1
            if indeg[c.gid] == 0:
                heapq.heappush(ready, (c.first, c.gid, c))
    if len(out) != len(groups):
        raise RuntimeError("opfuse-outline: the group graph has a cycle")
    return out
