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
* a matmul's epilogue may transpose the result on the way (the attention backward's
  ``dK`` seen as ``[B, T, H, D]``, a tied embedding's gradient ``dWᵀ + scatter``: each
  element is still one accumulator, stored at the permuted index), and reshape it when
  the reshape only splits or merges the M dim, the N dim or the batch dims, each on its own (torch imports every
  ``nn.Linear`` on a ``[B, S, D]`` input as a matmul on ``[B*S, D]`` and an
  ``expand_shape`` back to ``[B, S, N]`` before the bias add): the reshaped result has the
  matmul's layout, so each element is still one accumulator of one thread, at an index
  the kernels compute from the accumulator's row and column. A reshape that merges dims of
  different roles (M with N: ``[B*S, N]`` into ``[B*S*N]``) is refused;
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
from opfuse.analysis.indexing import reassociation
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
    # the root's result and what the epilogue computes from it, each with its dims'
    # roles for a matmul (see _roles; None: not known, a str: why it is not a view)
    derived: dict = {v: None if conv else _roles(planner, p, v) for v in p.outputs}
    for m in sorted(c.members):
        node = graph.nodes[m]
        if node.kind == OpKind.INJECTIVE:
            transpose = not conv and node.op.name == "linalg.transpose"
            if node.op.name not in _RESHAPES and not transpose:
                return (f"{node.label} moves data ({node.op.name}); only reshapes and "
                        "transposes of a matmul's result are free")
            src = node.op.operands[0]
            if src in derived:
                roles = derived[src]
                if isinstance(roles, tuple):
                    roles = (_transposed_roles(node.op, roles) if transpose
                             else _reshaped_roles(node.op, node.label, roles))
                inside = any(r in members for v in node.results for r in graph.readers(v))
                if not conv and inside and roles is None:
                    return f"{node.label} is a reshape inside the epilogue, not at its end"
                if not conv and inside and isinstance(roles, str):
                    return roles
                derived.update((v, roles) for v in node.results)
            continue
        out = tuple(ir.ShapedType(node.results[0].type).shape)
        if conv and math.prod(out) != math.prod(shape):
            return f"{node.label} iterates over {shape_str(out)}, the {root} result is {shape_str(shape)}"
        maps = node.info.input_maps
        read = []
        for j, v in enumerate(list(node.op.operands)[: len(maps)]):
            if v in derived:
                if not _is_identity(maps[j], len(out)) or (
                    not conv and tuple(ir.ShapedType(v.type).shape) != out
                ):
                    return f"{node.label} reads the {root} result at another index"
                read.append(derived[v])
        if conv:
            derived.update((v, None) for v in node.results)
            continue
        for roles in read:
            if isinstance(roles, str):
                return roles
        known = [r for r in read if isinstance(r, tuple)]
        if out != shape and not known:
            return f"{node.label} iterates over {shape_str(out)}, the {root} result is {shape_str(shape)}"
        if read:
            derived.update((v, known[0] if known else None) for v in node.results)
    return None


def _roles(planner: Planner, p: Group, v: ir.Value, depth: int = 0) -> tuple | str | None:
    """The role of each dim of ``v``, a matmul's result or what group ``p`` computes from
    it pointwise: "batch", "m" or "n" by the contraction loop the dim is indexed by, None
    for a size-1 dim. None when the maps do not say (then no reshape may follow inside
    the epilogue); a str when ``v`` is a reshape that is no view of the tiles (why)."""
    graph = planner.graph
    producer = graph.producer.get(v)
    if producer is None or producer not in p.members or depth > len(p.members):
        return None
    node = graph.nodes[producer]
    info = node.info
    if node.kind == OpKind.INJECTIVE and node.op.name in (*_RESHAPES, "linalg.transpose"):
        roles = _roles(planner, p, node.op.operands[0], depth + 1)
        if isinstance(roles, tuple):
            if node.op.name == "linalg.transpose":
                return _transposed_roles(node.op, roles)
            return _reshaped_roles(node.op, node.label, roles)
        return roles
    if node.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST):
        shape = tuple(ir.ShapedType(v.type).shape)
        for j, u in enumerate(list(node.op.operands)[: len(info.input_maps)]):
            if (
                isinstance(u.type, ir.ShapedType)
                and tuple(ir.ShapedType(u.type).shape) == shape
                and _is_identity(info.input_maps[j], len(shape))
            ):
                roles = _roles(planner, p, u, depth + 1)
                if roles is not None:
                    return roles  # (a str: why this operand is no view of the tiles)
        return None
    if info.kind != OpKind.CONTRACTION or len(info.input_maps) < 2 or not info.output_maps:
        return None
    a_map, b_map, c_map = info.input_maps[0], info.input_maps[1], info.output_maps[0]
    if a_map is None or b_map is None or c_map is None:
        return None

    def loops(amap: ir.AffineMap) -> set[int]:
        return {
            r.maybe_downcast().position
            for r in amap.results
            if isinstance(r.maybe_downcast(), ir.AffineDimExpr)
        }

    in_a, in_b = loops(a_map), loops(b_map)
    out = []
    for size, r in zip(ir.ShapedType(v.type).shape, c_map.results):
        r = r.maybe_downcast()
        if size == 1:
            out.append(None)
        elif not isinstance(r, ir.AffineDimExpr):
            return None
        else:
            d = r.position
            out.append("batch" if d in in_a and d in in_b else "m" if d in in_a else "n")
    return tuple(out)


def _transposed_roles(op: ir.Operation, roles: tuple) -> tuple:
    """The roles of a ``linalg.transpose``'s result dims: result dim ``i`` is source dim
    ``permutation[i]`` (each element is still one accumulator, stored at a permuted index)."""
    perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    return tuple(roles[p] for p in perm)


def _reshaped_roles(op: ir.Operation, label: str, roles: tuple) -> tuple | str:
    """The roles of a reshape's result dims from its source's (an expand splits one dim
    into dims of its role; a collapse merges dims of one role), or why the reshape is not
    a view of the matmul's tiles (it merges dims of two roles)."""
    groups = reassociation(op)
    if op.name == "tensor.expand_shape":
        out_shape = ir.ShapedType(op.results[0].type).shape
        out: list = [None] * len(out_shape)
        for src, group in enumerate(groups):
            for d in group:
                out[d] = None if out_shape[d] == 1 else roles[src]
        return tuple(out)
    out = []
    for group in groups:
        kinds = {roles[d] for d in group} - {None}
        if len(kinds) > 1:
            names = " and ".join(sorted({"batch": "batch", "m": "M", "n": "N"}[k] for k in kinds))
            src = shape_str(tuple(ir.ShapedType(op.operands[0].type).shape))
            dst = shape_str(tuple(ir.ShapedType(op.results[0].type).shape))
            return (f"{label} merges the matmul's {names} dims ({src} into {dst}): not a "
                    "reshape of one of them, so not a view of its tiles")
        out.append(kinds.pop() if kinds else None)
    return tuple(out)


def _is_identity(amap: ir.AffineMap | None, rank: int) -> bool:
    if amap is None or amap.n_dims != rank or len(amap.results) != rank:
        return False
    return all(
        isinstance(r.maybe_downcast(), ir.AffineDimExpr) and r.maybe_downcast().position == i
        for i, r in enumerate(amap.results)
    )
