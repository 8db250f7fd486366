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

This module holds :class:`Evaluator`'s reads (values, parameters, loads and stores, data
movement); :mod:`.evaluate_payload` its payload and reduction methods (its base class),
:mod:`.evaluate_values` the value types and index helpers, :mod:`.evaluate_movement`
pads, inserted slices and placements.
"""

from __future__ import annotations

from typing import Sequence

from mlir import ir
from mlir.dialects import memref, scf, vector

from ....analysis import indexing
from ....analysis.indexing import (  # noqa: F401  (maps_of ... op_of: re-exported)
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
# Values, index helpers and the payload methods live in their own modules; every name is
# re-exported here.
from .evaluate_payload import PayloadEvaluation
from .evaluate_values import (  # noqa: F401
    Leaf,
    Val,
    _computed_from,
    _concat_parts,
    _shifted,
    canonical_index,
    generic_domain,
    loop_point,
    result_number,
)


class Evaluator(PayloadEvaluation):
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

    def atomic_add(self, leaf: Leaf, idx: Index, val: Val) -> None:
        """``leaf[idx] += val`` as one ``memref.atomic_rmw addf`` per lane (PTX ``red.add``):
        for results that several blocks sum into (their buffer zeroed before the launch)."""
        kb = self.kb
        flat = linearize(idx, leaf.shape)
        kind = ir.Attribute.parse("0 : i64", self.ctx)  # arith::AtomicRMWKind::addf
        lanes = self.lanes
        vec = self.as_vector(val) if lanes > 1 else val.ssa
        for lane in range(lanes):
            addr = kb.apply(flat if lanes == 1 else flat.compose(self._lane_map(lane)))
            with kb.emitting():
                x = vec if lanes == 1 else vector.extract(vec, [], [lane])
                memref.AtomicRMWOp(kind, x, leaf.mem, [addr])

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
