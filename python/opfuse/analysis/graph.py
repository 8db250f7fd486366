"""The op graph of a function: nodes (ops that could be kernels), their data edges, and the
fusion groups already recorded in the IR (``opfuse.group`` / ``opfuse.kind`` attributes).

Free ops (constants, ``tensor.empty``, ``linalg.fill``, scalar arithmetic and
``tensor.extract``) are not nodes: they are materialized inside whichever kernel uses them,
in the fused and the unfused program alike; a fill the function returns is a node (a
kernel writes it). A tensor that a free op extracts an element of is read by every node
that uses the scalar (``Node.gathers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, cmp_to_key
from typing import Callable, Iterable

from mlir import ir

from .. import config
from ..errors import EXIT_INTERNAL_ERROR, OpfuseError
from ..ir import format_location, walk_nested
from .opinfo import (OpInfo, OpKind, describe_all, element_bytes, holds_data, is_free_op,
                     kept_graphs, op_key, tensor_bytes)

GROUP_ATTR = "opfuse.group"
KIND_ATTR = "opfuse.kind"


@dataclass(eq=False)
class Node:
    """One top-level op that runs as (part of) a kernel."""

    op: ir.Operation
    index: int  # position among the function's nodes; edges always go forward
    info: OpInfo
    reads: list[ir.Value]  # tensors this op reads from device memory
    results: list[ir.Value]
    group: int | None = None  # opfuse.group from the IR, if any
    users: list[int] = field(default_factory=list)  # indices of consumer nodes (deduplicated)
    # tensors the op reads at positions its indexing maps do not give: at data-dependent
    # positions in its body (tensor.extract of a value from outside the op: a gather), or an
    # element taken by a tensor.extract between ops for scalar arithmetic the op uses; also
    # in ``reads``. Their producer must have finished before any of the op runs, so it
    # never joins the op's kernel (Planner.gather_via).
    gathers: list[ir.Value] = field(default_factory=list)
    # bytes of a gathered tensor the op actually reads: one element per extract and point
    # (an embedding reads the rows its ids select, not the whole table), at most the tensor
    gather_bytes: dict[ir.Value, int] = field(default_factory=dict)
    # bytes of a tensor the op reads only part of: a slice reads the elements it selects
    part_bytes: dict[ir.Value, int] = field(default_factory=dict)

    def read_bytes(self, v: ir.Value) -> int:
        """Bytes of ``v`` this op reads from device memory."""
        if v in self.part_bytes:
            return self.part_bytes[v]
        return self.gather_bytes.get(v, value_bytes(v))

    @property
    def kind(self) -> OpKind:
        return self.info.kind

    # (the ledger asks for these once per candidate; a kept graph's ops, and so their
    # locations, are the ones it was built from)
    @cached_property
    def label(self) -> str:
        return op_label(self.op)

    @cached_property
    def location(self) -> str:
        """The op's location as ``file:line:col`` (``format_location``)."""
        return format_location(self.op.location)


class FuncGraph:
    """Nodes of one ``func.func`` in block order, with producer/user edges."""

    def __init__(self, func_op: ir.Operation, ops: list[ir.Operation] | None = None):
        """``ops``: the function's top-level ops, when the caller has listed them."""
        self.func = func_op
        self.nodes: list[Node] = []
        self.producer: dict[ir.Value, int] = {}  # value -> node index
        self.returned: set[ir.Value] = set()
        #: what users derive from the graph alone and keep as long as it is kept
        #: (the planner's singleton groups)
        self.derived: dict[str, object] = {}
        _check_static(func_op)
        if ops is None:
            ops = [op.operation for op in func_op.regions[0].blocks[0].operations]
        returned = set(ops[-1].operands) if ops and ops[-1].name == "func.return" else set()
        free_values: set[ir.Value] = set()
        extracted: dict[ir.Value, list[ir.Value]] = {}  # free value -> tensors it reads
        for op, info in zip(ops, describe_all(func_op, ops)):
            if op.name == "func.return":
                self.returned.update(op.operands)
                continue
            if info.kind == OpKind.FREE and not _holds_data(op) and not _fills_a_result(op, returned):
                _note_extracts(op, free_values, extracted)
                free_values.update(op.results)
                continue
            if info.kind == OpKind.FREE and _holds_data(op):  # memory, not a kernel
                continue
            reads = _memory_reads(op, info, free_values)
            extracts = _gathered(op, info, free_values)
            gathers = list(extracts)
            gather_bytes = {v: min(value_bytes(v), n * info.points * element_bytes(v.type))
                            for v, n in extracts.items() if v not in reads}
            # (a tensor read through scalars between ops counts whole: a few elements)
            gathers += [v for v in _read_through_scalars(op, extracted) if v not in gathers]
            reads += [v for v in gathers if v not in reads]
            node = Node(op, len(self.nodes), info, reads, list(op.results), _group_of(op),
                        gathers=gathers, gather_bytes=gather_bytes, part_bytes=_sliced(op))
            for v in node.results:
                self.producer[v] = node.index
            self.nodes.append(node)
        self._readers: dict[ir.Value, list[int]] = {}
        for node in self.nodes:
            seen: set[int] = set()
            for v in node.reads:
                readers = self._readers.setdefault(v, [])
                if not readers or readers[-1] != node.index:
                    readers.append(node.index)
                p = self.producer.get(v)
                if p is not None and p not in seen:
                    seen.add(p)
                    self.nodes[p].users.append(node.index)

    def readers(self, v: ir.Value) -> list[int]:
        """Indices of the nodes that read ``v``."""
        return self._readers.get(v, [])

    def difference(self, other: FuncGraph) -> str | None:
        """The first way ``other`` (of the same function) differs from this graph, or None."""
        if len(self.nodes) != len(other.nodes):
            return f"{len(self.nodes)} nodes, now {len(other.nodes)}"
        for a, b in zip(self.nodes, other.nodes):
            for name in ("op", "info", "reads", "results", "group", "users", "gathers",
                         "gather_bytes", "part_bytes"):
                if getattr(a, name) != getattr(b, name):
                    return f"node {a.index} ({a.label}): its {name} changed"
        for name in ("producer", "returned", "_readers"):
            if getattr(self, name) != getattr(other, name):
                return f"the graph's {name.strip('_')} changed"
        return None


def func_graph(func_op: ir.Operation) -> FuncGraph:
    """The graph of ``func_op``: within a pipeline run, the one an earlier pass built if the
    function still has the same ops, with the groups read again; else a new one.

    Most fusion passes only record groups, and building the graph walks every op through the
    bindings (a quarter of a second per pass at 10,000 ops), so it is kept like an analysis
    MLIR preserves. Ops added or erased change the function's list of ops (an erased op is
    ``opinfo.forget``-ten first: its address may be reused); a pass that rewires ops in place
    calls ``opinfo.forget_graphs``. With ``OPFUSE_CHECK_ANALYSES`` set (the tests set it),
    every reuse is checked against a fresh build.
    """
    kept = kept_graphs()
    if kept is None:
        return FuncGraph(func_op)
    ops = [op.operation for op in func_op.regions[0].blocks[0].operations]
    fingerprint = ([op_key(op) for op in ops], [op.name for op in ops])
    key = op_key(func_op)
    entry = kept.get(key)
    if entry is not None and entry[0] == fingerprint:
        graph = entry[1]
        for node in graph.nodes:  # groups are the one thing passes change
            node.group = _group_of(node.op)
        if config.CHECK_ANALYSES.flag():
            _check_kept(graph, FuncGraph(func_op, ops))
        return graph
    graph = FuncGraph(func_op, ops)
    kept[key] = (fingerprint, graph)
    return graph


def _check_kept(kept: FuncGraph, fresh: FuncGraph) -> None:
    why = kept.difference(fresh)
    if why is not None:
        name = kept.func.attributes["sym_name"].value
        raise OpfuseError(
            f"internal error: the graph of @{name} kept from an earlier pass is stale: {why} "
            "(a pass changed the IR without opfuse.analysis.opinfo.forget/forget_graphs)",
            exit_code=EXIT_INTERNAL_ERROR)


def _sliced(op: ir.Operation) -> dict[ir.Value, int]:
    """A slice reads only the elements it selects: as many as it writes."""
    if op.name != "tensor.extract_slice" or not op.results:
        return {}
    source, result = op.operands[0], op.results[0]
    return {source: min(value_bytes(source), value_bytes(result))}


def _check_static(func_op: ir.Operation) -> None:
    """Static shapes only, for now: anything else is a clear error at its location."""
    def bad(v: ir.Value) -> bool:
        t = v.type
        return isinstance(t, ir.ShapedType) and not (t.has_rank and t.has_static_shape)

    name = func_op.attributes["sym_name"].value
    for arg in func_op.regions[0].blocks[0].arguments:
        if bad(arg):
            raise OpfuseError(
                f"@{name}: dynamic shapes are not supported yet (argument {arg.arg_number}: {arg.type})",
                diagnostics=[f"{format_location(func_op.location)}: error: dynamic shapes are not "
                             f"supported yet: argument {arg.arg_number} of @{name} has type {arg.type}"])
    # op results are checked once per op, where ops are described (opinfo.describe)


def _fills_a_result(op: ir.Operation, returned: set[ir.Value]) -> bool:
    """A fill the function returns: its values must reach memory, so it is a kernel (a
    loop that writes them), not a free op copied into its users."""
    return op.name.startswith("linalg.") and any(r in returned for r in op.results)


def _holds_data(op: ir.Operation) -> bool:
    """A tensor constant with data (not a splat) lives in memory and is read like an input."""
    if op.name != "arith.constant" or not isinstance(op.results[0].type, ir.ShapedType):
        return False
    return holds_data(op.attributes["value"])


def _memory_reads(op: ir.Operation, info: OpInfo, free_values: set[ir.Value]) -> list[ir.Value]:
    """Tensor operands read from memory: ins always, outs only when the payload reads them
    (an accumulator that is not a fill), never values of free ops."""
    if info.payload is None:  # reshape, slice, opaque: every tensor operand is read
        return [v for v in op.operands if isinstance(v.type, ir.ShapedType) and v not in free_values]
    n_in = info.payload.n_inputs
    operands = list(op.operands)
    reads = [v for v in operands[:n_in] if isinstance(v.type, ir.ShapedType) and v not in free_values]
    for v, used in zip(operands[n_in:], info.payload.used_outputs):
        if used and v not in free_values:
            reads.append(v)
    return reads


def _gathered(op: ir.Operation, info: OpInfo, free_values: set[ir.Value]) -> dict[ir.Value, int]:
    """Tensors defined outside ``op`` that ops inside its regions read (``tensor.extract``
    in a gather's body), in first-use order, with how many ops read each per point."""
    if not op.regions or op.name != "linalg.generic":
        return {}
    if info.payload is not None and not info.payload.captures:
        return {}  # (walking every body through the bindings was a third of planning)
    inside: set[ir.Value] = set()
    out: dict[ir.Value, int] = {}
    for region in op.regions:
        for block in region.blocks:
            inside.update(block.arguments)
            for inner in block.operations:
                for nested in walk_nested(inner.operation):
                    for v in nested.operands:
                        if v not in inside and v not in free_values and \
                                isinstance(v.type, ir.ShapedType):
                            out[v] = out.get(v, 0) + 1
                    inside.update(nested.results)
                    for r in nested.regions:
                        for b in r.blocks:
                            inside.update(b.arguments)
    return out


def _note_extracts(op: ir.Operation, free_values: set[ir.Value],
                   extracted: dict[ir.Value, list[ir.Value]]) -> None:
    """Record the tensors free op ``op`` reads: the one a ``tensor.extract`` takes an
    element of, and those its free operands read."""
    reads: dict[ir.Value, None] = {}
    for v in op.operands:
        for t in extracted.get(v, ()):
            reads.setdefault(t)
    if op.name == "tensor.extract" and op.operands[0] not in free_values:
        reads.setdefault(op.operands[0])
    if reads:
        for r in op.results:
            extracted[r] = list(reads)


def _read_through_scalars(op: ir.Operation, extracted: dict[ir.Value, list[ir.Value]]) -> list[ir.Value]:
    """Tensors ``op`` reads through the free scalar values it uses (as operands, or inside
    its regions: a payload using a scalar computed between ops), in first-use order."""
    if not extracted:
        return []
    out: dict[ir.Value, None] = {}
    for inner in walk_nested(op):
        for v in inner.operands:
            for t in extracted.get(v, ()):
                out.setdefault(t)
    return list(out)


def _group_of(op: ir.Operation) -> int | None:
    if GROUP_ATTR in op.attributes:
        return ir.IntegerAttr(op.attributes[GROUP_ATTR]).value
    return None


def op_label(op: ir.Operation) -> str:
    """A short, stable name for an op in ledgers and remarks: its NameLoc if it has one,
    otherwise ``op.name@file:line:col``."""
    loc = op.location
    try:
        if loc.is_a_name():
            return loc.name_str
    except Exception:
        pass
    return f"{op.name}@{format_location(loc)}"


def value_bytes(v: ir.Value) -> int:
    return tensor_bytes(v.type)


def functions(module: ir.Module) -> list[ir.Operation]:
    """The functions with bodies that fusion works on (not declarations, not outlined kernels)."""
    out = []
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or not op.regions[0].blocks:
            continue
        if "opfuse.kernel" in op.attributes:
            continue
        out.append(op)
    return out


def external_values(
    host: ir.Operation, members: list[ir.Operation],
    walk: Callable[[ir.Operation], Iterable[ir.Operation]] = walk_nested,
) -> tuple[list[ir.Operation], list[ir.Value]]:
    """What ``members`` (top-level ops of ``host``) use from the rest of ``host``, to make
    them a function of their own: the free ops to clone into it (in host order, with the free
    ops they use) and the values to pass as its arguments (in first-use order). ``walk(m)``:
    the ops whose operands ``m`` uses (``m`` and its nested ops; ``m`` alone where the caller
    knows its regions use nothing from outside, :func:`sealed_walk`)."""
    member_set = set(members)
    free: dict[ir.Operation, None] = {}
    args: dict[ir.Value, None] = {}

    def visit_value(v: ir.Value) -> None:
        owner = v.owner
        if isinstance(owner, ir.Block):
            if owner.owner.operation == host:
                args.setdefault(v)
            return
        op = owner.operation
        if op in member_set or op.parent is None or op.parent.operation != host:
            return  # defined inside the group or inside a region
        if is_free_op(op):
            if op not in free:
                for inner in walk_nested(op):  # a generic fill's body captures its value
                    for operand in inner.operands:
                        visit_value(operand)
                free[op] = None
            return
        args.setdefault(v)

    for m in members:
        for inner in walk(m):
            for operand in inner.operands:
                visit_value(operand)
    # (the block's own op order: numbering every op of the host here, once per group, made
    # outlining quadratic: 51 s for the unfused 4,000-op chain)
    return sorted(free, key=_block_order), list(args)


_block_order = cmp_to_key(lambda a, b: -1 if a.is_before_in_block(b) else 1)


def sealed_walk(nodes: Iterable[Node]) -> Callable[[ir.Operation], Iterable[ir.Operation]]:
    """:func:`walk_nested` for the ops of ``nodes``, but only the op itself for those whose
    payload uses no value from outside (``Payload.captures``): the ops of its body use
    nothing the op does not get as an operand, so there is nothing else to see or remap."""
    sealed = {op_key(n.op) for n in nodes if n.info.payload is not None and not n.info.payload.captures}

    def walk(op: ir.Operation) -> Iterable[ir.Operation]:
        return (op,) if op_key(op) in sealed else walk_nested(op)

    return walk
