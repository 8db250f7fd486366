"""What one op is, for fusion: its kind, iteration domain, indexing maps and payload.

Named linalg ops carry no indexing maps in the Python API, so the function is cloned and
run through ``linalg-generalize-named-ops`` once; the generalized twin of every op gives the
maps, iterator types and payload in one form (``generalize``). tensor reshapes, slices and
concats are described by hand: injective, over their result's shape, reading every operand
once (a concat reads as many bytes as it writes).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import enum
from dataclasses import dataclass, field
from typing import Iterator

from mlir import ir
from mlir.dialects import func, linalg
from mlir.passmanager import PassManager

from ..errors import OpfuseError
from ..ir import format_location, walk_nested
from . import scan, scatter


class OpKind(str, enum.Enum):
    """The fusion-relevant kind of an op (docs/architecture.md, analysis)."""

    ELEMENTWISE = "elementwise"  # all-parallel, computes, reads inputs pointwise (broadcast maps allowed)
    BROADCAST = "broadcast"  # all-parallel copy that replicates its input
    INJECTIVE = "injective"  # copy that moves elements: transpose, reshape, slice, concat
    REDUCTION = "reduction"  # has reduction iterators, not a contraction
    CONTRACTION = "contraction"  # matmul-like: multiply-accumulate over reduction dims
    CONVOLUTION = "convolution"  # multiply-accumulate over a sliding window (linalg.conv_*)
    SCAN = "scan"  # a running sum along one dim (cumsum written as a triangular reduction)
    SCATTER = "scatter"  # rows summed by an index (a one-hot reduction: an embedding's gradient)
    OPAQUE = "opaque"  # anything else: stays a kernel of its own
    FREE = "free"  # constants, tensor.empty, linalg.fill: folded into every user, never a kernel

    def __str__(self) -> str:
        return self.value


LOOP_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE})
#: The roots an epilogue can join (opfuse-fuse-epilogue): one per kernel.
ROOT_KINDS = frozenset({OpKind.CONTRACTION, OpKind.CONVOLUTION})

_FREE_OPS = {"arith.constant", "tensor.empty", "linalg.fill", "ub.poison"}


def is_scalar_op(op: ir.Operation) -> bool:
    """Scalar work between kernels: ``tensor.extract`` of one element, and arith/math ops
    on scalars (``%s = tensor.extract %t[]; %e = math.exp %s`` feeding a later op's
    payload, a fill or a pad value). A few instructions: every kernel that uses the value
    computes it again (the extracted tensor is read by that kernel), so it is never a
    kernel of its own and never a scalar passed between kernels."""
    name = op.name
    if name == "tensor.extract":
        return True
    if not name.startswith(("arith.", "math.")) or op.regions:
        return False
    return not any(isinstance(v.type, ir.ShapedType) for v in (*op.operands, *op.results))


def is_free_op(op: ir.Operation) -> bool:
    """An op every kernel that uses it gets a copy of: an empty tensor, a fill, a scalar or
    splat constant (a tensor constant that holds data is passed, not copied), scalar
    arithmetic (:func:`is_scalar_op`)."""
    if op.name == "arith.constant":
        return not holds_data(op.attributes["value"])
    if op.name == "linalg.generic":
        return _is_generic_fill(op)
    return op.name in _FREE_OPS or is_scalar_op(op)


def _is_generic_fill(op: ir.Operation) -> bool:
    """A fill written as a generic: no inputs, a body that only yields a value from outside
    it (the unit-dim fold turns ``iota`` over a size-1 dim into one: ``linalg.index`` of that
    dim is the constant 0)."""
    if len(op.operands) != len(op.results):
        return False
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 1:
        return False
    return all(not isinstance(v.owner, ir.Block) or v.owner.owner.operation != op
               for v in body[0].operands)


def holds_data(attr: ir.Attribute) -> bool:
    """A constant's value that lives in memory: a non-splat ``dense<...>`` or any
    ``dense_resource<...>`` (torch-mlir's weights: a blob, never a splat)."""
    if isinstance(attr, ir.DenseElementsAttr):
        return not attr.is_splat
    if type(attr) is not ir.Attribute:  # a scalar, a splat: downcast by the bindings
        return False
    try:
        ir.DenseResourceElementsAttr(attr)
    except ValueError:
        return False
    return True
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
    # whether the body may use a value defined outside the op (an op of it does, or has
    # regions of its own): only then can it read a tensor at data-dependent positions
    # (graph._gathered walks it), which most bodies never do
    captures: bool = True


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
    result_elem_bytes: int = 4  # widest element type among the results
    peak: int | None = None  # payload register peak, filled in by the planner on first use

    @property
    def points(self) -> int:
        n = 1
        for d in self.domain:
            n *= d
        return n

    @property
    def flops(self) -> int:
        if self.kind == OpKind.SCAN:  # one add per element, not per point of the triangle
            return self.flops_per_point * (self.points // max(1, self.domain[-1]))
        if self.kind == OpKind.SCATTER:  # once per update, not per row it is compared with
            read = {p for m in self.input_maps if m is not None for p in _map_dims(m)}
            rows = 1
            for d, size in enumerate(self.domain):
                rows *= 1 if d in read else size
            return self.flops_per_point * (self.points // max(1, rows))
        return self.flops_per_point * self.points


def generalize(ops: list[ir.Operation]) -> tuple[list[ir.Operation | None], ir.Module | None]:
    """Generalized twins of ``ops`` (top-level ops of one function), aligned with them.

    A ``linalg.generic`` is its own twin and other dialects' ops have none (None); named
    linalg ops are cloned into one scratch function, with their operands as its arguments,
    and generalized by a single pass run. Every clone's results are kept alive by a call so
    the pass's greedy driver erases none of them. Returns the twins and the scratch module,
    which must outlive them.
    """
    named = [op for op in ops if op.name.startswith("linalg.") and op.name != "linalg.generic"]
    twins: dict[ir.Operation, ir.Operation] = {}
    scratch = None
    if named:
        scratch, twins = _generalize_named(named)
    out: list[ir.Operation | None] = []
    for op in ops:
        if op.name == "linalg.generic":
            out.append(op)
        else:
            out.append(twins.get(op))
    return out, scratch


def _generalize_named(named: list[ir.Operation]) -> tuple[ir.Module, dict]:
    ctx = named[0].context
    # the scratch function's arguments: every operand, and every value a body captures
    # from the function (a constant the fold's canonicalization hoisted out of a
    # linalg.map's body): cloned as they are, those would be used outside their region
    operands: dict[ir.Value, int] = {}
    for op in named:
        for v in (*op.operands, *_captured(op)):
            operands.setdefault(v, len(operands))
    scratch = ir.Module.create(ir.Location.unknown(ctx))
    with ir.InsertionPoint(scratch.body), ir.Location.unknown(ctx):
        fn = func.FuncOp("__opfuse_scratch", ([v.type for v in operands], []))
        entry = fn.add_entry_block()
        keep_types = [r.type for op in named for r in op.results]
        func.FuncOp("__opfuse_keep", (keep_types, []), visibility="private")
        clones = []
        with ir.InsertionPoint(entry):
            for op in named:
                clone = op.clone()
                for i, v in enumerate(op.operands):
                    clone.operands[i] = entry.arguments[operands[v]]
                captured = _captured(op)
                if captured:
                    for inner, inner_clone in zip(walk_nested(op), walk_nested(clone)):
                        for i, v in enumerate(inner.operands):
                            if inner is not op and v in captured:
                                inner_clone.operands[i] = entry.arguments[operands[v]]
                clones.append(clone)
            func.CallOp([], "__opfuse_keep", [r for c in clones for r in c.results])
            func.ReturnOp([])
    PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))", ctx).run(scratch.operation)
    body = [o.operation for o in fn.regions[0].blocks[0].operations]
    generalized = [o for o in body if o.name not in ("func.call", "func.return", "arith.constant")]
    if len(generalized) != len(named):  # the pass folded something away: be conservative
        return scratch, {}
    return scratch, dict(zip(named, generalized))


def _captured(op: ir.Operation) -> set[ir.Value]:
    """Values the ops in ``op``'s regions use that are defined outside ``op``."""
    if not op.regions:
        return set()
    inside: set[ir.Value] = set()
    used: list[ir.Value] = []
    for inner in walk_nested(op):
        for region in inner.regions:
            for block in region.blocks:
                inside.update(block.arguments)
        if inner is not op:
            inside.update(inner.results)
            used.extend(inner.operands)
    return {v for v in used if v not in inside}


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def op_key(op: ir.Operation) -> int:
    """The address of the C++ operation: stable for the op's lifetime. (The bindings' own
    hash of an Operation changes when an attribute is set, so it cannot key a cache.)"""
    return _capsule_pointer(op._CAPIPtr, b"mlir.ir.Operation._CAPIPtr")


# Op descriptions survive from pass to pass within one pipeline run, like an analysis that
# MLIR's AnalysisManager preserves: the fusion passes only add attributes, so an op's kind,
# maps and payload do not change. Keys are op addresses (``op_key``); each entry is checked
# against the op's name, a pass that erases an op forgets it, and the pipeline drops the
# whole cache after any upstream pass, which may rewrite anything.
_CACHE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("opfuse_opinfo", default=None)


@contextlib.contextmanager
def info_cache() -> Iterator[dict]:
    """Keep op descriptions for the duration of the block (one pipeline run)."""
    cache: dict = {}
    token = _CACHE.set(cache)
    try:
        yield cache
    finally:
        _CACHE.reset(token)


#: The cache's entry for function graphs (``graph.func_graph``); op entries have int keys.
_GRAPHS = "graphs"


def forget(op: ir.Operation) -> None:
    """Drop ``op`` from the cache before erasing it (its address may be reused), and the
    function graphs, one of which it is a node of."""
    cache = _CACHE.get()
    if cache is not None:
        cache.pop(op_key(op), None)
        cache.pop(_GRAPHS, None)


def forget_graphs() -> None:
    """Drop the function graphs kept for this run: a pass rewired ops in place (replaced a
    use, rewrote a body), which leaves a function's list of ops as it was."""
    cache = _CACHE.get()
    if cache is not None:
        cache.pop(_GRAPHS, None)


def kept_graphs() -> dict | None:
    """The function graphs kept for this run, by ``op_key`` of the function (None outside a
    run); see ``graph.func_graph``."""
    cache = _CACHE.get()
    return None if cache is None else cache.setdefault(_GRAPHS, {})


def invalidate_cache() -> None:
    cache = _CACHE.get()
    if cache is not None:
        cache.clear()


def _is_keep_call(op: ir.Operation) -> bool:
    return op.name == "func.call" and op.attributes["callee"].value == "__opfuse_keep"


def describe_all(func_op: ir.Operation, ops: list[ir.Operation]) -> list[OpInfo]:
    """Descriptions of ``ops`` (the top-level ops of ``func_op``), from the cache where
    possible; the function is generalized only when some op is new."""
    cache = _CACHE.get()
    infos: list[OpInfo | None] = [None] * len(ops)
    missing = False
    keys = [op_key(op) for op in ops] if cache is not None else []
    if cache is not None:
        for i, op in enumerate(ops):
            hit = cache.get(keys[i])
            if hit is not None and hit[0] == op.name:
                infos[i] = hit[1]
            else:
                missing = True
    if cache is None or missing:
        todo = [i for i, info in enumerate(infos) if info is None]
        # free ops (fills) are free whatever their twin says: not cloned and generalized
        named = [i for i in todo if ops[i].name not in _FREE_OPS]
        twins, scratch = generalize([ops[i] for i in named])  # scratch keeps the twins alive
        twin_of = dict(zip(named, twins))
        for i in todo:
            twin = twin_of.get(i)
            infos[i] = describe(ops[i], twin)
            if cache is not None:
                cache[keys[i]] = (ops[i].name, infos[i])
        del scratch
    return infos  # type: ignore[return-value]


def describe(op: ir.Operation, twin: ir.Operation | None) -> OpInfo:
    """Classify ``op`` using its generalized ``twin``."""
    types = [r.type for r in op.results]
    for t in types:
        if _is_dynamic(t):
            raise OpfuseError(
                f"dynamic shapes are not supported yet ({t})",
                diagnostics=[f"{format_location(op.location)}: error: dynamic shapes are not "
                             f"supported yet: '{op.name}' produces {t}"])
    info = _describe(op, twin)
    info.result_elem_bytes = max([element_bytes(t) for t in types] or [4])
    return info


def _describe(op: ir.Operation, twin: ir.Operation | None) -> OpInfo:
    name = op.name
    if name in _FREE_OPS or is_scalar_op(op):
        return OpInfo(OpKind.FREE)
    if name in _RESHAPE_OPS:
        shape = _shape(op.results[0].type)
        return OpInfo(OpKind.INJECTIVE, domain=tuple(shape), iterators=("parallel",) * len(shape))
    if twin is None or twin.name != "linalg.generic":
        return OpInfo(OpKind.OPAQUE, domain=_result_domain(op))
    return _describe_generic(op, twin)


# Maps, iterator attributes and types are uniqued in their context, so what is derived from
# them is computed once per distinct map or type (a 10,000-op graph has a handful) -- per
# pipeline run, in the op-description cache: a key holds its context alive, so a
# process-wide memo would keep every module a long process ever parsed
# (test_opinfo_contexts.py). Outside a run nothing is memoized.
_ITERATORS: dict[str, str] = {}  # keyed by text: holds no context


def _memoized(table: str, key, compute):
    """``compute(key)``, memoized in this pipeline run's cache under ``table``."""
    cache = _CACHE.get()
    if cache is None:
        return compute(key)
    memo = cache.get(table)
    if memo is None:
        memo = cache[table] = {}
    try:
        return memo[key]
    except KeyError:
        value = memo[key] = compute(key)
        return value


def _map_dims(amap: ir.AffineMap) -> tuple[int | None, ...]:
    """Per result of ``amap``: the loop it indexes, or None for a constant/compound expr."""
    return _memoized("map dims", amap, lambda m: tuple(
        e.position if isinstance(e, ir.AffineDimExpr) else None for e in m.results))


def _iterator(attr: ir.Attribute) -> str:
    text = str(attr)
    name = _ITERATORS.get(text)
    if name is None:
        name = _ITERATORS[text] = text.split("<")[-1].rstrip(">")
    return name


def _maps_of(attr: ir.Attribute) -> list[ir.AffineMap]:
    return _memoized("maps of", attr,
                     lambda a: [ir.AffineMapAttr(x).value for x in ir.ArrayAttr(a)])


def _iterators_of(attr: ir.Attribute) -> tuple[str, ...]:
    return _memoized("iterators of", attr,
                     lambda a: tuple(_iterator(x) for x in ir.ArrayAttr(a)))


def _static_shape(t: ir.Type) -> tuple[int, ...]:
    return _memoized("shapes", t, lambda x: tuple(_shape(x)))


def _describe_generic(op: ir.Operation, g: ir.Operation) -> OpInfo:
    attrs = g.attributes
    maps = _maps_of(attrs["indexing_maps"])
    iters = _iterators_of(attrs["iterator_types"])
    operands = list(g.operands)
    n_in = len(operands) - len(g.results)  # on tensors, one result per outs operand
    in_maps, out_maps = maps[:n_in], maps[n_in:]
    domain = [0] * len(iters)
    for value, amap in zip(operands, maps):
        for size, pos in zip(_static_shape(value.type), _map_dims(amap)):
            if pos is not None:
                domain[pos] = size
    payload = _payload(g, n_in)
    flops = sum(1 for (n, _, _) in payload.ops if n not in _NO_FLOP)
    info = OpInfo(OpKind.OPAQUE, tuple(domain), iters, in_maps, out_maps, payload, flops)
    info.kind = _kind_of_generic(op, g, info, operands[:n_in])
    return info


def _kind_of_generic(op: ir.Operation, g: ir.Operation, info: OpInfo,
                     inputs: list[ir.Value]) -> OpKind:
    if "reduction" in info.iterators:
        view = g.opview
        if op.name in ("linalg.matmul", "linalg.batch_matmul") or linalg.isa_contraction_op(view):
            return OpKind.CONTRACTION
        if linalg.isa_convolution_op(view) and any(
            name in ("arith.mulf", "arith.muli") for name, _, _ in info.payload.ops
        ):  # (a pooling window has the same maps, but no product: a reduction)
            return OpKind.CONVOLUTION
        names = {name for name, _, _ in info.payload.ops}
        if scan.BODY_OPS <= names and scan.recognize(g) is not None:
            return OpKind.SCAN
        if scatter.BODY_OPS <= names and scatter.recognize(g) is not None:
            return OpKind.SCATTER
        return OpKind.REDUCTION
    if not all(m.is_permutation for m in info.output_maps):
        return OpKind.OPAQUE
    tensor_inputs = [m for v, m in zip(inputs, info.input_maps) if isinstance(v.type, ir.ShapedType)]
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
    captures = False
    for inner in block.operations:
        operand_ids = [ids.get(v, -1) for v in inner.operands]  # -1: a value from outside
        captures = captures or -1 in operand_ids or len(inner.regions) > 0
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
    return Payload(n_in, n_out, ops, yields, used, captures)


def _shape(t: ir.Type) -> list[int]:
    if isinstance(t, ir.ShapedType):
        return list(t.shape) if t.has_rank else []
    return []


def _result_domain(op: ir.Operation) -> tuple[int, ...]:
    return tuple(_shape(op.results[0].type)) if len(op.results) else ()


def _is_dynamic(t: ir.Type) -> bool:
    """A shaped type without a static shape."""
    return _memoized("dynamic", t, lambda x: isinstance(x, ir.ShapedType)
                     and not (x.has_rank and x.has_static_shape))


def element_bytes(t: ir.Type) -> int:
    """Bytes per element of a shaped type (or of a scalar type)."""
    return _memoized("element bytes", t, _element_bytes)


def _element_bytes(t: ir.Type) -> int:
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
    return _memoized("tensor bytes", t, _tensor_bytes)


def _tensor_bytes(t: ir.Type) -> int:
    if not isinstance(t, ir.ShapedType):
        return 0
    if not t.has_static_shape:
        return 0
    n = 1
    for d in t.shape:
        n *= d
    return n * element_bytes(t)
