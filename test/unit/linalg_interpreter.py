"""A numpy interpreter of linalg-on-tensors programs: the reference of test_random_linalg.

Independent of opfuse: the text is parsed by the upstream bindings alone (a fresh
``mlir.ir.Context``) and every op gets its semantics here, by hand. Named linalg ops are
not generalized through MLIR: ``linalg.matmul`` is an einsum over its indexing maps,
``linalg.transpose`` a numpy transpose, ``linalg.reduce`` a sequential fold of its region,
and so on. ``linalg.generic`` is evaluated from its definition: the loop domain from the
operands' shapes and indexing maps, every operand gathered at its map's indices over the
parallel loops (vectorized), the reduction loops run one point at a time in lexicographic
order, the payload interpreted op by op, the yields scattered through the output maps.

An op, element type or affine expression it has no semantics for raises
``NotImplementedError``: a program the reference cannot check fails loudly instead of
passing unchecked (the generator only writes what is modelled here).

Floats are computed in float64 whatever their declared width (``truncf`` is exact here),
integers in their own width with two's-complement wraparound, ``index`` as int64, i1 as
bool. Each value carries two more things besides its array:

* ``u``, the elements a near-tie decided: a comparison whose operands are within the tie
  tolerance of each other, or a float-to-int conversion of a value that close to an
  integer. A rounding difference between this float64 reference and the program's own
  types may flip such an element, so its dependants are not compared (the mask flows
  through every op, reductions included);
* ``s``, the largest magnitude of any value that flowed into it: the scale against which
  an absolute rounding error is judged (``x - y`` of two large values is small, and its
  error is not).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

import numpy as np
from mlir import ir

from linalg_interpreter_scalars import (
    ELEMENTWISE, V, cast, elem_name, is_float, np_dtype, scalar_op, scale_of, shape_of, wrap,
)

__all__ = ["Interpreter", "V", "structured"]


class Interpreter:
    """Runs one function of a module on numpy arrays.

    Args:
        text: the module's MLIR text.
        tie: relative tie tolerance of comparisons and float-to-int conversions (scaled
            by the operands' scale): wider for programs in narrower float types.
    """

    def __init__(self, text: str, *, tie: float = 1e-4):
        self.ctx = ir.Context()
        self.module = ir.Module.parse(text, self.ctx)
        self.tie = tie
        self.funcs = {}
        for op in self.module.body.operations:
            op = op.operation
            if op.name == "func.func":
                self.funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op

    def run(self, args: Sequence[np.ndarray], entry: str | None = None) -> list[V]:
        """The results of ``entry`` (default: the only function) on ``args`` (floats as
        float64 arrays of the exact input values)."""
        fn = self.funcs[entry] if entry else next(iter(self.funcs.values()))
        block = fn.regions[0].blocks[0]
        env: dict = {}
        for arg, a in zip(block.arguments, args):
            env[arg] = V.of(np.asarray(a).astype(np_dtype(elem_name(arg.type))))
        return self._block(block, env)

    # ----- blocks and ops ----------------------------------------------------------------
    def _block(self, block: ir.Block, env: dict) -> list[V]:
        for op in block.operations:
            op = op.operation
            if op.name in ("func.return", "linalg.yield", "tensor.yield"):
                return [env[v] for v in op.operands]
            results = self._op(op, env)
            for r, val in zip(op.results, results):
                env[r] = val
        raise ValueError("a block without a terminator")

    def _op(self, op: ir.Operation, env: dict) -> list[V]:
        name = op.name
        args = [env[v] for v in op.operands]
        if name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            fn = self.funcs[callee]
            inner = {a: v for a, v in zip(fn.regions[0].blocks[0].arguments, args)}
            return self._block(fn.regions[0].blocks[0], inner)
        if name.startswith("linalg."):
            return self._linalg(op, args, env)
        if name.startswith("tensor."):
            return [self._tensor(op, args, env)]
        return scalar_op(op, args, self.tie)

    # ----- linalg ------------------------------------------------------------------------
    def _linalg(self, op: ir.Operation, args: list[V], env: dict) -> list[V]:
        name = op.name[len("linalg."):]
        n_out = len(op.results)
        ins, outs = args[: len(args) - n_out], args[len(args) - n_out:]
        out_types = [r.type for r in op.results]
        out_elems = [elem_name(t) for t in out_types]
        if name == "generic":
            maps = _maps(op)
            iters = _iterators(op)
            body = op.regions[0].blocks[0]

            def payload(vals: list[V], index: Callable[[int], V]) -> list[V]:
                return self._payload(body, vals, index, env)

            return structured(maps, iters, ins, outs, out_types, payload)
        if name == "fill":
            return [_fill(ins[0], elem_name(op.operands[0].type), out_types[0])]
        if name in ("matmul", "batch_matmul", "batch_matmul_transpose_b", "matmul_transpose_b",
                    "matmul_transpose_a", "batch_reduce_matmul", "dot", "matvec", "vecmat",
                    "batch_matvec"):
            return [_contraction(op, name, ins, outs[0], out_elems[0])]
        if name == "transpose":
            perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
            x = ins[0]
            return [V(np.transpose(x.a, perm).copy(), np.transpose(x.u, perm).copy(), x.s)]
        if name == "broadcast":
            dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
            shape = shape_of(out_types[0])
            x = ins[0]
            a, u = x.a, x.u
            for d in sorted(dims):
                a, u = np.expand_dims(a, d), np.expand_dims(u, d)
            return [V(np.broadcast_to(a, shape).copy(), np.broadcast_to(u, shape).copy(), x.s)]
        if name == "copy":
            return [cast(ins[0], elem_name(op.operands[0].type), out_elems[0], self.tie)]
        if name == "reduce":
            return self._reduce(op, ins, outs, env)
        if name == "map":
            body = op.regions[0].blocks[0]
            rank = len(shape_of(out_types[0]))
            ident = ir.AffineMap.get_identity(rank, self.ctx)

            def payload(vals: list[V], index: Callable[[int], V]) -> list[V]:
                return self._payload(body, vals, index, env)

            return structured([ident] * (len(ins) + 1), ["parallel"] * rank, ins, outs,
                              out_types, payload)
        return [self._elementwise_named(op, name, ins, outs[0], out_types[0])]

    def _payload(self, body: ir.Block, vals: list[V], index: Callable[[int], V],
                 outer: dict) -> list[V]:
        env = dict(outer)  # values captured from the function body (scalars, tensors)
        for arg, v in zip(body.arguments, vals):
            env[arg] = v
        for inner in body.operations:
            inner = inner.operation
            if inner.name == "linalg.yield":
                return [env[v] for v in inner.operands]
            if inner.name == "linalg.index":
                env[inner.results[0]] = index(ir.IntegerAttr(inner.attributes["dim"]).value)
                continue
            if inner.name == "tensor.extract":
                env[inner.results[0]] = _extract(env[inner.operands[0]],
                                                 [env[v] for v in inner.operands[1:]])
                continue
            res = scalar_op(inner, [env[v] for v in inner.operands], self.tie)
            for r, val in zip(inner.results, res):
                env[r] = val
        raise ValueError("a linalg body without linalg.yield")

    def _reduce(self, op: ir.Operation, ins: list[V], outs: list[V], env: dict) -> list[V]:
        dims = sorted(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        body = op.regions[0].blocks[0]
        accs = [V(o.a.copy(), o.u.copy(), o.s) for o in outs]
        moved = [(np.moveaxis(x.a, dims, range(len(dims))), np.moveaxis(x.u, dims, range(len(dims))), x.s)
                 for x in ins]
        sizes = [ins[0].a.shape[d] for d in dims]
        for point in itertools.product(*(range(n) for n in sizes)):
            vals = [V(a[point], u[point], s) for a, u, s in moved]
            accs = self._payload(body, vals + accs, _no_index, env)
        return [V(np.asarray(a.a).astype(np_dtype(elem_name(r.type))).reshape(shape_of(r.type)),
                  np.broadcast_to(a.u, shape_of(r.type)).copy(), a.s)
                for a, r in zip(accs, op.results)]

    def _elementwise_named(self, op: ir.Operation, name: str, ins: list[V], out: V,
                           out_type: ir.Type) -> V:
        out_elem = elem_name(out_type)
        in_elems = [elem_name(v.type) for v in op.operands[: len(ins)]]
        if name == "elementwise":
            kind = str(op.attributes["kind"]).split("<")[-1].rstrip(">")
            rank = len(shape_of(out_type))
            if "indexing_maps" in op.attributes:
                maps = _maps(op)
            else:
                maps = [ir.AffineMap.get_identity(rank, self.ctx)] * (len(ins) + 1)
        else:
            kind = name
            rank = len(shape_of(out_type))
            maps = [ir.AffineMap.get_identity(rank, self.ctx)] * (len(ins) + 1)
        fn = ELEMENTWISE.get(kind)
        if fn is None:
            raise NotImplementedError(f"linalg.{name} ({kind})")
        tie = self.tie

        def payload(vals: list[V], index: Callable[[int], V]) -> list[V]:
            xs = [v if (kind == "select" and j == 0) else cast(v, e, out_elem, tie)
                  for j, (v, e) in enumerate(zip(vals, in_elems))]
            y = fn(out_elem, *xs)
            return [V(wrap(y.a, out_elem), np.broadcast_to(y.u, np.shape(y.a)), y.s)]

        return structured(maps, ["parallel"] * rank, ins, [out], [out_type], payload)[0]

    # ----- tensor ------------------------------------------------------------------------
    def _tensor(self, op: ir.Operation, args: list[V], env: dict) -> V:
        name = op.name[len("tensor."):]
        rt = op.results[0].type
        if name == "empty":
            shape = shape_of(rt)
            elem = elem_name(rt)
            fill = np.nan if is_float(elem) else 0
            # never read by a correct program: NaN floats, and uncertain everywhere
            return V(np.full(shape, fill, np_dtype(elem)), np.ones(shape, bool), 0.0)
        if name in ("expand_shape", "collapse_shape", "reshape", "cast"):
            x = args[0]
            shape = shape_of(rt)
            return V(x.a.reshape(shape).copy(), x.u.reshape(shape).copy(), x.s)
        if name == "extract_slice":
            x = args[0]
            idx = _slice_index(op)
            shape = shape_of(rt)
            return V(x.a[idx].reshape(shape).copy(), x.u[idx].reshape(shape).copy(), x.s)
        if name == "insert_slice":
            src, dst = args[0], args[1]
            idx = _slice_index(op)
            a, u = dst.a.copy(), dst.u.copy()
            a[idx] = src.a.reshape(a[idx].shape)
            u[idx] = src.u.reshape(u[idx].shape)
            return V(a, u, max(src.s, dst.s))
        if name == "concat":
            dim = ir.IntegerAttr(op.attributes["dim"]).value
            return V(np.concatenate([x.a for x in args], dim),
                     np.concatenate([x.u for x in args], dim), max(x.s for x in args))
        if name == "pad":
            x = args[0]
            low = list(ir.DenseI64ArrayAttr(op.attributes["static_low"]))
            high = list(ir.DenseI64ArrayAttr(op.attributes["static_high"]))
            body = op.regions[0].blocks[0]
            inner = dict(env)
            for barg in body.arguments:
                inner[barg] = V.of(np.int64(0))
            value = self._block(body, inner)[0]
            a = np.pad(x.a, list(zip(low, high)), constant_values=value.a)
            u = np.pad(x.u, list(zip(low, high)), constant_values=bool(value.u))
            return V(a, u, max(x.s, value.s))
        if name == "extract":
            return _extract(args[0], args[1:])
        if name == "from_elements":
            shape = shape_of(rt)
            a = np.array([x.a for x in args]).reshape(shape)
            u = np.array([x.u for x in args]).reshape(shape)
            return V(a, u, max([x.s for x in args] or [0.0]))
        if name == "splat":
            shape = shape_of(rt)
            x = args[0]
            return V(np.full(shape, x.a), np.full(shape, bool(x.u)), x.s)
        raise NotImplementedError(op.name)


# ----- structured ops ----------------------------------------------------------------------
def _no_index(d: int) -> V:
    raise ValueError("linalg.index outside a structured op with loops")


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _iterators(op: ir.Operation) -> list[str]:
    return [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def _affine(e: ir.AffineExpr, idx: list) -> np.ndarray | int:
    """The value of affine expression ``e`` at the loop indices ``idx`` (arrays)."""
    e = e.maybe_downcast() if hasattr(e, "maybe_downcast") else e
    if isinstance(e, ir.AffineDimExpr):
        return idx[e.position]
    if isinstance(e, ir.AffineConstantExpr):
        return e.value
    if isinstance(e, ir.AffineAddExpr):
        return _affine(e.lhs, idx) + _affine(e.rhs, idx)
    if isinstance(e, ir.AffineMulExpr):
        return _affine(e.lhs, idx) * _affine(e.rhs, idx)
    if isinstance(e, ir.AffineModExpr):
        return np.mod(_affine(e.lhs, idx), _affine(e.rhs, idx))
    if isinstance(e, ir.AffineFloorDivExpr):
        return np.floor_divide(_affine(e.lhs, idx), _affine(e.rhs, idx))
    if isinstance(e, ir.AffineCeilDivExpr):
        return -np.floor_divide(-_affine(e.lhs, idx), _affine(e.rhs, idx))
    raise NotImplementedError(f"affine expression {e}")


def _domain(maps: list[ir.AffineMap], operands: list[V]) -> list[int]:
    dom: list[int | None] = [None] * maps[0].n_dims
    for v, m in zip(operands, maps):
        for size, e in zip(v.a.shape, m.results):
            e = e.maybe_downcast() if hasattr(e, "maybe_downcast") else e
            if isinstance(e, ir.AffineDimExpr) and dom[e.position] is None:
                dom[e.position] = size
    if any(d is None for d in dom):
        raise ValueError("a loop without a size")
    return dom  # type: ignore[return-value]


def structured(maps: list[ir.AffineMap], iters: list[str], ins: list[V], outs: list[V],
               out_types: list[ir.Type],
               payload: Callable[[list[V], Callable[[int], V]], list[V]]) -> list[V]:
    """A structured op from its definition: for every point of the loop domain (the
    parallel loops at once, the reduction loops in order), the payload of the operands at
    their maps' indices, written to the outputs at theirs."""
    operands = ins + outs
    dom = _domain(maps, operands)
    par = [d for d, it in enumerate(iters) if it == "parallel"]
    red = [d for d, it in enumerate(iters) if it != "parallel"]
    psizes = [dom[d] for d in par]
    accs = [V(o.a.copy(), o.u.copy(), o.s) for o in outs]
    out_dtypes = [np_dtype(elem_name(t)) for t in out_types]
    for k, dt in enumerate(out_dtypes):
        accs[k].a = accs[k].a.astype(dt)
    grids = np.indices(psizes, dtype=np.int64) if psizes else np.zeros((0,), np.int64)
    n_in = len(ins)
    for rpoint in itertools.product(*(range(dom[d]) for d in red)):
        idx: list = [None] * len(dom)
        for i, d in enumerate(par):
            idx[d] = grids[i]
        for d, r in zip(red, rpoint):
            idx[d] = np.full(psizes, r, np.int64) if psizes else np.int64(r)
        pshape = tuple(psizes)

        def at(m: ir.AffineMap) -> tuple:
            return tuple(np.broadcast_to(_affine(e, idx), pshape) for e in m.results)

        vals = []
        for j, v in enumerate(ins):
            if len(maps[j].results) == 0 and v.a.ndim == 0:
                vals.append(V(np.broadcast_to(v.a, pshape), np.broadcast_to(v.u, pshape), v.s))
                continue
            ix = at(maps[j])
            vals.append(V(v.a[ix], v.u[ix], v.s))
        for k, acc in enumerate(accs):
            ix = at(maps[n_in + k])
            vals.append(V(acc.a[ix], acc.u[ix], acc.s))

        def index(d: int, _idx=idx) -> V:
            return V(np.broadcast_to(_idx[d], pshape).astype(np.int64), np.zeros(pshape, bool), 0.0)

        ys = payload(vals, index)
        for k, (acc, y) in enumerate(zip(accs, ys)):
            ix = at(maps[n_in + k])
            acc.a[ix] = np.broadcast_to(y.a, pshape)
            acc.u[ix] = np.broadcast_to(y.u, pshape)
            acc.s = max(acc.s, y.s)
    return accs


def _contraction(op: ir.Operation, name: str, ins: list[V], out: V, out_elem: str) -> V:
    """matmul-like named ops: ``out += cast(a) * cast(b)`` over the reduction loops, as an
    einsum over the indexing maps (the default ones of the op, or its own)."""
    letters = "abcdefghij"
    if "indexing_maps" in op.attributes and name in ("matmul", "batch_matmul", "batch_reduce_matmul"):
        maps = _maps(op)
        subs = ["".join(letters[e.maybe_downcast().position] for e in m.results) for m in maps]
    else:
        subs = {"matmul": ["mk", "kn", "mn"], "batch_matmul": ["bmk", "bkn", "bmn"],
                "matmul_transpose_b": ["mk", "nk", "mn"], "matmul_transpose_a": ["km", "kn", "mn"],
                "batch_matmul_transpose_b": ["bmk", "bnk", "bmn"],
                "batch_reduce_matmul": ["bmk", "bkn", "mn"], "dot": ["k", "k", ""],
                "matvec": ["mk", "k", "m"], "vecmat": ["k", "kn", "n"],
                "batch_matvec": ["bmk", "bk", "bm"]}[name]
    spec = f"{subs[0]},{subs[1]}->{subs[2]}"
    a, b = ins
    if is_float(out_elem):
        prod = np.einsum(spec, a.a.astype(np.float64), b.a.astype(np.float64))
        res = out.a.astype(np.float64) + prod
    else:
        dt = np_dtype(out_elem)
        # sign-extend to the output width, multiply-add modulo 2**64, wrap to the width
        prod = np.einsum(spec, a.a.astype(dt).astype(np.int64), b.a.astype(dt).astype(np.int64))
        res = (out.a.astype(np.int64) + prod).astype(dt)
    ua = np.einsum(spec, a.u.astype(np.float64), np.ones(b.a.shape))
    ub = np.einsum(spec, np.ones(a.a.shape), b.u.astype(np.float64))
    u = out.u | (ua > 0) | (ub > 0)
    sizes = dict(zip(subs[0], a.a.shape)) | dict(zip(subs[1], b.a.shape))
    k = math.prod(n for letter, n in sizes.items() if letter not in subs[2])
    return V(res, u, max(out.s, a.s * b.s * k, scale_of(res)))


def _fill(x: V, in_elem: str, out_type: ir.Type) -> V:
    out_elem = elem_name(out_type)
    v = cast(x, in_elem, out_elem, 0.0)
    shape = shape_of(out_type)
    return V(np.full(shape, v.a, np_dtype(out_elem)), np.full(shape, bool(np.any(v.u))), v.s)


def _extract(t: V, indices: list[V]) -> V:
    ix = tuple(int(i.a) for i in indices)
    return V(np.asarray(t.a[ix]), np.asarray(t.u[ix]), t.s)


def _slice_index(op: ir.Operation) -> tuple:
    offs = list(ir.DenseI64ArrayAttr(op.attributes["static_offsets"]))
    sizes = list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))
    strides = list(ir.DenseI64ArrayAttr(op.attributes["static_strides"]))
    return tuple(slice(o, o + (n - 1) * st + 1, st) for o, n, st in zip(offs, sizes, strides))
