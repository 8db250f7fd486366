"""What one op is, for fusion: its kind, iteration domain, indexing maps and payload.

Named linalg ops carry no indexing maps in the Python API, so the function is cloned and
run through ``linalg-generalize-named-ops`` once; the generalized twin of every op gives the
maps, iterator types and payload in one form (``generalize``). tensor reshapes and
slices are described by hand.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mlir import ir
from mlir.dialects import func, linalg
from mlir.passmanager import PassManager


class OpKind(str, enum.Enum):
    """The fusion-relevant kind of an op (ARCHITECTURE.md, analysis)."""

    ELEMENTWISE = "elementwise"  # all-parallel, computes, reads inputs pointwise (broadcast maps allowed)
    BROADCAST = "broadcast"  # all-parallel copy that replicates its input
    INJECTIVE = "injective"  # copy that moves elements: transpose, reshape, slice
    REDUCTION = "reduction"  # has reduction iterators, not a contraction
    CONTRACTION = "contraction"  # matmul-like: multiply-accumulate over reduction dims
    OPAQUE = "opaque"  # anything else: stays a kernel of its own
    FREE = "free"  # constants, tensor.empty, linalg.fill: folded into every user, never a kernel

    def __str__(self) -> str:
        return self.value


LOOP_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE})

_FREE_OPS = {"arith.constant", "tensor.empty", "linalg.fill", "ub.poison"}
_RESHAPE_OPS = {"tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape",
                "tensor.extract_slice", "tensor.insert_slice", "tensor.pad", "tensor.concat"}
# payload ops that are free in registers and flops
_NO_FLOP = {"linalg.yield", "linalg.index", "arith.constant", "arith.extf", "arith.truncf",
            "arith.bitcast", "arith.index_cast", "arith.sitofp", "arith.uitofp", "arith.fptosi"}


@dataclass
class Payload:
    """The scalar body of a linalg op: ops in order, and how their values flow."""

    n_inputs: int  # block arguments bound to ins
    n_outputs: int  # block arguments bound to outs
    ops: list[tuple[str, list[int], int]]  # (op name, operand value ids, n results)
    yields: list[int]  # value ids yielded, one per output
    used_outputs: list[bool]  # whether each outs block argument is read


@dataclass
class OpInfo:
    """Static facts about one top-level op of a function."""

    kind: OpKind
    domain: tuple[int, ...] = ()  # iteration space sizes
    iterators: tuple[str, ...] = ()  # "parallel" | "reduction" per loop
    input_maps: list[ir.AffineMap | None] = field(default_factory=list)
    output_maps: list[ir.AffineMap | None] = field(default_factory=list)
    payload: Payload | None = None
    flops_per_point: int = 0

    @property
    def points(self) -> int:
        n = 1
        for d in self.domain:
            n *= d
        return n

    @property
    def flops(self) -> int:
        return self.flops_per_point * self.points


def generalize(func_op: ir.Operation) -> tuple[list[ir.Operation | None], ir.Module]:
    """Generalized twins of the top-level ops of ``func_op``, aligned with its block.

    One pass run per function, not per op. The greedy driver behind the pass erases dead
    ops and hoists and merges constants, so in the scratch copy every value is first kept
    alive by a call to an external function, and constants (which are free) are left out
    of the alignment: their twin is None. Returns the twins and the scratch module, which
    must outlive them.
    """
    ctx = func_op.context
    scratch = ir.Module.create(ir.Location.unknown(ctx))
    with ir.InsertionPoint(scratch.body), ir.Location.unknown(ctx):
        twin = func_op.clone()
        block = twin.regions[0].blocks[0]
        ops = list(block.operations)
        kept = [r for op in ops[:-1] for r in op.results]
        keep = func.FuncOp("__opfuse_keep", ([v.type for v in kept], []), visibility="private")
        with ir.InsertionPoint(ops[-1]):
            func.CallOp([], "__opfuse_keep", kept)
    PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))", ctx).run(scratch.operation)
    twins = iter(op.operation for op in twin.regions[0].blocks[0].operations
                 if op.operation.name not in ("arith.constant", "func.call"))
    aligned = [None if op.operation.name == "arith.constant" else next(twins)
               for op in func_op.regions[0].blocks[0].operations]
    del keep
    return aligned, scratch


def describe(op: ir.Operation, twin: ir.Operation | None) -> OpInfo:
    """Classify ``op`` using its generalized ``twin``."""
    name = op.name
    if name in _FREE_OPS:
        return OpInfo(OpKind.FREE)
    if name in _RESHAPE_OPS:
        shape = _shape(op.results[0].type)
        return OpInfo(OpKind.INJECTIVE, domain=tuple(shape), iterators=("parallel",) * len(shape))
    if twin is None or twin.name != "linalg.generic":
        return OpInfo(OpKind.OPAQUE, domain=_result_domain(op))
    return _describe_generic(op, twin)


def _describe_generic(op: ir.Operation, g: ir.Operation) -> OpInfo:
    g = g.opview  # linalg.GenericOp: inputs, outputs
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(g.attributes["indexing_maps"])]
    iters = tuple(str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(g.attributes["iterator_types"]))
    n_in = len(g.inputs)
    in_maps, out_maps = maps[:n_in], maps[n_in:]
    domain = [0] * len(iters)
    for value, amap in zip(list(g.inputs) + list(g.outputs), maps):
        shape = _shape(value.type)
        for size, expr in zip(shape, amap.results):
            if isinstance(expr, ir.AffineDimExpr):
                domain[ir.AffineDimExpr(expr).position] = size
    payload = _payload(g, n_in)
    flops = sum(1 for (n, _, _) in payload.ops if n not in _NO_FLOP)
    info = OpInfo(OpKind.OPAQUE, tuple(domain), iters, in_maps, out_maps, payload, flops)
    info.kind = _kind_of_generic(op, g, info)
    return info


def _kind_of_generic(op: ir.Operation, g: ir.Operation, info: OpInfo) -> OpKind:
    if "reduction" in info.iterators:
        if op.name in ("linalg.matmul", "linalg.batch_matmul") or linalg.isa_contraction_op(g):
            return OpKind.CONTRACTION
        return OpKind.REDUCTION
    if not all(m.is_permutation for m in info.output_maps):
        return OpKind.OPAQUE
    tensor_inputs = [m for v, m in zip(g.inputs, info.input_maps) if isinstance(v.type, ir.ShapedType)]
    is_copy = len(info.payload.ops) == 0 and info.payload.yields == [0] and len(tensor_inputs) == 1
    if is_copy:
        m = info.input_maps[0]
        if len(m.results) < m.n_dims or not m.is_projected_permutation:
            return OpKind.BROADCAST
        return OpKind.INJECTIVE
    if not tensor_inputs and info.payload.ops == [] and not any(info.payload.used_outputs):
        return OpKind.FREE  # a fill written as a generic
    return OpKind.ELEMENTWISE


def _payload(g: ir.Operation, n_in: int) -> Payload:
    block = g.regions[0].blocks[0]
    ids: dict[ir.Value, int] = {}
    for arg in block.arguments:
        ids[arg] = len(ids)
    ops, yields = [], []
    for inner in block.operations:
        operand_ids = [ids.get(v, -1) for v in inner.operands]  # -1: a value from outside
        if inner.name == "linalg.yield":
            yields = operand_ids
            continue
        ops.append((inner.name, operand_ids, len(inner.results)))
        for r in inner.results:
            ids[r] = len(ids)
    n_out = len(block.arguments) - n_in
    used = [False] * n_out
    for _, operand_ids, _ in ops:
        for i in operand_ids:
            if n_in <= i < n_in + n_out:
                used[i - n_in] = True
    for i in yields:
        if n_in <= i < n_in + n_out:
            used[i - n_in] = True
    return Payload(n_in, n_out, ops, yields, used)


def _shape(t: ir.Type) -> list[int]:
    if isinstance(t, ir.ShapedType):
        return list(t.shape) if t.has_rank else []
    return []


def _result_domain(op: ir.Operation) -> tuple[int, ...]:
    return tuple(_shape(op.results[0].type)) if len(op.results) else ()


def element_bytes(t: ir.Type) -> int:
    """Bytes per element of a shaped type (or of a scalar type)."""
    et = t.element_type if isinstance(t, ir.ShapedType) else t
    if isinstance(et, ir.IntegerType):
        return max(1, et.width // 8)
    if isinstance(et, ir.IndexType):
        return 8
    for cls, size in ((ir.F64Type, 8), (ir.F32Type, 4), (ir.F16Type, 2), (ir.BF16Type, 2)):
        if isinstance(et, cls):
            return size
    return 4


def tensor_bytes(t: ir.Type) -> int:
    """Bytes of a statically shaped tensor; 0 for scalars."""
    if not isinstance(t, ir.ShapedType):
        return 0
    if not t.has_static_shape:
        return 0
    n = 1
    for d in t.shape:
        n *= d
    return n * element_bytes(t)
