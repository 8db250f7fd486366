"""opfuse-fuse-epilogue: elementwise consumers of a matmul or a convolution join its
kernel (the epilogue).

A loop group that reads a contraction's result pointwise (Linear + bias + GELU, a residual
add, SiLU gating; a convolution's bias, BatchNorm scale and shift, ReLU) is applied to the
accumulators in registers before the root's store, so its result never reaches memory. A
consumer joins when:

* it is a loop group of elementwise/broadcast ops over the root's result shape,
  optionally ending in reshapes whose results leave the group (they are free views); a
  convolution's epilogue may also reshape the result on the way (torch-mlir collapses a
  grouped convolution's N x G x F/G x H x W to N x F x H x W first, and
  opfuse-fold-unit-dims drops a batch of 1 around a named convolution): its ops then
  iterate over as many points as the result has;
* every op of it that reads the contraction's result reads it at the same index (identity
  indexing map): the epilogue only sees the accumulators a thread holds;
* it does not already hold a root (one matmul or convolution per kernel);
* the cost guard agrees (registers of the fused kernel, bytes saved).

Runs after opfuse-fuse-reduction: reductions claim their row consumers first (softmax
after QK^T stays a row kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import ROOT_KINDS, OpKind

from .common import FusionOptions, plan_each_function, shape_str

NAME = "opfuse-fuse-epilogue"
_EPILOGUE_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE})
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_each_function(module, NAME, options, _plan)


def _plan(planner: Planner) -> None:
    considered: set[tuple[int, int]] = set()
    for node in planner.graph.nodes:
        if node.kind not in ROOT_KINDS:
            continue
        progress = True
        while progress:  # a merge changes the group's consumers: look again
            progress = False
            p = planner.group(node.index)
            if (
                p.kind not in ("output", "conv")
                or sum(1 for m in p.members if planner.graph.nodes[m].kind in ROOT_KINDS) != 1
            ):
                break
            for c in planner.consumer_groups(p):
                key = (node.index, c.first)
                if key in considered:
                    continue
                considered.add(key)
                why_not = _compatible(planner, p, c)
                if why_not is not None:
                    planner.refuse(p, c, why_not)
                    continue
                if planner.try_merge(p, c, why="epilogue"):
                    progress = True
                    break


def _result_shape(planner: Planner, p: Group) -> tuple[int, ...] | None:
    for m in p.members:
        node = planner.graph.nodes[m]
        if node.kind in ROOT_KINDS and node.results:
            t = node.results[0].type
            return tuple(ir.ShapedType(t).shape)
    return None


def _compatible(planner: Planner, p: Group, c: Group) -> str | None:
    """None when consumer group ``c`` can be ``p``'s epilogue; otherwise why not."""
    if c.kinds & ROOT_KINDS:
        return "the consumer already holds a matmul or a convolution"
    if not c.kinds <= _EPILOGUE_KINDS:
        return f"the consumer is an '{c.kind}' group, not an elementwise epilogue"
    shape = _result_shape(planner, p)
    if shape is None:
        return "no contraction result"
    conv = OpKind.CONVOLUTION in p.kinds
    root = "convolution" if conv else "matmul"
    graph = planner.graph
    members = set(c.members)
    derived = set(p.outputs)  # the root's result, and what the epilogue computes from it
    for m in sorted(c.members):
        node = graph.nodes[m]
        if node.kind == OpKind.INJECTIVE:
            if node.op.name not in _RESHAPES:
                return f"{node.label} moves data ({node.op.name}); only reshapes are free"
            if not conv and any(r in members for v in node.results for r in graph.readers(v)):
                return f"{node.label} is a reshape inside the epilogue, not at its end"
            if node.op.operands[0] in derived:
                derived.update(node.results)
            continue
        out = tuple(ir.ShapedType(node.results[0].type).shape)
        if (math.prod(out) != math.prod(shape)) if conv else (out != shape):
            return f"{node.label} iterates over {shape_str(out)}, the {root} result is {shape_str(shape)}"
        maps = node.info.input_maps
        for j, v in enumerate(list(node.op.operands)[: len(maps)]):
            if v in derived and not _is_identity(maps[j], len(out)):
                return f"{node.label} reads the {root} result at another index"
        if conv:
            derived.update(node.results)
    return None


def _is_identity(amap: ir.AffineMap | None, rank: int) -> bool:
    if amap is None or amap.n_dims != rank or len(amap.results) != rank:
        return False
    return all(
        isinstance(r.maybe_downcast(), ir.AffineDimExpr) and r.maybe_downcast().position == i
        for i, r in enumerate(amap.results)
    )
