"""The emulator's values and scalar instructions (see :mod:`opfuse.testing.emulator.emulate`).

Element types (numpy types for IR types; bf16 computed as float32 and stored as its
16 bits), constants (``arith.constant``, dense attributes included), ``affine.apply``
expressions, and the pure ``arith``/``math`` ops as numpy functions on per-thread arrays
(``_PURE``), with the comparisons, selects, casts and bf16 rounding they need.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
from mlir import ir

from ...errors import OpfuseError

# bf16 values compute as float32 holding bf16-representable values (rounded to nearest
# even wherever the IR produces a bf16 value) and live in memory as their 16 bits, as the
# host passes them (np.uint16: the runtime's dtype table).
_FLOAT = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": np.float32}
_BF16_BITS = np.dtype(np.uint16)
_INT = {
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "i1": np.bool_,
    "index": np.int64,
}


def _np_type(t: ir.Type):
    s = str(t)
    if s in _FLOAT:
        return _FLOAT[s]
    if s in _INT:
        return _INT[s]
    raise OpfuseError(f"emulator: unsupported element type {s}")


def _lanes(t: ir.Type) -> int:
    """Elements a load or store moves: a vector's length, else 1."""
    return ir.VectorType(t).shape[0] if isinstance(t, ir.VectorType) else 1


def _elem(t: ir.Type) -> ir.Type:
    return ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t


def _const(op: ir.Operation):
    attr = op.attributes["value"]
    t = op.results[0].type
    if isinstance(t, ir.VectorType):
        dense = ir.DenseElementsAttr(attr)
        et = _np_type(t.element_type)
        # a 1-d vector is every lane's: shape (1, w), as a per-lane vector is (lanes, w)
        # (vector.extract and vector.reduction index its last axis)
        shape = (1, *t.shape) if t.rank == 1 else tuple(t.shape)
        if dense.is_splat:
            return np.full(shape, _scalar(dense.get_splat_value()), dtype=et)
        return _elements(attr, t.element_type).astype(et).reshape(shape)
    return _np_type(t)(_scalar(attr))


def _elements(attr: ir.Attribute, elem: ir.Type) -> np.ndarray:
    """The elements of a non-splat dense constant, in order. DenseElementsAttr does not
    index its elements; the typed views do, except f16/bf16 ones ("Unsupported
    floating-point type"): those are read from the printed attribute, whose decimal
    values round back to the same half-precision values (a hex blob holds their bits)."""
    if isinstance(elem, (ir.IntegerType, ir.IndexType)):
        typed = ir.DenseIntElementsAttr(attr)
        return np.array([typed[i] for i in range(len(typed))])
    if not isinstance(elem, (ir.F16Type, ir.BF16Type)):
        typed = ir.DenseFPElementsAttr(attr)
        return np.array([typed[i] for i in range(len(typed))])
    text = str(attr)
    blob = re.search(r'"0x([0-9A-Fa-f]+)"', text)
    if blob is not None:
        bits = np.frombuffer(bytes.fromhex(blob.group(1)), dtype=np.uint16)
    else:  # dense<[v, ...]>: decimals, or the bits of a value with no decimal form (0x7E00)
        body = text.split("<", 1)[1].split(">", 1)[0]
        bits = np.array([int(x, 16) if x.startswith("0x") else _half_bits(float(x), elem)
                         for x in _ELEMENT.findall(body)], np.uint16)
    return _from_bf16_bits(bits) if isinstance(elem, ir.BF16Type) else bits.view(np.float16)


def _half_bits(x: float, elem: ir.Type) -> int:
    if isinstance(elem, ir.BF16Type):
        return int(_to_bf16_bits(np.array([x], np.float32))[0])
    return int(np.array([x], np.float16).view(np.uint16)[0])


_ELEMENT = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")


def _scalar(attr: ir.Attribute):
    if isinstance(attr, ir.FloatAttr) or str(attr.type).startswith(("f", "bf")):
        return ir.FloatAttr(attr).value
    if str(attr.type) == "i1":
        return (
            bool(ir.BoolAttr(attr).value)
            if isinstance(attr, ir.BoolAttr)
            else bool(ir.IntegerAttr(attr).value)
        )
    return ir.IntegerAttr(attr).value


def _affine(e: ir.AffineExpr, dims: list, syms: list = ()) -> Any:
    e = e.maybe_downcast()
    if isinstance(e, ir.AffineConstantExpr):
        return np.int64(e.value)
    if isinstance(e, ir.AffineDimExpr):
        return dims[e.position]
    if isinstance(e, ir.AffineSymbolExpr):
        return syms[e.position]
    a, b = _affine(e.lhs, dims, syms), _affine(e.rhs, dims, syms)
    if isinstance(e, ir.AffineAddExpr):
        return a + b
    if isinstance(e, ir.AffineMulExpr):
        return a * b
    if isinstance(e, ir.AffineFloorDivExpr):
        return a // b
    if isinstance(e, ir.AffineCeilDivExpr):
        return -((-a) // b)
    if isinstance(e, ir.AffineModExpr):
        return a % b
    raise OpfuseError(f"emulator: affine expression {e}")


def _combine(kind: str, a, b):
    return {
        "add": np.add,
        "mul": np.multiply,
        "maximumf": _maximumf,
        "minimumf": _minimumf,
        "maxnumf": np.fmax,
        "minnumf": np.fmin,
        "maxsi": np.maximum,
        "minsi": np.minimum,
        "maxui": np.maximum,
        "minui": np.minimum,
        "and": np.bitwise_and,
        "or": np.bitwise_or,
        "xor": np.bitwise_xor,
    }[kind](a, b)


def _maximumf(a, b):
    return np.maximum(a, b)  # propagates NaN, like arith.maximumf


def _minimumf(a, b):
    return np.minimum(a, b)


def _cmpf(op, a, b):
    pred = ir.IntegerAttr(op.attributes["predicate"]).value
    # arith.CmpFPredicate: false, oeq, ogt, oge, olt, ole, one, ord, ueq, ugt, uge, ult, ule, une, uno, true
    unordered = np.isnan(a) | np.isnan(b)
    base = [
        None,
        np.equal,
        np.greater,
        np.greater_equal,
        np.less,
        np.less_equal,
        np.not_equal,
        None,
        np.equal,
        np.greater,
        np.greater_equal,
        np.less,
        np.less_equal,
        np.not_equal,
        None,
        None,
    ][pred]
    if pred == 0:
        return np.zeros(np.broadcast(a, b).shape, bool)
    if pred == 15:
        return np.ones(np.broadcast(a, b).shape, bool)
    if pred == 7:
        return ~unordered
    if pred == 14:
        return unordered
    with np.errstate(invalid="ignore"):
        r = base(a, b)
    return (r & ~unordered) if pred < 8 else (r | unordered)


def _cmpi(op, a, b):
    pred = ir.IntegerAttr(op.attributes["predicate"]).value
    # eq, ne, slt, sle, sgt, sge, ult, ule, ugt, uge
    if pred >= 6:
        a, b = a.astype(np.uint64) if a.dtype != np.bool_ else a, (
            b.astype(np.uint64) if b.dtype != np.bool_ else b
        )
    return [
        np.equal,
        np.not_equal,
        np.less,
        np.less_equal,
        np.greater,
        np.greater_equal,
        np.less,
        np.less_equal,
        np.greater,
        np.greater_equal,
    ][pred](a, b)


def _unsigned_pick(cmp, a, b):
    """``a`` where ``cmp(a, b)`` as unsigned integers, else ``b`` (``arith.minui`` of -1 and
    15 is 15: a negative index is a huge unsigned one, which is how the emitters clamp)."""
    a, b = np.broadcast_arrays(a, b)
    unsigned = np.dtype(f"uint{a.dtype.itemsize * 8}")
    return np.where(cmp(a.view(unsigned), b.view(unsigned)), a, b)


def _f(fn):
    def wrap(op, *xs):
        with np.errstate(all="ignore"):
            return fn(*xs)

    return wrap


def _storage_type(t: ir.Type):
    """The numpy type of memory holding ``t`` values (bf16: its bits)."""
    return _BF16_BITS if isinstance(t, ir.BF16Type) else _np_type(t)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32; NaN stays."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), x, rounded.view(np.float32)).astype(np.float32)


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return (_round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def _select(op, c, a, b):
    """``arith.select``: a vector condition picks lane by lane; a scalar (per-thread) one
    picks whole vectors. Per-thread values are (threads,) or (threads, lanes) arrays,
    constants () or (lanes,): the op's types say which case this is, not the shapes."""
    c = np.asarray(c)
    scalar_cond = not isinstance(op.operands[0].type, ir.VectorType)
    if scalar_cond and isinstance(op.results[0].type, ir.VectorType) and c.ndim == 1:
        c = c[:, None]
    return np.where(c, a, b)


def _cast(op, x):
    return x.astype(_np_type(_elem(op.results[0].type)))


def _erf(x):
    v = np.vectorize(math.erf, otypes=[np.float64])
    return v(x.astype(np.float64)).astype(x.dtype)


_PURE = {
    "arith.addi": _f(np.add),
    "arith.subi": _f(np.subtract),
    "arith.muli": _f(np.multiply),
    "arith.divsi": _f(lambda a, b: np.trunc(a / b).astype(a.dtype)),
    "arith.divui": _f(np.floor_divide),
    "arith.remui": _f(np.remainder),
    "arith.remsi": _f(np.fmod),
    "arith.floordivsi": _f(np.floor_divide),
    "arith.ceildivsi": _f(lambda a, b: -((-a) // b)),
    "arith.minui": _f(lambda a, b: _unsigned_pick(np.less_equal, a, b)),
    "arith.maxui": _f(lambda a, b: _unsigned_pick(np.greater_equal, a, b)),
    "arith.minsi": _f(np.minimum),
    "arith.maxsi": _f(np.maximum),
    "arith.andi": _f(np.bitwise_and),
    "arith.ori": _f(np.bitwise_or),
    "arith.xori": _f(np.bitwise_xor),
    "arith.shli": _f(np.left_shift),
    "arith.shrui": _f(np.right_shift),
    "arith.shrsi": _f(np.right_shift),
    "arith.cmpi": _cmpi,
    "arith.cmpf": _cmpf,
    "arith.select": _select,
    "arith.addf": _f(np.add),
    "arith.subf": _f(np.subtract),
    "arith.mulf": _f(np.multiply),
    "arith.divf": _f(np.divide),
    "arith.remf": _f(np.fmod),
    "arith.negf": _f(np.negative),
    "arith.maximumf": _f(_maximumf),
    "arith.minimumf": _f(_minimumf),
    "arith.maxnumf": _f(np.fmax),
    "arith.minnumf": _f(np.fmin),
    "arith.extf": _cast,
    "arith.truncf": _cast,
    "arith.extsi": _cast,
    "arith.extui": _cast,
    "arith.trunci": _cast,
    "arith.sitofp": _cast,
    "arith.uitofp": _cast,
    "arith.fptosi": _cast,
    "arith.fptoui": _cast,
    "arith.index_cast": _cast,
    "arith.index_castui": _cast,
    "math.exp": _f(np.exp),
    "math.exp2": _f(np.exp2),
    "math.log": _f(np.log),
    "math.log2": _f(np.log2),
    "math.log1p": _f(np.log1p),
    "math.expm1": _f(np.expm1),
    "math.tanh": _f(np.tanh),
    "math.sqrt": _f(np.sqrt),
    "math.rsqrt": _f(lambda x: 1 / np.sqrt(x)),
    "math.absf": _f(np.abs),
    "math.absi": _f(np.abs),
    "math.sin": _f(np.sin),
    "math.cos": _f(np.cos),
    "math.tan": _f(np.tan),
    "math.atan": _f(np.arctan),
    "math.powf": _f(np.power),
    "math.fma": _f(lambda a, b, c: a * b + c),
    "math.ceil": _f(np.ceil),
    "math.floor": _f(np.floor),
    "math.round": _f(np.round),
    "math.roundeven": _f(np.rint),
    "math.trunc": _f(np.trunc),
    "math.erf": _f(_erf),
    "math.copysign": _f(np.copysign),
    "math.ipowi": _f(np.power),
    "math.fpowi": _f(np.power),
}
