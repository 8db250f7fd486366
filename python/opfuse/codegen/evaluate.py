"""Pull-based evaluation of a fusion function inside a kernel.

A fused group is a tensor-level function; a kernel computes its outputs one point (or one
vector of points) at a time. :class:`Evaluator` turns "the value of tensor ``%t`` at index
``(e0, e1, ...)``" into scalar or vector SSA values inside the kernel being built, pulling
through the producers: a ``linalg.generic`` is evaluated by composing its indexing maps
with the index and cloning its payload, reshapes and slices compose index expressions, a
concat branches to the input the index falls in, function arguments are loads. Index
expressions are affine expressions over the kernel's index variables
(``KernelBuilder.dims``), so layouts (transposes, reshapes, broadcasts) never materialize:
they become address arithmetic.

Each value is computed once per index and scope (memoized), so a producer read twice at
the same index is computed once; values that do not vary along the thread's vector dim are
kept scalar ("uniform") and broadcast only where they meet vector values.

Reductions are either preset by the emitter (row kernels, matmul accumulators) or, where
the emitter allows it (the fallback), computed by a sequential ``scf.for`` per point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mlir import ir
from mlir.dialects import memref, scf, vector

from ..analysis import indexing
from ..analysis.indexing import (  # noqa: F401  (maps_of ... op_of: re-exported)
    Index,
    compose,
    iterators_of,
    linearize,
    maps_of,
    n_inputs,
    op_of,
)
from .kernel import KernelBuilder, Unsupported, element_bytes, shape_of
from . import evaluate_movement as movement
from .lanes import Kind, analyze, lane_map


@dataclass(frozen=True)
class Val:
    """A value in the kernel: a scalar (``uniform``: the same for every lane) or a vector
    with one element per lane of the thread's vector dim."""

    ssa: ir.Value
    uniform: bool


@dataclass(frozen=True)
class Leaf:
    """A tensor that lives in a kernel parameter: the (flat) memref and the shape it is
    read with (a reshape of a parameter is the same bytes with another shape)."""

    mem: ir.Value
    shape: tuple[int, ...]
    element_type: ir.Type


def result_number(v: ir.Value) -> int:
    return ir.OpResult(v).result_number


def generic_domain(op: ir.Operation) -> list[int]:
    """Loop sizes of a ``linalg.generic`` from its operands' static shapes."""
    maps = maps_of(op)
    dom: list[int | None] = [None] * maps[0].n_dims
    for value, amap in zip(op.operands, maps):
        if not isinstance(value.type, ir.ShapedType):
            continue
        for size, res in zip(shape_of(value.type), amap.results):
            res = res.maybe_downcast()
            if isinstance(res, ir.AffineDimExpr):
                dom[res.position] = size
    if any(d is None for d in dom):
        raise Unsupported("a loop of a linalg.generic has no static size")
    return dom  # type: ignore[return-value]


class Evaluator:
    """Evaluates tensors of ``func`` (a prepared fusion function) inside kernel ``kb``.

    Args:
        kb: the kernel being built.
        func: the fusion function, generalized (every linalg op a ``linalg.generic``).
        leaves: kernel memref for each function argument (by argument number).
        lanes: elements per thread along ``vdim`` (1: scalar code).
        vdim: the index variable(s) (positions in ``kb.dims``) the lanes run along.
        sequential: allow reductions to be computed by a loop per point (fallback).
    """

    def __init__(
        self,
        kb: KernelBuilder,
        func: ir.Operation,
        leaves: dict[int, ir.Value],
        *,
        lanes: int = 1,
        vdim=None,
        sequential: bool = False,
    ):
        self.kb = kb
        self.func = func
        self.ctx = func.context
        self.entry = func.regions[0].blocks[0]
        self.leaves = leaves
        if isinstance(vdim, int):
            vdim = frozenset([vdim])
        self.vdim: frozenset[int] = frozenset(vdim or ())
        self.lanes = lanes
        self.sequential = sequential
        #: Let LLVM contract multiply-adds into FMAs in the ops emitted while set (the
        #: matmul's inner product: twice the flops per instruction, a more accurate sum).
        self.contract = False

    # ----- public ------------------------------------------------------------------------
    def value(self, v: ir.Value, idx: Sequence[ir.AffineExpr]) -> Val:
        """The value of tensor ``v`` at ``idx`` (one affine expression per dim of ``v``)."""
        idx = self.canonical(v, idx)
        key = ("v", v, idx)
        hit = self.kb.memo_get(key)
        if hit is not None:
            return hit
        leaf = self.leaf(v)
        if leaf is not None:
            val = self.load(leaf, idx)
        else:
            val = self._op_value(v, idx)
        self.kb.memo_set(key, val)
        return val

    def preset(
        self, v: ir.Value, idx: Sequence[ir.AffineExpr], val: Val, *, outer: bool = False
    ) -> None:
        """Declare the value of ``v`` at ``idx`` (a reduction the emitter computed)."""
        key = ("v", v, self.canonical(v, idx))
        if outer:
            self.kb.memo_set_outer(key, val)
        else:
            self.kb.memo_set(key, val)

    def canonical(self, v: ir.Value, idx: Sequence[ir.AffineExpr]) -> Index:
        """``idx`` with ``0`` at every size-1 dim of ``v``: see :func:`canonical_index`."""
        return canonical_index(v, idx, self.ctx)

    def addresses(self, v: ir.Value, idx: Sequence[ir.AffineExpr], n_dims: int) -> list | None:
        """The flat element offsets (affine expressions over ``n_dims`` dims) of every
        parameter read to compute ``v`` at ``idx``, emitting nothing; None when a
        reduction or an op the evaluator does not know is on the way. The matmul emitter
        uses it to find the loop along which an operand's bytes are consecutive."""
        leaf = self.leaf(v)
        if leaf is not None:
            return [linearize(idx, leaf.shape)]
        op = op_of(v)
        if op is None:
            return None
        if op.name == "tensor.expand_shape":
            return self.addresses(op.operands[0], self._expand_source(op, idx), n_dims)
        if op.name == "tensor.collapse_shape":
            return self.addresses(op.operands[0], self._collapse_source(op, idx), n_dims)
        if op.name == "tensor.extract_slice" and len(op.operands) == 1:
            return self.addresses(op.operands[0], self._slice_source(op, idx), n_dims)
        if op.name == "tensor.reshape":
            return self.addresses(op.operands[0], self._reshape_source(op, idx), n_dims)
        if op.name == "tensor.concat":  # every input, as if each covered the whole axis
            axis, starts = _concat_parts(op)
            found: list = []
            for operand, start in zip(op.operands, starts):
                sub = self.addresses(operand, _shifted(idx, axis, start), n_dims)
                if sub is None:
                    return None
                found.extend(sub)
            return found
        if op.name == "arith.constant":
            return []
        if op.name != "linalg.generic" or "reduction" in iterators_of(op):
            return None
        maps = maps_of(op)
        n_in = n_inputs(op)
        try:
            point = loop_point(maps[n_in + result_number(v)], idx)
        except Unsupported:
            return None
        found: list = []
        for j in range(n_in):
            operand = op.operands[j]
            if not isinstance(operand.type, ir.ShapedType):
                continue
            sub = self.addresses(operand, compose(maps[j], point, n_dims, self.ctx), n_dims)
            if sub is None:
                return None
            found.extend(sub)
        return found

    def source(self, v: ir.Value, idx: Sequence[ir.AffineExpr]) -> tuple[Leaf, Index] | None:
        """The parameter element ``v[idx]`` is a copy of, emitting nothing: ``(leaf,
        index)`` when ``v`` is a parameter seen through reshapes, slices and generics
        whose payload yields one of their inputs unchanged (transposes, broadcasts);
        None when computing ``v`` takes arithmetic. The tensor-core matmul copies such
        operands straight from global to shared memory (``cp.async``)."""
        idx = tuple(idx)
        leaf = self.leaf(v)
        if leaf is not None:
            return leaf, idx
        op = op_of(v)
        if op is None:
            return None
        if op.name == "tensor.expand_shape":
            return self.source(op.operands[0], self._expand_source(op, idx))
        if op.name == "tensor.collapse_shape":
            return self.source(op.operands[0], self._collapse_source(op, idx))
        if op.name == "tensor.extract_slice" and len(op.operands) == 1:
            return self.source(op.operands[0], self._slice_source(op, idx))
        if op.name == "tensor.reshape":
            return self.source(op.operands[0], self._reshape_source(op, idx))
        if op.name != "linalg.generic" or "reduction" in iterators_of(op):
            return None
        block = op.regions[0].blocks[0]
        yielded = [o.operation for o in block.operations][-1].operands[result_number(v)]
        n_in = n_inputs(op)
        if not isinstance(yielded.owner, ir.Block) or yielded.owner != block:
            return None
        j = ir.BlockArgument(yielded).arg_number
        if j >= n_in or not isinstance(op.operands[j].type, ir.ShapedType):
            return None
        maps = maps_of(op)
        try:
            point = loop_point(maps[n_in + result_number(v)], idx)
        except Unsupported:
            return None
        return self.source(op.operands[j], compose(maps[j], point, len(self.kb.dims), self.ctx))

    def placement(self, v: ir.Value, target: ir.Value) -> list[list[int]] | None:
        """Where output ``v`` sits on ``target``: see :func:`evaluate_movement.placement`."""
        return movement.placement(self, v, target)

    def lanes_of(self, e: ir.AffineExpr):
        return analyze(e, self.vdim, self.lanes)

    def invariant(self, idx: Sequence[ir.AffineExpr]) -> bool:
        return all(self.lanes_of(e).kind == Kind.INVARIANT for e in idx)

    def leaf(self, v: ir.Value) -> Leaf | None:
        """The parameter ``v`` lives in, seen through reshapes; None if it is computed."""
        key = ("leaf", v)
        hit = self.kb.memo_get(key)
        if hit is not None:
            return hit or None
        found: Leaf | None = None
        op = op_of(v)
        if op is None:
            arg = ir.BlockArgument(v)
            if arg.owner == self.entry and arg.arg_number in self.leaves:
                t = ir.ShapedType(v.type)
                found = Leaf(self.leaves[arg.arg_number], tuple(t.shape), t.element_type)
        elif op.name in ("tensor.expand_shape", "tensor.collapse_shape"):
            src = self.leaf(op.operands[0])
            if src is not None:
                found = Leaf(src.mem, shape_of(v.type), src.element_type)
        self.kb.memo_set_outer(key, found or False)
        return found

    # ----- memory ------------------------------------------------------------------------
    def load(self, leaf: Leaf, idx: Index) -> Val:
        elem = leaf.element_type
        if isinstance(elem, ir.IntegerType) and elem.width == 1:
            raise Unsupported("i1 tensors in device memory (store booleans as i8)")
        flat = linearize(idx, leaf.shape)
        kb = self.kb
        la = self.lanes_of(flat)
        if self.lanes == 1 or la.kind == Kind.INVARIANT:
            with kb.emitting():
                return Val(memref.load(leaf.mem, [kb.apply(flat)]), True)
        vt = self._vt(elem)
        if la.kind == Kind.CONTIG:
            align = element_bytes(elem) * (self.lanes if la.aligned else 1)
            addr = kb.apply(flat)
            with kb.emitting():
                return Val(vector.load(vt, leaf.mem, [addr], alignment=align), False)
        elems = []
        for lane in range(self.lanes):
            addr = kb.apply(flat.compose(self._lane_map(lane)))
            with kb.emitting():
                elems.append(memref.load(leaf.mem, [addr]))
        with kb.emitting():
            return Val(vector.from_elements(vt, elems), False)

    def store(self, leaf: Leaf, idx: Index, val: Val) -> None:
        kb = self.kb
        flat = linearize(idx, leaf.shape)
        la = self.lanes_of(flat)
        if self.lanes == 1 or (val.uniform and la.kind == Kind.INVARIANT):
            addr = kb.apply(flat)
            with kb.emitting():
                memref.store(val.ssa, leaf.mem, [addr])
            return
        vec = self.as_vector(val)
        if la.kind == Kind.CONTIG:
            align = element_bytes(leaf.element_type) * (self.lanes if la.aligned else 1)
            addr = kb.apply(flat)
            with kb.emitting():
                vector.store(vec, leaf.mem, [addr], alignment=align)
            return
        for lane in range(self.lanes):
            addr = kb.apply(flat.compose(self._lane_map(lane)))
            with kb.emitting():
                x = vector.extract(vec, [], [lane])
                memref.store(x, leaf.mem, [addr])

    def as_vector(self, val: Val) -> ir.Value:
        if not val.uniform or self.lanes == 1:
            return val.ssa
        vt = self._vt(val.ssa.type)
        key = ("bcast", val.ssa, self.lanes)  # evaluators of one kernel may differ in lanes
        hit = self.kb.memo_get(key)
        if hit is None:
            with self.kb.emitting():
                hit = vector.broadcast(vt, val.ssa)
            self.kb.memo_set(key, hit)
        return hit

    def _vt(self, elem: ir.Type) -> ir.VectorType:
        return ir.VectorType.get([self.lanes], elem, loc=ir.Location.unknown(self.ctx))

    def _lane_map(self, lane: int) -> ir.AffineMap:
        return lane_map(len(self.kb.dims), self.vdim, lane, self.ctx)

    # ----- ops -----------------------------------------------------------------------------
    def _op_value(self, v: ir.Value, idx: Index) -> Val:
        op = op_of(v)
        if op is None:
            raise Unsupported("a function argument without a kernel parameter")
        name = op.name
        if name == "linalg.generic":
            return self._generic(op, result_number(v), idx)
        if name == "tensor.expand_shape":
            return self.value(op.operands[0], self._expand_source(op, idx))
        if name == "tensor.collapse_shape":
            return self.value(op.operands[0], self._collapse_source(op, idx))
        if name == "tensor.extract_slice":
            return self.value(op.operands[0], self._slice_source(op, idx))
        if name == "tensor.reshape":
            return self.value(op.operands[0], self._reshape_source(op, idx))
        if name == "tensor.concat":
            return self._concat(op, idx)
        if name == "tensor.pad":
            return movement.pad(self, op, idx)
        if name == "tensor.insert_slice":
            return movement.insert_slice(self, op, idx)
        if name == "arith.constant":
            attr = op.attributes["value"]
            if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
                return Val(self.kb.const_attr(attr.get_splat_value()), True)
            raise Unsupported("a dense non-splat constant inside a kernel")
        raise Unsupported(f"'{name}' inside a kernel")

    def _expand_source(self, op: ir.Operation, idx: Index) -> Index:
        return indexing.expand_source(op, idx)

    def _collapse_source(self, op: ir.Operation, idx: Index) -> Index:
        return indexing.collapse_source(op, idx)

    def _reshape_source(self, op: ir.Operation, idx: Index) -> Index:
        src = indexing.reshape_source(op, idx)
        if src is None:
            raise Unsupported("tensor.reshape with a dynamic shape")
        return src

    def _slice_source(self, op: ir.Operation, idx: Index) -> Index:
        try:
            return indexing.slice_source(op, idx)
        except ValueError as e:
            raise Unsupported(str(e)) from None

    def _concat(self, op: ir.Operation, idx: Index) -> Val:
        """The value of the ``tensor.concat`` input whose range along the axis holds ``idx``.

        When all lanes of the thread fall in one input (the axis index is the same in every
        lane, or runs contiguously from a multiple of V and every boundary is a multiple of
        V), a chain of ``scf.if`` on the first lane's index picks the input, and each branch
        reads its own input only, inside its bounds. Otherwise (a boundary inside a vector:
        ``cat`` of widths 3 and 5 read 4 lanes at a time; a gathered axis) each lane is
        picked and read on its own, as a scalar.
        """
        axis, starts = _concat_parts(op)
        la = self.lanes_of(idx[axis])
        whole = la.kind == Kind.CONTIG and la.aligned and all(s % self.lanes == 0 for s in starts)
        if self.lanes == 1 or la.kind == Kind.INVARIANT or whole:
            return self._concat_branches(op, axis, starts, idx)
        return movement.per_lane(self, op.results[0], idx, "tensor.concat")

    def _concat_branches(self, op: ir.Operation, axis: int, starts: list[int], idx: Index) -> Val:
        """``scf.if idx[axis] < start[1] {input 0} else if ... else {input n-1}``, decided
        on the first lane's index (all lanes fall in the same input)."""
        kb = self.kb
        uniform = self.lanes == 1 or self.invariant(idx)
        elem = ir.ShapedType(op.results[0].type).element_type
        result_type = elem if uniform else self._vt(elem)
        first = kb.apply(idx[axis])

        def part(i: int) -> ir.Value:
            val = self.value(op.operands[i], _shifted(idx, axis, starts[i]))
            if uniform and not val.uniform:
                raise Unsupported("a tensor.concat input that varies across lanes")
            return val.ssa if uniform else self.as_vector(val)

        def chain(i: int) -> ir.Value:
            if i == len(starts) - 1:
                return part(i)
            cond = kb.cmp_lt(first, kb.index(starts[i + 1]))
            with kb.emitting():
                branch = scf.IfOp(cond, [result_type], has_else=True)
            with kb.at(ir.InsertionPoint(branch.then_block)):
                scf.YieldOp([part(i)])
            with kb.at(ir.InsertionPoint(branch.else_block)):
                scf.YieldOp([chain(i + 1)])
            return branch.results[0]

        return Val(chain(0), uniform)

    def _generic(self, op: ir.Operation, r: int, idx: Index) -> Val:
        its = iterators_of(op)
        maps = maps_of(op)
        n_in = n_inputs(op)
        if "reduction" not in its:
            point = loop_point(maps[n_in + r], idx)
            vals = self.payload(op, point)
            for k, res in enumerate(op.results):
                if k != r:
                    kidx = compose(maps[n_in + k], point, len(self.kb.dims), self.ctx)
                    self.kb.memo_set(("v", res, self.canonical(res, kidx)), vals[k])
            return vals[r]
        if not self.sequential:
            raise Unsupported("a reduction this kernel does not compute")
        return self._sequential_reduction(op, r, idx)

    def payload(
        self,
        op: ir.Operation,
        point: Sequence[ir.AffineExpr],
        outs: Sequence[Val] | None = None,
        *,
        upto: ir.Operation | None = None,
        extra: dict | None = None,
    ) -> list[Val]:
        """Evaluate the payload of generic ``op`` at loop point ``point``.

        Args:
            outs: values for the ``outs`` block arguments (reduction accumulators); by
                default they are read from the outs operands at their indexing maps.
            upto: stop before this payload op and return its operands' values instead;
                only the ops those are computed from are evaluated (the rows emitter's
                combiner of one result of several: the others' ops may read their
                accumulators, which have no value here).
            extra: preset values for payload SSA values (e.g. a partial result).
        """
        block = op.regions[0].blocks[0]
        needed = _computed_from(upto) if upto is not None else None
        maps = maps_of(op)
        n_in = n_inputs(op)
        n_dims = len(self.kb.dims)
        env: dict = dict(extra or {})

        def arg_val(j: int) -> Val:
            if j >= n_in and outs is not None:
                return outs[j - n_in]
            operand = op.operands[j]
            if not isinstance(operand.type, ir.ShapedType):
                return self.scalar(operand)
            return self.value(operand, compose(maps[j], point, n_dims, self.ctx))

        def get(x: ir.Value) -> Val:
            if x in env:
                return env[x]
            owner = x.owner
            if isinstance(owner, ir.Block) and owner == block:
                val = arg_val(ir.BlockArgument(x).arg_number)
            else:
                val = self.scalar(x)
            env[x] = val
            return val

        for inner in block.operations:
            inner = inner.operation
            if upto is not None and inner == upto:
                return [get(o) for o in inner.operands]
            if inner.name == "linalg.yield":
                return [get(o) for o in inner.operands]
            if needed is not None and inner.results and not any(r in needed for r in inner.results):
                continue
            if inner.name == "linalg.index":
                dim = ir.IntegerAttr(inner.attributes["dim"]).value
                env[inner.results[0]] = self.index_value(point[dim])
                continue
            if inner.name == "tensor.extract" and len(inner.operands) > 1:
                src, *coords = inner.operands
                env[inner.results[0]] = self.gather(src, [get(c) for c in coords])
                continue
            if inner.name == "cf.assert":
                # not checked on the GPU (no trap path in the kernels): the kernel's notes say
                # so; the CPU backend checks it
                msg = ir.StringAttr(inner.attributes["msg"]).value
                note = f"cf.assert '{msg}' is not checked in the kernel"
                if note not in self.kb.notes:
                    self.kb.notes.append(note)
                continue
            kept = self.bypassed(inner)
            if kept is not None:  # the op is its operand here: nothing else is evaluated
                env[inner.results[0]] = get(inner.operands[kept])
                continue
            vals = [get(o) for o in inner.operands]
            for res, val in zip(inner.results, self.emit(inner, vals)):
                env[res] = val
        raise Unsupported("a linalg.generic payload without linalg.yield")

    def bypassed(self, op: ir.Operation) -> int | None:
        """The operand payload op ``op`` is known to equal where this evaluator emits (an
        attention kernel's causal select on a tile below the diagonal), or None."""
        return None

    def gather(self, src: ir.Value, coords: Sequence[Val]) -> Val:
        """``tensor.extract src[coords]`` at data-dependent coordinates (a gather's body):
        a load from the kernel parameter ``src`` lives in at the row-major address of the
        coordinates, per lane when they differ between lanes. The coordinates are in range
        (the builder clamps them), and ``src`` is complete before the kernel starts (its
        producer never joins a gather's kernel)."""
        leaf = self.leaf(src)
        if leaf is None:
            raise Unsupported("a gather from a tensor computed in the same kernel")
        kb = self.kb
        strides = [1] * len(leaf.shape)
        for d in range(len(leaf.shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * leaf.shape[d + 1]

        def address(parts: list[ir.Value]) -> ir.Value:
            addr = None
            for c, stride in zip(parts, strides):
                term = c if stride == 1 else kb.create(
                    "arith.muli", [kb.index_type], [c, kb.index(stride)]).results[0]
                addr = term if addr is None else kb.create(
                    "arith.addi", [kb.index_type], [addr, term]).results[0]
            return addr if addr is not None else kb.index(0)

        if all(c.uniform for c in coords) or self.lanes == 1:
            with kb.emitting():
                return Val(memref.load(leaf.mem, [address([c.ssa for c in coords])]), True)
        elems = []
        for lane in range(self.lanes):
            with kb.emitting():
                parts = [c.ssa if c.uniform else vector.extract(c.ssa, [], [lane]) for c in coords]
            addr = address(parts)
            with kb.emitting():
                elems.append(memref.load(leaf.mem, [addr]))
        with kb.emitting():
            return Val(vector.from_elements(self._vt(leaf.element_type), elems), False)

    def emit(self, op: ir.Operation, vals: Sequence[Val]) -> list[Val]:
        """Clone scalar op ``op`` on ``vals``: scalar if all are uniform, else on vectors."""
        if len(op.regions) and any(len(r.blocks) for r in op.regions):
            raise Unsupported(f"'{op.name}' with regions in a payload")
        attrs = {op.attributes[i].name: op.attributes[i].attr for i in range(len(op.attributes))}
        if self.contract and "fastmath" in attrs:
            attrs["fastmath"] = ir.Attribute.parse("#arith.fastmath<contract>", self.ctx)
        if op.name == "arith.constant":
            return [Val(self.kb.const_attr(attrs["value"]), True)]
        if all(v.uniform for v in vals):
            new = self.kb.create(
                op.name, [r.type for r in op.results], [v.ssa for v in vals], attrs
            )
            return [Val(r, True) for r in new.results]
        operands = [self.as_vector(v) for v in vals]
        types = [self._vt(r.type) for r in op.results]
        new = self.kb.create(op.name, types, operands, attrs)
        return [Val(r, False) for r in new.results]

    def index_value(self, e: ir.AffineExpr) -> Val:
        kb = self.kb
        la = self.lanes_of(e)
        if self.lanes == 1 or la.kind == Kind.INVARIANT:
            return Val(kb.apply(e), True)
        vt = self._vt(kb.index_type)
        if la.kind == Kind.CONTIG:
            base = self.as_vector(Val(kb.apply(e), True))
            step = kb.const_attr(
                ir.DenseElementsAttr.get(
                    [ir.IntegerAttr.get(kb.index_type, i) for i in range(self.lanes)], type=vt
                )
            )
            with kb.emitting():
                return Val(
                    ir.Operation.create("arith.addi", results=[vt], operands=[base, step]).result,
                    False,
                )
        elems = [kb.apply(e.compose(self._lane_map(lane))) for lane in range(self.lanes)]
        with kb.emitting():
            return Val(vector.from_elements(vt, elems), False)

    def scalar(self, v: ir.Value) -> Val:
        """A scalar defined outside any payload (a constant, or arithmetic on constants)."""
        key = ("s", v)
        hit = self.kb.memo_get(key)
        if hit is not None:
            return hit
        op = op_of(v)
        if op is None:  # kernels take tensors: scalars between ops are cloned into them
            raise Unsupported("scalar kernel arguments")
        if op.name == "arith.constant":
            val = Val(self.kb.const_attr(op.attributes["value"]), True)
        elif op.name == "tensor.extract":
            val = self.value(op.operands[0], self._extract_position(op))
            if not val.uniform:
                raise Unsupported("a tensor.extract that varies across lanes")
        else:
            vals = [self.scalar(o) for o in op.operands]
            val = self.emit(op, vals)[result_number(v)]
        self.kb.memo_set(key, val)
        return val

    def _extract_position(self, op: ir.Operation) -> Index:
        """The indices of a ``tensor.extract`` between ops (scalar arithmetic a payload
        uses): affine constants where they are constants (every program's so far: exact
        addresses, one memo key), else a new index variable holding the computed scalar."""
        idx = []
        for v in list(op.operands)[1:]:
            owner = op_of(v)
            if owner is not None and owner.name == "arith.constant":
                value = ir.IntegerAttr(owner.attributes["value"]).value
                idx.append(ir.AffineConstantExpr.get(value, self.ctx))
            else:
                idx.append(self.kb.add_dim(self.scalar(v).ssa))
        return tuple(idx)

    # ----- sequential reductions (fallback) -----------------------------------------------
    def _sequential_reduction(self, op: ir.Operation, r: int, idx: Index) -> Val:
        kb = self.kb
        its = iterators_of(op)
        maps = maps_of(op)
        n_in = n_inputs(op)
        dom = generic_domain(op)
        point: list = [None] * len(its)
        for t, res in enumerate(maps[n_in + r].results):
            res = res.maybe_downcast()
            if not isinstance(res, ir.AffineDimExpr):
                raise Unsupported("a reduction whose output map is not a projection")
            point[res.position] = idx[t]
        red = [d for d, it in enumerate(its) if it == "reduction"]
        if any(point[d] is None for d, it in enumerate(its) if it != "reduction"):
            raise Unsupported("a reduction output that does not cover its parallel loops")
        uniform = self.invariant([p for p in point if p is not None])
        n_dims = len(kb.dims)
        out_idx = []
        for k in range(len(op.results)):
            m = maps[n_in + k]
            if any(
                isinstance(res, ir.AffineDimExpr) and res.position in red
                for res in (x.maybe_downcast() for x in m.results)
            ):
                raise Unsupported("a reduction output indexed by a reduction loop")
            filled = [p if p is not None else ir.AffineConstantExpr.get(0, self.ctx) for p in point]
            out_idx.append(compose(m, filled, n_dims, self.ctx))
        inits = [self.value(op.operands[n_in + k], out_idx[k]) for k in range(len(op.results))]
        init_ssa = [self.as_vector(v) if not uniform else v.ssa for v in inits]
        if uniform and any(not v.uniform for v in inits):
            raise Unsupported("a uniform reduction with a non-uniform initial value")

        def nest(level: int, accs: list[ir.Value]) -> list[ir.Value]:
            def body(iv, iter_args):
                point[red[level]] = kb.add_dim(iv)
                if level + 1 < len(red):
                    return nest(level + 1, iter_args)
                outs = [Val(a, uniform) for a in iter_args]
                res = self.payload(op, point, outs)
                return [x.ssa if (uniform or not x.uniform) else self.as_vector(x) for x in res]

            return kb.for_(kb.index(0), kb.index(dom[red[level]]), kb.index(1), accs, body)

        results = nest(0, init_ssa)
        for k, res in enumerate(op.results):
            self.kb.memo_set(("v", res, self.canonical(res, out_idx[k])), Val(results[k], uniform))
        return Val(results[r], uniform)


def _computed_from(op: ir.Operation) -> set[ir.Value]:
    """Every value ``op``'s operands are computed from, through the ops that define them."""
    seen: set[ir.Value] = set()
    stack = list(op.operands)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        owner = v.owner
        if not isinstance(owner, ir.Block):
            stack.extend((owner.operation if hasattr(owner, "operation") else owner).operands)
    return seen


def canonical_index(v: ir.Value, idx: Sequence[ir.AffineExpr], ctx: ir.Context) -> Index:
    """``idx`` with ``0`` at every size-1 dim of ``v`` (its only valid index), so that a
    value reached through reshapes that add or drop unit dims (``tensor<8x16xf32>``
    collapsed from ``1x8x16``) has one memo key however its index was written."""
    shape = shape_of(v.type) if isinstance(v.type, ir.ShapedType) else ()
    if 1 not in shape:
        return tuple(idx)
    zero = ir.AffineConstantExpr.get(0, ctx)
    return tuple(zero if d == 1 else e for e, d in zip(idx, shape))


def loop_point(out_map: ir.AffineMap, idx: Index) -> list[ir.AffineExpr]:
    """The loop point of a generic whose result (indexed by ``out_map``, a permutation)
    is read at ``idx``. Raises Unsupported for any other output map."""
    point = indexing.point_of(out_map, idx)
    if point is None:
        raise Unsupported("an output indexing map that is not a permutation of every loop")
    return point


def _concat_parts(op: ir.Operation) -> tuple[int, list[int]]:
    """The axis of a ``tensor.concat`` and where each input starts along it."""
    axis = ir.IntegerAttr(op.attributes["dim"]).value
    starts, at = [], 0
    for v in op.operands:
        t = ir.ShapedType(v.type)
        if not t.has_static_shape:
            raise Unsupported("tensor.concat with a dynamic shape")
        starts.append(at)
        at += t.shape[axis]
    return axis, starts


def _shifted(idx: Index, axis: int, start: int) -> Index:
    """``idx`` moved back by ``start`` along ``axis``."""
    return tuple(e - start if k == axis and start else e for k, e in enumerate(idx))
