"""Reductions as loops with the accumulator in registers, vectorized.

``convert-linalg-to-loops`` turns a row reduction into ``out[i] = f(x[i, j], out[i])``:
a load and a store of ``out[i]`` in every iteration of the inner loop, which LLVM can
neither keep in a register (it cannot prove that ``out`` and ``x`` do not overlap) nor
vectorize. That left every row kernel (softmax, layernorm, x - mean(x)) reducing one
element at a time.

This rewrite (on buffers, before ``convert-linalg-to-loops``) lowers each
``linalg.generic`` whose reduction loops are all inside its parallel ones to

    for the parallel loops:
        acc = out[...]                                   # once per output element
        vacc = for j in whole vectors (iter_args vacc):  # the body on vectors of the
                   combine(vacc, body(in[..., j:j+w]))   # host's width
        acc = reduce(vacc, acc)
        acc = for the remaining j (iter_args acc): combine(acc, body(in[..., j]))
        out[...] = acc

The vector loop is built when there is one reduction loop, the body is elementwise
``arith``/``math`` ops, each output's yield is one combiner of its accumulator (add, mul,
max, min, and, or, ...) and each input is contiguous or constant along the reduction;
otherwise the scalar loop alone runs (its float additions and multiplications marked
``reassoc`` so that LLVM may still vectorize it). Vector lanes hold partial results
combined at the end: the summation order IREE and every BLAS use; results change in the
last bits only. ``maximumf``/``minimumf`` keep their NaN propagation (their vector forms
are exact).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import affine, arith, memref, scf, vector

from .target import host_cpu

_REASSOC = ("arith.addf", "arith.mulf")

#: Combiner op -> (vector.reduction kind, identity: a float, an int, or "min"/"max" of the
#: integer type).
_COMBINERS = {
    "arith.addf": ("add", -0.0), "arith.mulf": ("mul", 1.0),
    "arith.maximumf": ("maximumf", float("-inf")), "arith.minimumf": ("minimumf", float("inf")),
    "arith.maxnumf": ("maxnumf", float("nan")), "arith.minnumf": ("minnumf", float("nan")),
    "arith.addi": ("add", 0), "arith.muli": ("mul", 1), "arith.andi": ("and", -1),
    "arith.ori": ("or", 0), "arith.xori": ("xor", 0),
    "arith.maxsi": ("maxsi", "min"), "arith.minsi": ("minsi", "max"),
}


def lower_reductions(module: ir.Module) -> int:
    """Rewrite every eligible ``linalg.generic`` on memrefs in ``module``; returns how
    many."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.generic" and _eligible(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        _lower(op)
    return len(found)


def _iterators(op: ir.Operation) -> list[str]:
    return [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _eligible(op: ir.Operation) -> bool:
    its = _iterators(op)
    if "reduction" not in its:
        return False
    first = its.index("reduction")
    if any(it != "reduction" for it in its[first:]):
        return False  # a parallel loop inside a reduction: convert-linalg-to-loops is fine
    if any(not isinstance(v.type, ir.MemRefType) for v in op.operands):
        return False
    if len(op.regions[0].blocks) != 1:
        return False
    n_out = len(op.operands) - _num_inputs(op)
    maps = _maps(op)
    # each output indexed by parallel loops only (its element is fixed in the inner loops)
    for amap in maps[len(maps) - n_out:]:
        for e in amap.results:
            if not _uses_only(e, first):
                return False
    return True


def _num_inputs(op: ir.Operation) -> int:
    sizes = ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])
    return int(sizes[0])


def _uses_only(expr: ir.AffineExpr, n_dims: int) -> bool:
    """Whether ``expr`` uses only dims below ``n_dims``."""
    if isinstance(expr, ir.AffineDimExpr):
        return expr.position < n_dims
    if isinstance(expr, (ir.AffineConstantExpr, ir.AffineSymbolExpr)):
        return True
    if isinstance(expr, ir.AffineBinaryExpr):
        return _uses_only(expr.lhs, n_dims) and _uses_only(expr.rhs, n_dims)
    return False


def loop_bounds(op: ir.Operation, maps: list[ir.AffineMap]) -> list[ir.Value]:
    """Upper bound of each loop: a dimension of an operand indexed by that loop alone."""
    n = maps[0].n_dims
    bounds: list[ir.Value | None] = [None] * n
    for operand, amap in zip(op.operands, maps):
        for k, e in enumerate(amap.results):
            if isinstance(e, ir.AffineDimExpr) and bounds[e.position] is None:
                t = ir.MemRefType(operand.type)
                if t.shape[k] != ir.ShapedType.get_dynamic_size():
                    bounds[e.position] = arith.constant(ir.IndexType.get(), t.shape[k])
                else:
                    idx = arith.constant(ir.IndexType.get(), k)
                    bounds[e.position] = memref.dim(operand, idx)
    if any(b is None for b in bounds):
        raise ValueError("a loop with no operand dimension")
    return bounds  # type: ignore[return-value]


def map_indices(amap: ir.AffineMap, ivs: list[ir.Value]) -> list[ir.Value]:
    out = []
    for e in amap.results:
        if isinstance(e, ir.AffineDimExpr):
            out.append(ivs[e.position])
        elif isinstance(e, ir.AffineConstantExpr):
            out.append(arith.constant(ir.IndexType.get(), e.value))
        else:
            single = ir.AffineMap.get(amap.n_dims, amap.n_symbols, [e])
            out.append(affine.apply(single, ivs))
    return out


def _lower(op: ir.Operation) -> None:
    ctx = op.context
    maps = _maps(op)
    its = _iterators(op)
    n_par = its.index("reduction")
    n_in = _num_inputs(op)
    ins, outs = list(op.operands)[:n_in], list(op.operands)[n_in:]
    body = op.regions[0].blocks[0]
    old_yield = list(body.operations)[-1]
    with ctx, op.location:
        index = ir.IndexType.get()
        ip = ir.InsertionPoint(op)
        with ip:
            zero = arith.constant(index, 0)
            one = arith.constant(index, 1)
            bounds = loop_bounds(op, maps)
        ivs: list[ir.Value] = []
        for d in range(n_par):  # the parallel loops, nested
            with ip:
                loop = scf.ForOp(zero, bounds[d], one)
            with ir.InsertionPoint(loop.body):
                terminator = scf.YieldOp([])
            ivs.append(loop.induction_variable)
            ip = ir.InsertionPoint(terminator)
        with ip:
            carried = [memref.load(o, map_indices(m, ivs)) for o, m in zip(outs, maps[n_in:])]
        store_ip = ip
        start = {}
        vplan = _vector_plan(op, maps, n_par, n_in) if len(its) == n_par + 1 else None
        if vplan is not None:  # whole vectors first; the scalar loop does the remainder
            with ip:
                carried, start[n_par] = _vector_loop(vplan, op, maps, ivs, bounds[n_par], carried)
        reductions = []
        for d in range(n_par, len(its)):  # the reduction loops, carrying the accumulators
            with ip:
                loop = scf.ForOp(start.get(d, zero), bounds[d], one, carried)
            reductions.append(loop)
            ivs.append(loop.induction_variable)
            carried = list(loop.inner_iter_args)
            ip = ir.InsertionPoint(loop.body)
        with ip:
            loads = [memref.load(v, map_indices(m, ivs)) for v, m in zip(ins, maps[:n_in])]
            inner_yield = scf.YieldOp(list(old_yield.operands))
        # the generic's body moves into the innermost loop, its arguments now values
        for arg, value in zip(list(body.arguments), loads + carried):
            arg.replace_all_uses_with(value)
        for inner in list(body.operations)[:-1]:
            inner.move_before(inner_yield)
            if inner.name == "linalg.index":
                dim = ir.IntegerAttr(inner.attributes["dim"]).value
                inner.results[0].replace_all_uses_with(ivs[dim])
                inner.erase()
        for outer, inner_loop in zip(reversed(reductions[:-1]), reversed(reductions[1:])):
            with ir.InsertionPoint(outer.body):
                scf.YieldOp(list(inner_loop.results))
        with store_ip:
            for value, o, m in zip(reductions[0].results, outs, maps[n_in:]):
                memref.store(value, o, map_indices(m, ivs[:n_par]))
    _mark_reassoc(reductions[-1])
    op.erase()


@dataclass
class _VectorPlan:
    """How to vectorize the innermost (only) reduction loop of one generic."""

    lanes: int
    inputs: list[str]  # per input: "contiguous" (vector load) or "invariant" (broadcast)
    combiners: list[ir.Operation]  # per output: the op combining its accumulator


def _element(t: ir.Type) -> ir.Type:
    return t.element_type if isinstance(t, (ir.MemRefType, ir.VectorType)) else t


def _bits(t: ir.Type) -> int | None:
    t = _element(t)
    if isinstance(t, ir.FloatType):
        return t.width
    if isinstance(t, ir.IntegerType):
        return t.width
    return None


def _vector_plan(op: ir.Operation, maps, n_par: int, n_in: int) -> _VectorPlan | None:
    """A plan when every body op is elementwise arith/math, every output's yield is one
    combiner of its accumulator, and every input is contiguous or constant along the
    reduction loop; else None (the scalar loop alone)."""
    body = op.regions[0].blocks[0]
    ops = list(body.operations)
    args = list(body.arguments)
    bits = [_bits(a.type) for a in args]
    for inner in ops[:-1]:
        if not inner.name.startswith(("arith.", "math.")) or len(inner.regions):
            return None
        bits += [_bits(r.type) for r in inner.results]
    if any(b is None for b in bits):
        return None
    lanes = host_cpu().vector_bits // max(max(bits), 8)
    if lanes < 2:
        return None
    red = n_par  # the reduction loop's position
    inputs = []
    for v, amap in zip(list(op.operands)[:n_in], maps[:n_in]):
        uses = [k for k, e in enumerate(amap.results) if not _uses_only(e, red)]
        if not uses:
            inputs.append("invariant")
            continue
        last = amap.results[-1]
        strides, _ = ir.MemRefType(v.type).get_strides_and_offset()
        if (uses != [len(amap.results) - 1] or not isinstance(last, ir.AffineDimExpr)
                or last.position != red or strides[-1] != 1):
            return None
        inputs.append("contiguous")
    combiners = []
    accs = args[n_in:]
    for acc, value in zip(accs, list(ops[-1].operands)):
        comb = value.owner
        if isinstance(comb, ir.Block) or comb.name not in _COMBINERS:
            return None
        uses = list(acc.uses)
        if len(uses) != 1 or uses[0].owner != comb or acc not in list(comb.operands):
            return None
        combiners.append(comb)
    return _VectorPlan(lanes, inputs, combiners)


def _identity(kind_identity, t: ir.Type) -> ir.Attribute:
    if isinstance(t, ir.FloatType):
        return ir.FloatAttr.get(t, float(kind_identity))
    width = ir.IntegerType(t).width
    value = {"min": -(1 << (width - 1)), "max": (1 << (width - 1)) - 1}.get(kind_identity,
                                                                          kind_identity)
    return ir.IntegerAttr.get(t, value)


def _vector_loop(plan: _VectorPlan, op: ir.Operation, maps, ivs, bound, inits):
    """Emit ``for j in [0, n - n % lanes) step lanes`` with vector accumulators, reduce
    them into ``inits``; returns the scalar accumulators and where the scalar loop starts."""
    n_in = len(plan.inputs)
    body = op.regions[0].blocks[0]
    ops = list(body.operations)
    args = list(body.arguments)
    index = ir.IndexType.get()
    lanes = arith.constant(index, plan.lanes)
    zero = arith.constant(index, 0)
    whole = arith.subi(bound, arith.remui(bound, lanes))
    vt = lambda t: ir.VectorType.get([plan.lanes], _element(t))  # noqa: E731
    # values that do not change along the reduction: loaded (inputs) once, before the loop
    invariant: dict = {}
    for k, (v, amap) in enumerate(zip(list(op.operands)[:n_in], maps[:n_in])):
        if plan.inputs[k] == "invariant":
            invariant[k] = memref.load(v, map_indices(amap, ivs))
    vinits = []
    for comb, init in zip(plan.combiners, inits):
        kind, ident = _COMBINERS[comb.name]
        attr = ir.DenseElementsAttr.get_splat(vt(init.type), _identity(ident, init.type))
        vinits.append(arith.constant(vt(init.type), attr))
    loop = scf.ForOp(zero, whole, lanes, vinits)
    with ir.InsertionPoint(loop.body):
        j = loop.induction_variable
        vmap: dict = {}
        for k, (v, amap) in enumerate(zip(list(op.operands)[:n_in], maps[:n_in])):
            if plan.inputs[k] == "invariant":
                vmap[args[k]] = vector.broadcast(vt(args[k].type), invariant[k])
            else:
                vmap[args[k]] = vector.load(vt(args[k].type), v, map_indices(amap, ivs + [j]))

        def vec(value: ir.Value) -> ir.Value:
            if value not in vmap:  # defined outside the body: the same in every lane
                vmap[value] = vector.broadcast(vt(value.type), value)
            return vmap[value]

        accs = dict(zip(args[n_in:], loop.inner_iter_args))
        combined = {}
        for inner in ops[:-1]:
            if inner.name == "arith.constant":
                t = vt(inner.results[0].type)
                splat = ir.DenseElementsAttr.get_splat(t, inner.attributes["value"])
                vmap[inner.results[0]] = arith.constant(t, splat)
                continue
            operands = [accs[o] if o in accs else vec(o) for o in inner.operands]
            attributes = {name: inner.attributes[name] for name in inner.attributes}
            new = ir.Operation.create(inner.name, results=[vt(r.type) for r in inner.results],
                                      operands=operands, attributes=attributes)
            for old, r in zip(inner.results, new.results):
                vmap[old] = r
            if inner in plan.combiners:
                combined[inner] = new.results[0]
        scf.YieldOp([combined[c] for c in plan.combiners])
    reduced = []
    for comb, vacc, init in zip(plan.combiners, loop.results, inits):
        kind = _COMBINERS[comb.name][0]
        r = vector.ReductionOp(init.type, ir.Attribute.parse(f"#vector.kind<{kind}>"), vacc, acc=init)
        if isinstance(init.type, ir.FloatType):  # a tree of adds, not 16 in a row
            r.operation.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc>")
        reduced.append(r.result)
    return reduced, whole


def _mark_reassoc(loop) -> None:
    ctx = loop.operation.context

    def visit(o: ir.Operation) -> ir.WalkResult:
        if o.name in _REASSOC:
            o.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc>", ctx)
        return ir.WalkResult.ADVANCE

    loop.operation.walk(visit)
