"""A fusion group: the nodes that will become one kernel, with their costs kept
incrementally, and its kind (:mod:`opfuse.kinds`). The :class:`~.groups.Planner` makes and
merges them."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlir import ir

from .. import cost, kinds
from .graph import FuncGraph
from .opinfo import LOOP_KINDS, OpKind

#: Group kinds only the pass that formed the group can tell (kept in ``opfuse.kind``).
FORCED_KINDS = kinds.FORCED

#: (op class, kind) in derivation order, with the op classes as OpKind members (Group.kind
#: runs in the planner's inner loop).
_DERIVATION = tuple((OpKind(kinds.KINDS[k].derived_from), k) for k in kinds.DERIVATION)
#: The op class of the op that carries each kind (None: the group's last op).
_ROOTS = {k.name: (OpKind(k.root) if k.root else None) for k in kinds.KINDS.values()}


@dataclass(eq=False)
class Group:
    """A set of nodes that will become one kernel."""

    gid: int  # the representative node index
    members: list[int]
    reads: dict[ir.Value, int]  # external tensors read -> bytes
    outputs: dict[ir.Value, int]  # tensors written for users outside the group -> bytes
    flops: int
    peak: int  # largest payload temporaries of any member
    elem_bytes: int
    kinds: set[OpKind] = field(default_factory=set)
    first: int = 0
    last: int = 0
    domain: tuple[int, ...] = ()  # loop domain, or the row domain of its reductions
    row_domain: tuple[int, ...] | None = None  # reduced domain of row reductions
    #: A kind its members alone do not tell (``attention``: set by the pass that formed
    #: the group and read back from ``opfuse.kind``).
    forced_kind: str | None = None

    @property
    def q(self) -> int:
        return sum(self.reads.values()) + sum(self.outputs.values())

    @property
    def kind(self) -> str:
        """The kind a pass gave it (``attention``), else the one its op classes derive
        (:data:`opfuse.kinds.DERIVATION`: ``opaque``, ``scan``, ``conv``, ``output``,
        ``input``, ``scatter``, else ``loop``)."""
        if self.forced_kind is not None:
            return self.forced_kind
        for op_class, kind in _DERIVATION:
            if op_class in self.kinds:
                return kind
        return kinds.DEFAULT

    @property
    def is_loop(self) -> bool:
        return self.kinds <= LOOP_KINDS

    def copy(self) -> Group:
        """A copy that shares nothing mutable with this group."""
        return Group(self.gid, list(self.members), dict(self.reads), dict(self.outputs),
                     self.flops, self.peak, self.elem_bytes, set(self.kinds), self.first,
                     self.last, self.domain, self.row_domain, self.forced_kind)

    def registers(self) -> int:
        n_ptr = len(self.reads) + len(self.outputs)
        if kinds.get(self.kind).registers == "attention":  # the tile, not the payload, sets its registers
            value_dim = max((_shape(v.type) or [1])[-1] for v in self.outputs) if self.outputs else 1
            return cost.attention_registers(value_dim, n_ptr)
        live = len(self.reads) + self.peak + len(self.outputs)
        return cost.estimate_registers(self.kind, n_ptr, live, self.elem_bytes)


def root_of(graph: FuncGraph, g: Group) -> int:
    """The node that carries ``opfuse.kind``: the contraction of an output group, the
    convolution of a conv group, the last reduction of an input group, the scan of a scan
    group, the last member otherwise."""
    want = _ROOTS.get(g.kind)
    members = sorted(g.members)
    if want is not None:
        for m in reversed(members):
            if graph.nodes[m].kind == want:
                return m
    return members[-1]


def _shape(t: ir.Type) -> list[int]:
    return list(t.shape) if isinstance(t, ir.ShapedType) and t.has_rank else []
