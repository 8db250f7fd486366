"""The values of a random program (tensors, scalars, element types) and the scalar
arithmetic drawn on them, bounded (linalg_programs.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass


SIZES = (1, 2, 3, 4, 5, 7, 8, 16)
FLOATS = ("f32", "f16", "bf16")
INTS = ("i32", "i64")
#: Constants exact in every float type the programs use.
CONSTS = (0.5, 0.25, 1.5, 2.0, -0.75, 0.125, 3.0, -1.0, 0.375)
F_LIMIT = 16.0  # float magnitudes are squashed above this before growing ops
I_LIMIT = 1 << 16  # integer magnitudes likewise
MAX_REDUCTION = 64  # points of the reduction loops of one op


def ttype(shape, elem: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + elem + ">"


def is_float(elem: str) -> bool:
    return elem in FLOATS or elem == "f64"


_WIDTH = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i1": 1, "i8": 8, "i32": 32, "i64": 64,
          "index": 64}


@dataclass
class T:
    """A tensor value of the program: its SSA name, shape, element type and a bound on
    the magnitude of its elements."""

    name: str
    shape: tuple[int, ...]
    elem: str
    bound: float

    @property
    def type(self) -> str:
        return ttype(self.shape, self.elem)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class S:
    """A scalar SSA value (in a payload or between ops)."""

    name: str
    elem: str
    bound: float


def float_text(v: float) -> str:
    return repr(float(v))


class Scalars:
    """Emits scalar arithmetic (into ``lines``), keeping every value bounded; ``gen`` (a
    linalg_programs.Gen) names the values and draws the choices."""

    def __init__(self, gen, lines: list[str], indent: str):
        self.gen = gen
        self.rng = gen.rng
        self.lines = lines
        self.indent = indent

    def emit(self, rhs: str, elem: str, bound: float) -> S:
        name = self.gen.fresh("s")
        self.lines.append(f"{self.indent}{name} = {rhs}")
        return S(name, elem, bound)

    def const(self, elem: str, value=None) -> S:
        if is_float(elem):
            v = self.rng.choice(CONSTS) if value is None else value
            return self.emit(f"arith.constant {float_text(v)} : {elem}", elem, abs(v))
        v = self.rng.choice((1, 2, 3, -2, 5, 7)) if value is None else value
        return self.emit(f"arith.constant {int(v)} : {elem}", elem, abs(v))

    # --- conversions
    def convert(self, x: S, elem: str) -> S:
        if x.elem == elem:
            return x
        r = self.rng
        if x.elem == "index":
            mid = elem if elem in INTS else r.choice(INTS)
            x = self.emit(f"arith.index_cast {x.name} : index to {mid}", mid, x.bound)
            return self.convert(x, elem)
        if x.elem in ("i1",):
            mid = elem if not is_float(elem) else "i32"
            x = self.emit(f"arith.extui {x.name} : i1 to {mid}", mid, 1)
            return self.convert(x, elem)
        if is_float(x.elem) and is_float(elem):
            if _WIDTH[x.elem] == _WIDTH[elem]:  # f16 <-> bf16: through f32
                x = self.emit(f"arith.extf {x.name} : {x.elem} to f32", "f32", x.bound)
            if x.elem == elem:
                return x
            op = "extf" if _WIDTH[elem] > _WIDTH[x.elem] else "truncf"
            return self.emit(f"arith.{op} {x.name} : {x.elem} to {elem}", elem, x.bound)
        if not is_float(x.elem) and not is_float(elem):
            if _WIDTH[elem] < _WIDTH[x.elem]:
                x = self.squash(x, 1 << 20)
                return self.emit(f"arith.trunci {x.name} : {x.elem} to {elem}", elem, x.bound)
            return self.emit(f"arith.extsi {x.name} : {x.elem} to {elem}", elem, x.bound)
        if not is_float(x.elem):  # int -> float
            x = self.squash(x, 1 << 10)
            return self.emit(f"arith.sitofp {x.name} : {x.elem} to {elem}", elem, x.bound)
        # float -> int: scaled first so that the integers are not all 0 / +-1
        x = self.squash(x, F_LIMIT)
        four = self.const(x.elem, 4.0)
        y = self.emit(f"arith.mulf {x.name}, {four.name} : {x.elem}", x.elem, 4 * x.bound)
        return self.emit(f"arith.fptosi {y.name} : {x.elem} to {elem}", elem, y.bound)

    def squash(self, x: S, limit: float) -> S:
        if x.bound <= limit:
            return x
        if is_float(x.elem):
            if self.rng.random() < 0.7:
                return self.emit(f"math.tanh {x.name} : {x.elem}", x.elem, 1.0)
            c = self.const(x.elem, 0.125)
            y = self.emit(f"arith.mulf {x.name}, {c.name} : {x.elem}", x.elem, x.bound / 8)
            return self.squash(y, limit)
        c = self.const(x.elem, 97)
        return self.emit(f"arith.remsi {x.name}, {c.name} : {x.elem}", x.elem, 96)

    # --- expressions
    def expr(self, leaves: list[S], elem: str, depth: int) -> S:
        r = self.rng
        if depth <= 0 or not leaves or r.random() < 0.2:
            if not leaves or r.random() < 0.1:
                return self.const(elem)
            return self.convert(r.choice(leaves), elem)
        if r.random() < 0.35:
            return self.unary(self.expr(leaves, elem, depth - 1))
        if r.random() < 0.12:
            return self.select(leaves, elem, depth)
        return self.binary(self.expr(leaves, elem, depth - 1), self.expr(leaves, elem, depth - 1))

    def unary(self, x: S) -> S:
        r = self.rng
        e = x.elem
        if not is_float(e):
            kind = r.choice(("neg", "abs", "rem", "div", "shl", "shr"))
            if kind == "neg":
                z = self.const(e, 0)
                return self.emit(f"arith.subi {z.name}, {x.name} : {e}", e, x.bound)
            if kind == "abs":
                return self.emit(f"math.absi {x.name} : {e}", e, x.bound)
            if kind == "rem":
                c = self.const(e, r.choice((3, 7, 5)))
                return self.emit(f"arith.remsi {x.name}, {c.name} : {e}", e, min(x.bound, c.bound - 1))
            if kind == "div":
                c = self.const(e, r.choice((2, 3, 4)))
                return self.emit(f"arith.divsi {x.name}, {c.name} : {e}", e, x.bound)
            x = self.squash(x, I_LIMIT // 8)
            c = self.const(e, r.choice((1, 2)))
            op = "shli" if kind == "shl" else "shrsi"
            return self.emit(f"arith.{op} {x.name}, {c.name} : {e}", e,
                             x.bound * 4 if op == "shli" else x.bound)
        kind = r.choice(("neg", "abs", "tanh", "tanh", "exp", "sin", "cos", "sqrt", "log",
                         "erf", "rsqrt", "floor", "sigmoid"))
        if kind == "neg":
            return self.emit(f"arith.negf {x.name} : {e}", e, x.bound)
        if kind == "abs":
            return self.emit(f"math.absf {x.name} : {e}", e, x.bound)
        if kind in ("tanh", "erf"):
            return self.emit(f"math.{kind} {x.name} : {e}", e, 1.0)
        if kind == "exp":
            x = self.squash(x, 2.0)
            return self.emit(f"math.exp {x.name} : {e}", e, math.exp(x.bound))
        if kind in ("sin", "cos"):
            x = self.squash(x, 8.0)
            return self.emit(f"math.{kind} {x.name} : {e}", e, 1.0)
        if kind == "sqrt":  # sqrt(|x| + 0.25)
            a = self.emit(f"math.absf {x.name} : {e}", e, x.bound)
            c = self.const(e, 0.25)
            p = self.emit(f"arith.addf {a.name}, {c.name} : {e}", e, x.bound + 0.25)
            return self.emit(f"math.sqrt {p.name} : {e}", e, math.sqrt(p.bound))
        if kind in ("log", "rsqrt"):  # log(x*x + 1), rsqrt(x*x + 1)
            x = self.squash(x, F_LIMIT)
            sq = self.emit(f"arith.mulf {x.name}, {x.name} : {e}", e, x.bound ** 2)
            one = self.const(e, 1.0)
            p = self.emit(f"arith.addf {sq.name}, {one.name} : {e}", e, sq.bound + 1)
            return self.emit(f"math.{kind} {p.name} : {e}", e,
                             math.log(p.bound) if kind == "log" else 1.0)
        if kind == "floor":
            return self.emit(f"math.floor {x.name} : {e}", e, x.bound + 1)
        # sigmoid: 1 / (1 + exp(-x))
        x = self.squash(x, 8.0)
        n = self.emit(f"arith.negf {x.name} : {e}", e, x.bound)
        ex = self.emit(f"math.exp {n.name} : {e}", e, math.exp(x.bound))
        one = self.const(e, 1.0)
        d = self.emit(f"arith.addf {one.name}, {ex.name} : {e}", e, ex.bound + 1)
        return self.emit(f"arith.divf {one.name}, {d.name} : {e}", e, 1.0)

    def binary(self, x: S, y: S) -> S:
        r = self.rng
        e = x.elem
        y = self.convert(y, e)
        if not is_float(e):
            kind = r.choice(("addi", "subi", "muli", "maxsi", "minsi", "andi", "ori", "xori"))
            if kind in ("addi", "subi"):
                x, y = self.squash(x, I_LIMIT), self.squash(y, I_LIMIT)
                return self.emit(f"arith.{kind} {x.name}, {y.name} : {e}", e, x.bound + y.bound)
            if kind == "muli":
                x, y = self.squash(x, 1 << 8), self.squash(y, 1 << 8)
                return self.emit(f"arith.muli {x.name}, {y.name} : {e}", e, x.bound * y.bound)
            if kind in ("maxsi", "minsi"):
                return self.emit(f"arith.{kind} {x.name}, {y.name} : {e}", e, max(x.bound, y.bound))
            x, y = self.squash(x, I_LIMIT), self.squash(y, I_LIMIT)
            b = 2 ** math.ceil(math.log2(max(x.bound, y.bound) + 1))
            return self.emit(f"arith.{kind} {x.name}, {y.name} : {e}", e, b)
        kind = r.choice(("addf", "addf", "subf", "mulf", "mulf", "divf", "maximumf", "minimumf",
                         "maxnumf", "minnumf"))
        if kind in ("addf", "subf"):
            x, y = self.squash(x, F_LIMIT), self.squash(y, F_LIMIT)
            return self.emit(f"arith.{kind} {x.name}, {y.name} : {e}", e, x.bound + y.bound)
        if kind == "mulf":
            if x.bound * y.bound > F_LIMIT * 4:
                x, y = self.squash(x, 8.0), self.squash(y, 8.0)
            return self.emit(f"arith.mulf {x.name}, {y.name} : {e}", e, x.bound * y.bound)
        if kind == "divf":  # x / (1 + y*y)
            y = self.squash(y, F_LIMIT)
            sq = self.emit(f"arith.mulf {y.name}, {y.name} : {e}", e, y.bound ** 2)
            one = self.const(e, 1.0)
            d = self.emit(f"arith.addf {sq.name}, {one.name} : {e}", e, sq.bound + 1)
            return self.emit(f"arith.divf {x.name}, {d.name} : {e}", e, x.bound)
        return self.emit(f"arith.{kind} {x.name}, {y.name} : {e}", e, max(x.bound, y.bound))

    def select(self, leaves: list[S], elem: str, depth: int) -> S:
        r = self.rng
        a = r.choice(leaves)
        if a.elem == "index":
            a = self.convert(a, "i64")
        b = self.convert(r.choice(leaves), a.elem) if r.random() < 0.7 else self.const(a.elem)
        if is_float(a.elem):
            pred = r.choice(("olt", "ogt", "ole", "oge"))
            c = self.emit(f"arith.cmpf {pred}, {a.name}, {b.name} : {a.elem}", "i1", 1)
        else:
            pred = r.choice(("slt", "sgt", "eq", "ne", "sge"))
            c = self.emit(f"arith.cmpi {pred}, {a.name}, {b.name} : {a.elem}", "i1", 1)
        if r.random() < 0.15 and elem != "i1":  # the comparison as a number
            return self.convert(c, elem)
        p = self.expr(leaves, elem, depth - 1)
        q = self.expr(leaves, elem, depth - 1)
        return self.emit(f"arith.select {c.name}, {p.name}, {q.name} : {elem}", elem,
                         max(p.bound, q.bound))

    def combine(self, acc: S, x: S, points: int) -> tuple[S, str]:
        """A reduction step ``acc <- acc (op) x`` over ``points`` points; the bound of the
        result after all of them."""
        r = self.rng
        e = acc.elem
        x = self.convert(x, e)
        if is_float(e):
            kind = r.choice(("addf", "addf", "addf", "maximumf", "minimumf", "maxnumf", "mulf"))
            if kind == "mulf" and points > 4:
                kind = "addf"
            if kind == "addf":
                x = self.squash(x, F_LIMIT)
                out = self.emit(f"arith.addf {acc.name}, {x.name} : {e}", e,
                                acc.bound + points * x.bound)
            elif kind == "mulf":  # factors in [0.5, 1.5]
                t = self.emit(f"math.tanh {x.name} : {e}", e, 1.0)
                h = self.const(e, 0.5)
                ht = self.emit(f"arith.mulf {t.name}, {h.name} : {e}", e, 0.5)
                one = self.const(e, 1.0)
                f = self.emit(f"arith.addf {ht.name}, {one.name} : {e}", e, 1.5)
                out = self.emit(f"arith.mulf {acc.name}, {f.name} : {e}", e, acc.bound * 1.5 ** points)
            else:
                out = self.emit(f"arith.{kind} {acc.name}, {x.name} : {e}", e, max(acc.bound, x.bound))
            return out, kind
        kind = r.choice(("addi", "addi", "maxsi", "minsi", "xori", "ori"))
        if kind == "addi":
            x = self.squash(x, I_LIMIT // 64)
            return self.emit(f"arith.addi {acc.name}, {x.name} : {e}", e,
                             acc.bound + points * x.bound), kind
        if kind in ("xori", "ori"):
            x = self.squash(x, I_LIMIT)
            b = 2 ** math.ceil(math.log2(max(acc.bound, x.bound) + 1))
            return self.emit(f"arith.{kind} {acc.name}, {x.name} : {e}", e, b), kind
        return self.emit(f"arith.{kind} {acc.name}, {x.name} : {e}", e, max(acc.bound, x.bound)), kind


def affine_map_text(n_dims: int, results: list) -> str:
    dims = ", ".join(f"d{i}" for i in range(n_dims))
    res = ", ".join(f"d{x}" if isinstance(x, int) else "0" for x in results)
    return f"affine_map<({dims}) -> ({res})>"


CONST0 = "0"  # a map result that is the constant 0 (a unit dim)
