"""What every fusion pass shares: its options base and the per-function driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from mlir import ir

from opfuse.analysis.graph import func_graph, functions
from opfuse.analysis.groups import Group, Planner
from opfuse.cost import GuardOptions


@dataclass(frozen=True)
class FusionOptions(GuardOptions):
    """Guard thresholds (delta, r_limit, target); passes add their own fields."""


def plan_each_function(module: ir.Module, name: str, options: GuardOptions,
                       plan: Callable[[Planner], None]) -> None:
    """Run ``plan`` on a fresh Planner for every function and write the groups back."""
    for func_op in functions(module):
        planner = Planner(func_graph(func_op), name, options)
        plan(planner)
        planner.write_back()


def plan_with_twins(module: ir.Module, name: str, options: GuardOptions,
                    plan: Callable[[Planner, Callable], None]) -> None:
    """:func:`plan_each_function` with ``plan(planner, twin)``: ``twin(op)`` is the
    generalized ``linalg.generic`` of a node's op (named matmuls included), or None."""
    from opfuse.analysis.opinfo import generalize

    def each(planner: Planner) -> None:
        ops = [n.op for n in planner.graph.nodes]
        twins, scratch = generalize(ops)  # scratch keeps the twins alive
        twin_of = dict(zip(ops, twins))
        plan(planner, lambda op: twin_of.get(op))
        del scratch

    plan_each_function(module, name, options, each)


def shape_str(shape: tuple[int, ...] | None) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def candidate_pairs(planner: Planner, accept: Callable[[Group, Group], bool]) -> Iterator[tuple[Group, Group]]:
    """(producer group, consumer group) for every data edge, in block order of the consumer
    (so producers are planned before their consumers), each pair of groups once, where
    ``accept`` says the pass is concerned. Groups are looked up as merges happen."""
    considered: set[tuple[int, int]] = set()
    for node in planner.graph.nodes:
        for v in node.reads:
            p_index = planner.graph.producer.get(v)
            if p_index is None:
                continue
            p, c = planner.group(p_index), planner.group(node.index)
            if p is c or (p.gid, c.gid) in considered or not accept(p, c):
                continue
            considered.add((p.gid, c.gid))
            yield p, c
