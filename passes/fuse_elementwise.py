"""opfuse-fuse-elementwise: elementwise and broadcast chains become loop groups.

A producer group joins its consumer group when both are pure loop groups (elementwise or
broadcast ops) over the same iteration space and the cost guard agrees. A producer whose
value is also read elsewhere stays a group output (multi-output loop kernel); a merge that
would make the group graph cyclic is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind

from .common import FusionOptions, candidate_pairs, plan_each_function, shape_str

NAME = "opfuse-fuse-elementwise"
_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST})


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_each_function(module, NAME, options, _plan)


def _is_chain_group(g: Group) -> bool:
    return g.kinds <= _KINDS


def _plan(planner: Planner) -> None:
    accept = lambda p, c: _is_chain_group(p) and _is_chain_group(c)  # noqa: E731
    for p, c in candidate_pairs(planner, accept):
        if p.domain != c.domain:
            planner.refuse(p, c, f"iteration spaces differ: {shape_str(p.domain)} vs {shape_str(c.domain)}")
            continue
        planner.try_merge(p, c)
