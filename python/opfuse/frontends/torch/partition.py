"""Partitions, never all-or-nothing: an exported program split into the largest subgraphs
opfuse supports (each compiled and fused as one program) and the ops left to run eagerly in
PyTorch between them.

1. **Probe**: every ATen node of the program is imported on a scratch graph, in order
   (``probe``). A node whose op has no rule, whose rule refuses an argument, or that reads a
   value opfuse cannot hold (a float64 tensor, the result of an eager op of such a type) is
   *left eager*, with the op and the reason (``EagerOp``). Its results become fresh inputs of
   the scratch graph, so the nodes after it are judged on their own.
2. **Partition**: torch's ``CapabilityBasedPartitioner`` groups the supported nodes into the
   largest partitions that keep the graph acyclic (independent supported nodes join one
   partition too), and ``fuse_by_partitions`` turns each into a submodule
   ``opfuse_<N>`` of the split graph, called where its nodes were. The partitions' inputs
   and results are tensors of dtypes opfuse holds, by construction of step 1.
3. The caller (``opfuse.torch_backend``) imports each partition
   (``import_graph_module``), compiles it and swaps it into the split graph; the eager nodes
   stay torch's own calls.

Export bookkeeping nodes (``IGNORED``: asserts of static facts) are removed first; they
compute nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...errors import OpfuseError
from .importer import UnsupportedOpError, _Importer, _op_name, _tensor_meta, _where
from .aten import IGNORED

#: Prefix of the partition submodules in the split graph.
PREFIX = "opfuse_"


@dataclass(frozen=True)
class EagerOp:
    """One op left to run eagerly, and why.

    Attributes:
        op: The ATen overload, e.g. ``aten.linalg_svd.default``.
        node: The node's name in the exported program.
        reason: Why opfuse does not compile it (``no rule``, the argument it refuses, the
            value it reads that opfuse cannot hold, or the partition's compile error).
        where: The module path and source line that call it.
    """

    op: str
    node: str
    reason: str
    where: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Partitioned:
    """An exported program's graph split into partitions and eager nodes.

    Attributes:
        gm: The split graph module (mutated in place from the program's): one
            ``call_module`` per partition (``opfuse_<N>``, returning a tuple), the eager
            nodes as they were. Called with the program's flat inputs.
        partitions: ``(name, submodule)`` of every partition, in the split graph's order.
        eager: The ops left eager, in graph order.
    """

    gm: Any
    partitions: list[tuple[str, Any]]
    eager: list[EagerOp]


def partition(program: Any) -> Partitioned:
    """Split ``program`` (an ``ExportedProgram`` after ``decomposition_table()``)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    gm = program.graph_module
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and _op_name(node.target) in IGNORED and not node.users:
            gm.graph.erase_node(node)
    _drop_empty_concat_operands(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    eager = probe(gm)

    class _Supported(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            return node.op == "call_function" and node not in eager

    proposed = CapabilityBasedPartitioner(
        gm, _Supported(), allows_single_node_partition=True
    ).propose_partitions()
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # name the partitions in graph order
    proposed.sort(key=lambda p: min(order[n] for n in p.nodes))
    split = fuse_by_partitions(
        gm, [p.nodes for p in proposed], prefix=PREFIX, always_return_tuple=True
    )
    parts = [
        (n.target, getattr(split, n.target))
        for n in split.graph.nodes
        if n.op == "call_module" and n.target.startswith(PREFIX)
    ]
    reported = [e for node, e in eager.items() if e is not None]
    return Partitioned(split, parts, reported)


def _numel(node: Any) -> int | None:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return val.numel() if hasattr(val, "numel") else None


def _drop_empty_concat_operands(gm: Any) -> None:
    """``cat`` without its empty operands (a key/value cache of length 0 that Hugging Face
    models concatenate the new keys to): the same values, and no empty tensor for a
    partition to take in. A ``cat`` left with one operand is that operand."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or _op_name(node.target) != "aten.cat.default":
            continue
        parts = list(node.args[0])
        kept = [p for p in parts if _numel(p) != 0]
        if len(kept) == len(parts) or not kept:
            continue
        if len(kept) == 1 and _same_meta(kept[0], node):
            node.replace_all_uses_with(kept[0])
            gm.graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])


def _same_meta(a: Any, b: Any) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return tuple(va.shape) == tuple(vb.shape) and va.dtype == vb.dtype


def probe(gm: Any) -> dict[Any, EagerOp | None]:
    """The nodes of ``gm`` opfuse cannot import, each with its reason (None for the
    bookkeeping ``getitem`` of an eager op's results, which is not an op of its own)."""
    imp = _Importer(None, "probe")
    eager: dict[Any, EagerOp | None] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            _hold(imp, node)
        elif node.op == "call_function":
            reason = _refusal(imp, node, eager)
            if reason is None:
                continue
            op = _op_name(node.target)
            eager[node] = None if op == "getitem" else EagerOp(op, node.name, reason, _where(node))
            _hold(imp, node)
    return eager


def _refusal(imp: _Importer, node: Any, eager: dict) -> str | None:
    """Why ``node`` cannot be imported (None: it was, into ``imp``'s graph)."""
    if _op_name(node.target) == "getitem" and node.args[0] in eager:
        return "a result of an op left eager"
    for a in node.all_input_nodes:
        if a not in imp.env:
            what = getattr(a.meta.get("val"), "dtype", type(a.meta.get("val")).__name__)
            return f"reads {a.name}, a {what} value opfuse does not hold"
    try:
        imp._call(node)
    except UnsupportedOpError as e:
        return e.detail or "no rule for this op"
    except OpfuseError as e:
        return str(e)
    return None


def _hold(imp: _Importer, node: Any) -> None:
    """Make ``node``'s tensor results inputs of the probe graph (those opfuse can hold)."""
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        imp.env[node] = [_input(imp, f"{node.name}.{i}", node, v) for i, v in enumerate(val)]
    else:
        value = _input(imp, node.name, node, val)
        if value is not None:
            imp.env[node] = value


def _input(imp: _Importer, name: str, node: Any, val: Any) -> Any:
    if not hasattr(val, "shape"):
        return None

    class _Meta:  # _tensor_meta reads node.meta["val"]
        meta = {"val": val}

    try:
        shape, dtype = _tensor_meta(_Meta, name)
    except OpfuseError:
        return None
    if not all(shape):  # an empty tensor (a cache of length 0): nothing to compute on
        return None
    return imp.g.input(f"{name}.eager" if node.op != "placeholder" else name, shape, dtype)
