"""The payload half of the evaluator (see :mod:`.evaluate`): :class:`PayloadEvaluation`,
the base of :class:`~.evaluate.Evaluator` holding how a ``linalg.generic`` is evaluated at
a point.

Its payload is cloned op by op on the operands' values (scalar when every operand is
uniform, else on vectors), with ``linalg.index``, gathers (``tensor.extract`` at computed
coordinates) and scalars defined outside any payload; a reduction the emitter did not
preset is computed by a sequential ``scf.for`` nest per point (the fallback).
"""

from __future__ import annotations

from typing import Sequence

from mlir import ir
from mlir.dialects import memref, vector

from ....analysis.indexing import Index, compose, iterators_of, maps_of, n_inputs, op_of
from .evaluate_values import Val, _computed_from, generic_domain, loop_point, result_number
from .kernel import Unsupported
from .lanes import Kind


class PayloadEvaluation:
    """Evaluation of ``linalg.generic`` payloads, reductions and scalars: the methods of
    :class:`~.evaluate.Evaluator` (which derives from this class) that clone payload ops."""

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
