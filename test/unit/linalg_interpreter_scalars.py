"""Scalar semantics for linalg_interpreter.py: values (array, uncertain elements, scale),
element types, every arith/math op on arrays of scalars, the elementwise named ops' functions,
casts and comparisons (with the near-tie bookkeeping)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mlir import ir

INT_DTYPES = {1: np.bool_, 8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
FLOAT_TYPES = ("f64", "f32", "f16", "bf16")


@dataclass
class V:
    """A value: its array, its uncertain elements and its scale."""

    a: np.ndarray
    u: np.ndarray
    s: float

    @staticmethod
    def of(a, s: float | None = None) -> V:
        a = np.asarray(a)
        return V(a, np.zeros(a.shape, bool), scale_of(a) if s is None else s)


def scale_of(a: np.ndarray) -> float:
    if a.dtype.kind == "f" and a.size:
        finite = a[np.isfinite(a)]
        return float(np.max(np.abs(finite))) if finite.size else 0.0
    return 0.0


def elem_name(t: ir.Type) -> str:
    """``f32``, ``i32``, ``index``, ... of a scalar or shaped type."""
    if isinstance(t, ir.ShapedType):
        t = t.element_type
    return str(t)


def is_float(elem: str) -> bool:
    return elem in FLOAT_TYPES


def np_dtype(elem: str):
    """The interpreter's numpy dtype for an MLIR element type."""
    if is_float(elem):
        return np.float64
    if elem == "index":
        return np.int64
    if elem.startswith("i"):
        return INT_DTYPES[int(elem[1:])]
    raise NotImplementedError(f"element type {elem}")


def shape_of(t: ir.Type) -> tuple[int, ...]:
    return tuple(ir.ShapedType(t).shape)


# ----- scalar ops --------------------------------------------------------------------------
def wrap(a, elem: str) -> np.ndarray:
    """``a`` as the interpreter's array for ``elem`` (wrapping integers to their width)."""
    a = np.asarray(a)
    dt = np_dtype(elem)
    if dt is np.bool_:
        return a.astype(bool)
    if dt is np.float64:
        return a.astype(np.float64)
    return a.astype(np.int64).astype(dt) if a.dtype != dt else a


def cast(x: V, src: str, dst: str, tie: float) -> V:
    """Named ops' operand cast to the output type (signed for integers)."""
    if src == dst:
        return x
    if is_float(dst):
        return V(x.a.astype(np.float64), x.u, x.s)
    if is_float(src):
        return _fptoi(x, dst, tie)
    return V(wrap(x.a.astype(np.int64), dst), x.u, x.s)


def _fptoi(x: V, dst: str, tie: float) -> V:
    """Truncation toward zero: a step at every nonzero integer (none at zero)."""
    nearest = np.round(x.a)
    near = (np.abs(x.a - nearest) <= tie * max(1.0, x.s)) & (nearest != 0)
    return V(wrap(np.trunc(x.a), dst), x.u | near, x.s)


def _tie(a: V, b: V, tie: float) -> np.ndarray:
    scale = max(1.0, a.s, b.s)
    if a.a.dtype.kind == "f" or b.a.dtype.kind == "f":
        return np.abs(a.a.astype(np.float64) - b.a.astype(np.float64)) <= tie * scale
    return np.zeros(np.broadcast(a.a, b.a).shape, bool)


_CMPF = {0: "false", 1: "oeq", 2: "ogt", 3: "oge", 4: "olt", 5: "ole", 6: "one", 7: "ord",
         8: "ueq", 9: "ugt", 10: "uge", 11: "ult", 12: "ule", 13: "une", 14: "uno", 15: "true"}
_CMPI = {0: "eq", 1: "ne", 2: "slt", 3: "sle", 4: "sgt", 5: "sge", 6: "ult", 7: "ule",
         8: "ugt", 9: "uge"}


def _compare(pred: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    base = pred[-2:] if pred not in ("false", "true", "ord", "uno") else pred
    if pred.startswith("u") and pred not in ("uno",) and a.dtype.kind in "iub":
        # unsigned integer comparison: reinterpret the bits
        width = a.dtype.itemsize * 8
        a = a.astype(np.int64) % (1 << width) if width < 64 else a.view(np.uint64)
        b = b.astype(np.int64) % (1 << width) if width < 64 else b.view(np.uint64)
    table = {"eq": np.equal, "ne": np.not_equal, "gt": np.greater, "ge": np.greater_equal,
             "lt": np.less, "le": np.less_equal}
    if base == "false":
        return np.zeros(np.broadcast(a, b).shape, bool)
    if base == "true":
        return np.ones(np.broadcast(a, b).shape, bool)
    if base == "ord":
        return ~(np.isnan(a) | np.isnan(b))
    if base == "uno":
        return np.isnan(a) | np.isnan(b)
    if base == "ne" and pred == "one":
        return np.not_equal(a, b) & ~(np.isnan(a) | np.isnan(b))
    return table[base](a, b)


def _unary_float(name: str):
    return {
        "arith.negf": np.negative, "math.absf": np.abs, "math.tanh": np.tanh,
        "math.exp": np.exp, "math.exp2": np.exp2, "math.expm1": np.expm1, "math.log": np.log,
        "math.log1p": np.log1p, "math.log2": np.log2, "math.sqrt": np.sqrt,
        "math.rsqrt": lambda x: 1.0 / np.sqrt(x), "math.sin": np.sin, "math.cos": np.cos,
        "math.erf": np.vectorize(math.erf, otypes=[np.float64]), "math.floor": np.floor,
        "math.ceil": np.ceil, "math.round": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
        "math.roundeven": np.round, "math.trunc": np.trunc, "math.atan": np.arctan,
        "math.sinh": np.sinh, "math.cosh": np.cosh, "math.tan": np.tan,
    }.get(name)


_DISCONTINUOUS = {"math.floor", "math.ceil", "math.round", "math.roundeven", "math.trunc"}


def _binary_float(name: str):
    return {
        "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
        "arith.divf": np.divide, "arith.maximumf": np.maximum, "arith.minimumf": np.minimum,
        "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin, "math.powf": np.power,
        "math.atan2": np.arctan2, "arith.remf": np.fmod, "math.copysign": np.copysign,
    }.get(name)


def _div_trunc(a, b):
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
    return np.where((a < 0) != (b < 0), -q, q)


def _rem_trunc(a, b):
    return a.astype(np.int64) - _div_trunc(a, b) * b.astype(np.int64)


def _binary_int(name: str):
    return {
        "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
        "arith.maxsi": np.maximum, "arith.minsi": np.minimum, "arith.andi": np.bitwise_and,
        "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor, "arith.divsi": _div_trunc,
        "arith.remsi": _rem_trunc, "arith.shli": np.left_shift, "arith.shrsi": np.right_shift,
        "arith.floordivsi": np.floor_divide,
    }.get(name)


def scalar_op(op: ir.Operation, args: list[V], tie: float) -> list[V]:
    """One arith/math op on (arrays of) scalars."""
    name = op.name
    rt = op.results[0].type if len(op.results) else None
    elem = elem_name(rt) if rt is not None else ""
    u = np.zeros((), bool)
    for a in args:
        u = u | a.u
    s = max([a.s for a in args] or [0.0])
    if name == "arith.constant":
        attr = op.attributes["value"]
        if isinstance(rt, ir.ShapedType):
            return [V.of(_dense(attr, rt))]
        if isinstance(attr, ir.FloatAttr):
            return [V.of(np.float64(attr.value))]
        if isinstance(attr, ir.BoolAttr):
            return [V.of(np.bool_(attr.value))]
        return [V.of(wrap(np.int64(ir.IntegerAttr(attr).value), elem))]
    if name in ("ub.poison",):
        return [V(np.zeros((), np_dtype(elem)), np.ones((), bool), 0.0)]
    xs = [a.a for a in args]
    f = _unary_float(name)
    if f is not None:
        with np.errstate(all="ignore"):
            r = f(xs[0].astype(np.float64))
        if name in _DISCONTINUOUS:
            u = u | (np.abs(xs[0] - np.round(xs[0])) <= tie * max(1.0, s))
        return [V(r, np.broadcast_to(u, r.shape).copy(), max(s, scale_of(r)))]
    f = _binary_float(name)
    if f is not None:
        with np.errstate(all="ignore"):
            r = f(xs[0].astype(np.float64), xs[1].astype(np.float64))
        return [V(r, np.broadcast_to(u, r.shape).copy(), max(s, scale_of(r)))]
    f = _binary_int(name)
    if f is not None:
        dt = np_dtype(elem)
        if dt is np.bool_:
            r = f(xs[0], xs[1])
        else:
            r = wrap(f(xs[0].astype(np.int64), xs[1].astype(np.int64)), elem)
        return [V(r, np.broadcast_to(u, np.shape(r)).copy(), s)]
    if name == "math.absi":
        return [V(wrap(np.abs(xs[0].astype(np.int64)), elem), u, s)]
    if name == "math.fma":
        r = xs[0] * xs[1] + xs[2]
        return [V(r, np.broadcast_to(u, r.shape).copy(), max(s, scale_of(r)))]
    if name == "arith.cmpf":
        pred = _CMPF[ir.IntegerAttr(op.attributes["predicate"]).value]
        r = _compare(pred, xs[0].astype(np.float64), xs[1].astype(np.float64))
        return [V(r, np.broadcast_to(u | _tie(args[0], args[1], tie), r.shape).copy(), s)]
    if name == "arith.cmpi":
        pred = _CMPI[ir.IntegerAttr(op.attributes["predicate"]).value]
        r = _compare(pred, xs[0], xs[1])
        return [V(r, np.broadcast_to(u, r.shape).copy(), s)]
    if name == "arith.select":
        c = xs[0].astype(bool)
        r = np.where(c, xs[1], xs[2])
        uu = args[0].u | np.where(c, args[1].u, args[2].u)
        return [V(r, np.broadcast_to(uu, r.shape).copy(), max(args[1].s, args[2].s))]
    if name in ("arith.extf", "arith.truncf"):
        return [V(xs[0].astype(np.float64), u, s)]
    if name in ("arith.sitofp",):
        r = xs[0].astype(np.int64).astype(np.float64) if xs[0].dtype != np.bool_ \
            else -xs[0].astype(np.float64)
        return [V(r, u, max(s, scale_of(r)))]
    if name == "arith.uitofp":
        width = 1 if xs[0].dtype == np.bool_ else xs[0].dtype.itemsize * 8
        r = (xs[0].astype(np.int64) % (1 << width)).astype(np.float64)
        return [V(r, u, max(s, scale_of(r)))]
    if name == "arith.fptosi":
        return [_fptoi(V(xs[0], u, s), elem, tie)]
    if name in ("arith.extsi", "arith.index_cast"):
        if xs[0].dtype == np.bool_:
            return [V(wrap(-xs[0].astype(np.int64), elem), u, s)]
        return [V(wrap(xs[0].astype(np.int64), elem), u, s)]
    if name in ("arith.extui", "arith.index_castui"):
        width = 1 if xs[0].dtype == np.bool_ else xs[0].dtype.itemsize * 8
        return [V(wrap(xs[0].astype(np.int64) % (1 << width), elem), u, s)]
    if name == "arith.trunci":
        if np_dtype(elem) is np.bool_:
            return [V((xs[0].astype(np.int64) & 1).astype(bool), u, s)]
        return [V(wrap(xs[0], elem), u, s)]
    if name == "arith.bitcast":
        raise NotImplementedError("arith.bitcast")
    raise NotImplementedError(name)


def _dense(attr: ir.Attribute, t: ir.Type) -> np.ndarray:
    elem = elem_name(t)
    shape = shape_of(t)
    d = ir.DenseElementsAttr(attr)
    if d.is_splat:
        v = d.get_splat_value()
        x = ir.FloatAttr(v).value if is_float(elem) else ir.IntegerAttr(v).value
        return wrap(np.full(shape, x, np.float64 if is_float(elem) else np.int64), elem)
    if is_float(elem):  # from the text: the bindings index no f16/bf16 elements
        text = str(attr)
        body = text[len("dense<"):text.rindex("> :")]
        vals = np.array([float(x) for x in body.replace("[", " ").replace("]", " ").split(",")],
                        np.float64)
    else:
        ints = ir.DenseIntElementsAttr(attr)
        vals = np.array([ints[i] for i in range(len(ints))], np.int64)
    return wrap(vals, elem).reshape(shape)


# ----- elementwise named ops ---------------------------------------------------------------
def _ew_unary(f):
    def apply(elem: str, x: V) -> V:
        with np.errstate(all="ignore"):
            r = f(x.a)
        return V(np.asarray(r), x.u, max(x.s, scale_of(np.asarray(r))))
    return apply


def _ew_binary(ff, fi):
    def apply(elem: str, x: V, y: V) -> V:
        f = ff if is_float(elem) else fi
        with np.errstate(all="ignore"):
            r = f(x.a, y.a) if is_float(elem) else f(x.a.astype(np.int64), y.a.astype(np.int64))
        r = np.asarray(r)
        return V(r, x.u | y.u, max(x.s, y.s, scale_of(r)))
    return apply


def _ew_select(elem: str, c: V, x: V, y: V) -> V:
    cond = c.a.astype(bool)
    return V(np.where(cond, x.a, y.a), c.u | np.where(cond, x.u, y.u), max(x.s, y.s))


ELEMENTWISE = {
    "exp": _ew_unary(np.exp), "log": _ew_unary(np.log), "abs": _ew_unary(np.abs),
    "ceil": _ew_unary(np.ceil), "floor": _ew_unary(np.floor), "negf": _ew_unary(np.negative),
    "reciprocal": _ew_unary(lambda x: 1.0 / x), "sqrt": _ew_unary(np.sqrt),
    "rsqrt": _ew_unary(lambda x: 1.0 / np.sqrt(x)), "square": _ew_unary(np.square),
    "tanh": _ew_unary(np.tanh), "erf": _ew_unary(np.vectorize(math.erf, otypes=[np.float64])),
    "add": _ew_binary(np.add, np.add), "sub": _ew_binary(np.subtract, np.subtract),
    "mul": _ew_binary(np.multiply, np.multiply), "div": _ew_binary(np.divide, _div_trunc),
    "max": _ew_binary(np.maximum, np.maximum), "min": _ew_binary(np.minimum, np.minimum),
    "max_signed": _ew_binary(np.maximum, np.maximum), "min_signed": _ew_binary(np.minimum, np.minimum),
    "powf": _ew_binary(np.power, None), "select": _ew_select,
}
