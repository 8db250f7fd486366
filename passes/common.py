"""What every fusion pass shares: its options base and the per-function driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mlir import ir

from opfuse.analysis.graph import FuncGraph, functions
from opfuse.analysis.groups import Planner
from opfuse.cost import GuardOptions


@dataclass(frozen=True)
class FusionOptions(GuardOptions):
    """Guard thresholds (delta, r_limit, target); passes add their own fields."""


def plan_each_function(module: ir.Module, name: str, options: GuardOptions,
                       plan: Callable[[Planner], None]) -> None:
    """Run ``plan`` on a fresh Planner for every function and write the groups back."""
    for func_op in functions(module):
        planner = Planner(FuncGraph(func_op), name, options)
        plan(planner)
        planner.write_back()


def shape_str(shape: tuple[int, ...] | None) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"
