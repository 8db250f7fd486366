"""opfuse-fuse-grouped: independent matmuls that read one tensor become one launch.

A backward pass computes two products from each output gradient dY of a linear layer:
the input gradient dX = dY · W and the weight gradient dW = dYᵀ · X, and attention's
backward two from dO (dV = Pᵀ · dO, dP = dO · Vᵀ) and two from dS (dQ, dK). Neither
depends on the other, and they read dY in different roles (one as its LHS, the other
transposed), so opfuse-fuse-horizontal, which needs one LHS read the same way, leaves
them apart: two launches per layer and gradient.

Here they become one "horizontal" kernel whose blocks are split between the problems,
each range with its own M, N and K and its own epilogue (backends/gpu/emit/horizontal.py;
the CPU runs the group as one function): CUTLASS's grouped GEMM, XLA's horizontal fusion
of independent siblings. The shared tensor counts once in the group's bytes (as for every
kernel that reads a value twice), so the guard sees the dY read saved and, past delta
only in time, the launches.

Candidates: matmul ("output") groups with one contraction each (with their epilogues and
column sums: a LayerNorm's bias gradient summed in the dX matmul's epilogue), whose contractions read a common tensor through views, with
the same batch loops and element types, neither depending on the other. After
opfuse-fuse-attention, so that Q·Kᵀ and P·V are never taken from an attention kernel.
One ledger entry per set (first -> last), and one per candidate left out with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse import cost
from opfuse.analysis.attention import contraction
from opfuse.analysis.graph import op_label
from opfuse.analysis.groups import Planner
from opfuse.analysis.indexing import n_inputs
from opfuse.analysis.opinfo import OpKind

from .common import FusionOptions, plan_with_twins
from .fuse_horizontal import KIND, _independent

NAME = "opfuse-fuse-grouped"


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_with_twins(module, NAME, options, _plan)


def _plan(planner: Planner, twin) -> None:
    graph = planner.graph
    readers: dict[int, list[int]] = {}
    shapes: dict[int, tuple] = {}
    same = _Clones()
    for node in graph.nodes:
        if node.kind != OpKind.CONTRACTION or not _one_matmul(planner, planner.group(node.index)):
            continue
        found = _operands(node.op, twin, same)
        if found is None:
            continue
        shapes[node.index], bases = found
        for base in bases:
            readers.setdefault(base, []).append(node.index)
    for base, nodes in readers.items():
        nodes = [n for n in dict.fromkeys(nodes) if planner.group(n).kind == "output"]
        if len(nodes) < 2:
            continue
        first, chosen = nodes[0], [nodes[0]]
        for other in nodes[1:]:
            why_not = next(filter(None, (_independent(planner, m, other) for m in chosen)), None)
            if why_not is None and shapes[other] != shapes[first]:
                why_not = (f"{graph.nodes[other].label} has other batch loops or element "
                           f"types than {graph.nodes[first].label}")
            if why_not is not None:
                planner.try_merge_set([planner.group(first), planner.group(other)],
                                      why="grouped", producer=graph.nodes[first],
                                      consumer=graph.nodes[other], kind=KIND,
                                      check=lambda _, w=why_not: w)
                continue
            chosen.append(other)
        if len(chosen) < 2:
            continue
        groups = [planner.group(i) for i in chosen]
        registers = max(g.registers() for g in groups)
        registers += cost.REGS_PER_POINTER * sum(len(g.reads) for g in groups[1:])
        shared = sum(b for n, g in enumerate(groups) for v, b in g.reads.items()
                     if any(v in h.reads for h in groups[:n]))
        label = _label(same.values[base])
        planner.try_merge_set(
            groups, why="grouped", producer=graph.nodes[first],
            consumer=graph.nodes[chosen[-1]], kind=KIND, registers=registers,
            numbers={"shared_bytes": shared, "siblings": len(groups)},
            note=f"{len(groups)} independent matmuls reading {label}, one launch",
        )


def _one_matmul(planner: Planner, g) -> bool:
    """A matmul kernel of one contraction: its epilogue, and the column sums of its
    result that opfuse-fuse-column-sums gave it (each range adds its own)."""
    kinds = [planner.graph.nodes[m].kind for m in g.members]
    return g.kind == "output" and kinds.count(OpKind.CONTRACTION) == 1


def _operands(op: ir.Operation, twin, same: "_Clones") -> tuple[tuple, list[int]] | None:
    """(batch loop sizes and element types, what its A and B read through views)."""
    c = contraction(op, twin(op))
    if c is None:
        return None
    types = tuple(str(ir.ShapedType(op.operands[j].type).element_type) for j in (0, 1, 2))
    return (tuple(c.dom[b] for b in c.batch), types), [same.of(op.operands[j]) for j in (0, 1)]


#: Ops whose result is their first operand's elements moved (or repeated).
_VIEWS = frozenset({"tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape",
                    "tensor.extract_slice", "linalg.transpose", "linalg.broadcast"})


class _Clones:
    """One number per tensor a matmul reads, through views, transposes and copies, the
    same for the copies of one op that opfuse-fuse-producer-consumer made for each of its
    consumers (``cat`` of dQ, dK, dV, cloned into the matmuls and the bias gradient that
    read it): an op's number is its name, its location and its operands' numbers."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._of: dict[ir.Value, int] = {}
        self.values: dict[int, ir.Value] = {}

    def of(self, v: ir.Value) -> int:
        v = _source(v)
        if v in self._of:
            return self._of[v]
        if isinstance(v, ir.OpResult):
            op = v.owner
            key = (op.name, op_label(op), v.result_number, tuple(self.of(x) for x in op.operands))
        else:
            key = ("argument", ir.BlockArgument(v).arg_number)
        n = self._ids.setdefault(key, len(self._ids))
        self._of[v] = n
        self.values.setdefault(n, v)
        return n


def _source(v: ir.Value) -> ir.Value:
    """The tensor ``v`` reads through views, transposes and copies (a generic whose payload
    yields its one input)."""
    while isinstance(v, ir.OpResult):
        op = v.owner
        if op.name not in _VIEWS and not _is_copy(op):
            break
        v = op.operands[0]
    return v


def _is_copy(op: ir.Operation) -> bool:
    if op.name != "linalg.generic" or len(op.results) != 1 or n_inputs(op) != 1:
        return False
    block = op.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    return len(body) == 1 and body[0].operands[0] == block.arguments[0]


def _label(v: ir.Value) -> str:
    if isinstance(v, ir.BlockArgument):
        return f"argument {v.arg_number}"
    return op_label(v.owner)


__all__ = ["NAME", "Options", "run"]
