"""Random linalg-on-tensors programs, written directly as MLIR text (test_random_linalg.py).

Not through opfuse's builder (test_random_dags.py covers that): the text is what another
producer could print. A program is a ``func.func @main`` over 1-5 tensor arguments and
2-7 ops drawn from:

* ``linalg.generic`` with random indexing maps: the loop domain is an operand's dims in a
  random order plus broadcast dims, each other input maps a random subset of the loops in
  a random order (transposes, broadcasts, projections), unit dims are indexed by the
  constant 0 (``(d0, d1) -> (d0, 0)``) or by a loop of size 1; any subset of the loops
  reduces; one or two outputs, each a permutation of the parallel loops with unit dims
  kept as ``0``; outs operands that the payload reads (a fill, an argument, an earlier
  result: accumulation) or not (``tensor.empty``); payloads mixing arith and math ops,
  ``linalg.index``, comparisons and selects, integer and float conversions;
* named ops: ``linalg.matmul`` (also with transposing ``indexing_maps``),
  ``batch_matmul``, ``transpose``, ``broadcast``, ``reduce``, ``map``, ``fill``, ``copy``,
  the elementwise named ops (``linalg.add``, ``exp``, ``max``, ...) and
  ``linalg.elementwise`` (with broadcasting maps);
* tensor ops: ``expand_shape``, ``collapse_shape``, ``extract_slice`` (strided,
  rank-reducing), ``insert_slice``, ``concat``, ``pad``, ``reshape``; ``tensor.extract``
  of an element feeding scalar arithmetic between ops (used by a later op's payload, a
  fill, a pad value);
* element types f32, f16, bf16, i32 and i64 (and i8/i1 inside payloads).

Values are kept bounded so the comparison with the float64 reference is meaningful:
every value carries a bound on its magnitude, ops that would exceed the limits are
preceded by a squashing op (``tanh``, a remainder), exp/sin/log get small or positive
arguments, divisions are by ``1 + y*y`` or by positive constants. No NaN, no overflow, no
undefined behaviour (integer division by zero, out-of-range float-to-int conversion).

Here: the program, its inputs and the generic op; linalg_program_ops.py draws the named
and tensor ops, linalg_program_values.py the values and the scalar arithmetic.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

import numpy as np

from linalg_program_ops import OpDraws
from linalg_program_values import (  # noqa: F401  (T, S, ttype, is_float: this module's API)
    CONST0, CONSTS, FLOATS, INTS, MAX_REDUCTION, SIZES, S, Scalars, T, affine_map_text, float_text,
    is_float, ttype,
)


@dataclass
class Program:
    """A generated program.

    Attributes:
        text: the MLIR module.
        args: the function's arguments, in order.
        results: the returned values.
        features: what it contains (op names, ``scalar-chain``, ``dense-constant``...).
    """

    seed: int
    text: str
    args: list[T]
    results: list[T]
    features: set[str] = field(default_factory=set)

    @property
    def float_types(self) -> set[str]:
        found = {e for e in ("f32", "bf16") if e in self.text}
        if re.search(r"(?<!b)f16", self.text):
            found.add("f16")
        return found

    @property
    def lowest_float(self) -> str:
        for e in ("bf16", "f16", "f32"):
            if e in self.float_types:
                return e
        return "f32"

    def inputs(self, seed: int | None = None) -> list[np.ndarray]:
        """Arguments at the program's boundary: floats uniform in [-1, 1) rounded to their
        type (bf16 as uint16 bit patterns), integers in [-8, 8]."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        out = []
        for a in self.args:
            if is_float(a.elem):
                x = rng.uniform(-1, 1, a.shape)
                if a.elem == "f32":
                    out.append(x.astype(np.float32))
                elif a.elem == "f16":
                    out.append(x.astype(np.float16))
                else:
                    out.append(bf16_bits(x))
            else:
                dt = np.int32 if a.elem == "i32" else np.int64
                out.append(rng.integers(-8, 9, a.shape).astype(dt))
        return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float values -> bf16 bit patterns (uint16), round to nearest even."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.asarray(rounded.astype(np.uint16))


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_float64(a: np.ndarray, elem: str) -> np.ndarray:
    """A boundary array as the interpreter's values (float64 for floats)."""
    if elem == "bf16":
        return from_bf16_bits(a).astype(np.float64)
    if is_float(elem):
        return a.astype(np.float64)
    return a


class Gen(OpDraws):
    """Draws one program.

    Args:
        seed: the program's seed (everything about it follows from it).
        max_elems: the largest tensor.
        scalar_chains: also draw ``tensor.extract`` + scalar arithmetic between ops.
    """

    def __init__(self, seed: int, *, max_elems: int = 512, scalar_chains: bool = True):
        self.seed = seed
        self.rng = random.Random(seed)
        self.max_elems = max_elems
        self.scalar_chains = scalar_chains
        self.counter = 0
        self.lines: list[str] = []
        self.args: list[T] = []
        self.pool: list[T] = []
        self.features: set[str] = set()
        r = self.rng
        roll = r.random()
        self.float = "f32" if roll < 0.5 else "f16" if roll < 0.7 else "bf16" if roll < 0.9 else None
        self.int = r.choice(INTS)
        #: element types this program's ops produce
        self.elems = ([self.float] if self.float else []) + [self.int]

    # --- names, arguments, pool
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"%{prefix}{self.counter}"

    def elem(self) -> str:
        r = self.rng
        if self.float and r.random() < 0.8:
            return self.float
        if r.random() < 0.1:
            return r.choice(FLOATS)
        return self.int if r.random() < 0.8 or not self.float else self.float

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        r = self.rng
        rank = r.choice((1, 2, 2, 3, 3, 4)) if rank is None else rank
        for _ in range(20):
            shape = tuple(r.choice(SIZES) for _ in range(rank))
            if math.prod(shape) <= self.max_elems:
                return shape
        return (1,) * rank

    def arg(self, shape: tuple[int, ...], elem: str) -> T:
        t = T(f"%arg{len(self.args)}", tuple(shape), elem, 1.0 if is_float(elem) else 8.0)
        self.args.append(t)
        return t

    def pick(self, pred=None, *, fresh_shape=None, elem=None) -> T:
        """A value of the pool (recent ones more likely) that satisfies ``pred``, or a new
        argument (of ``fresh_shape``, ``elem``)."""
        r = self.rng
        cands = [t for t in self.pool if pred is None or pred(t)]
        if cands and (len(self.args) >= 5 or r.random() < 0.8):
            weights = [1 + i for i in range(len(cands))]
            return r.choices(cands, weights)[0]
        shape = fresh_shape if fresh_shape is not None else self.shape()
        return self.add(self.arg(shape, elem or self.elem()))

    def add(self, t: T) -> T:
        self.pool.append(t)
        return t

    def emit(self, text: str) -> None:
        self.lines.append("  " + text)

    # --- small helpers
    def empty(self, shape, elem) -> str:
        name = self.fresh("e")
        self.emit(f"{name} = tensor.empty() : {ttype(shape, elem)}")
        return name

    def fill(self, shape, elem, value=None) -> T:
        s = Scalars(self, self.lines, "  ")
        c = self.scalar_value(elem) if value is None else s.const(elem, value)
        same = [t for t in self.pool if t.shape == tuple(shape) and t.elem == elem]
        # the outs of a fill only gives the shape: sometimes an earlier value
        e = self.rng.choice(same).name if same and self.rng.random() < 0.15 else self.empty(shape, elem)
        name = self.fresh("f")
        self.emit(f"{name} = linalg.fill ins({c.name} : {elem}) outs({e} : {ttype(shape, elem)}) "
                  f"-> {ttype(shape, elem)}")
        self.features.add("linalg.fill")
        return T(name, tuple(shape), elem, c.bound)

    def scalar_value(self, elem: str) -> S:
        """A scalar for a fill or a pad: a constant, or (scalar chains) arithmetic on an
        element extracted from an earlier value."""
        s = Scalars(self, self.lines, "  ")
        if self.scalar_chains and self.pool and self.rng.random() < 0.25:
            return self.scalar_chain(s, elem)
        return s.const(elem)

    def scalar_chain(self, s: Scalars, elem: str) -> S:
        r = self.rng
        src = self.pick()
        idx = []
        for d in src.shape:
            c = self.fresh("c")
            self.emit(f"{c} = arith.constant {r.randrange(d)} : index")
            idx.append(c)
        x = s.emit(f"tensor.extract {src.name}[{', '.join(idx)}] : {src.type}", src.elem, src.bound)
        self.features.add("scalar-chain")
        return s.expr([x], elem, r.randint(1, 2))

    def init(self, shape, elem, *, read: bool) -> T | str:
        """An outs operand: read (a fill, an argument or an earlier value of that type:
        accumulation) or not (tensor.empty)."""
        r = self.rng
        if not read:
            return self.empty(shape, elem)
        roll = r.random()
        if roll < 0.5:
            return self.fill(shape, elem)
        self.features.add("accumulate")
        t = self.pick(lambda t: t.shape == tuple(shape) and t.elem == elem,
                      fresh_shape=tuple(shape), elem=elem)
        return t

    # --- ops
    def generic(self) -> None:
        r = self.rng
        base = self.pick()
        slots: list[int] = []  # domain sizes (before the shuffle)
        base_res: list = []
        for size in base.shape:
            if size == 1 and r.random() < 0.4:
                base_res.append(CONST0)
            else:
                base_res.append(len(slots))
                slots.append(size)
        for _ in range(r.choice((0, 0, 1, 1, 2))):
            size = r.choice(SIZES)
            if math.prod(slots) * size <= self.max_elems * 4:
                slots.append(size)
        n = len(slots)
        perm = list(range(n))
        r.shuffle(perm)  # slot i becomes loop perm[i]
        dom = [0] * n
        for i, size in enumerate(slots):
            dom[perm[i]] = size
        base_res = [perm[x] if isinstance(x, int) else x for x in base_res]
        iters = ["parallel"] * n
        red_points = 1
        for d in range(n):
            if r.random() < 0.3 and red_points * dom[d] <= MAX_REDUCTION:
                iters[d] = "reduction"
                red_points *= dom[d]
        par = [d for d in range(n) if iters[d] == "parallel"]
        if math.prod(dom[d] for d in par) > self.max_elems:
            for d in par:
                big = math.prod(dom[x] for x in range(n) if iters[x] == "parallel") > self.max_elems
                if big and dom[d] > 1 and red_points * dom[d] <= MAX_REDUCTION:
                    iters[d] = "reduction"
                    red_points *= dom[d]
            par = [d for d in range(n) if iters[d] == "parallel"]
            if math.prod(dom[d] for d in par) > self.max_elems:
                return
        ins = [(base, base_res)]
        for _ in range(r.choice((0, 1, 1, 2))):
            ins.append(self._operand_for(dom))
        # every reduction loop must index some input (parallel ones index the outputs)
        covered = {x for _, res in ins for x in res if isinstance(x, int)}
        missing = [d for d in range(n) if iters[d] == "reduction" and d not in covered]
        if missing:
            r.shuffle(missing)
            ins.append((self.add(self.arg(tuple(dom[d] for d in missing), self.elem())), missing))
        outs = []
        for _ in range(r.choice((1, 1, 1, 2))):
            order = par[:]
            r.shuffle(order)
            res: list = list(order)
            if r.random() < 0.3:
                res.insert(r.randrange(len(res) + 1), CONST0)
            shape = tuple(dom[x] if isinstance(x, int) else 1 for x in res)
            if math.prod(shape) > self.max_elems:
                continue
            elem = self.elem()
            read = red_points > 1 or "reduction" in iters or r.random() < 0.3
            outs.append((shape, elem, res, read))
        if not outs:
            return
        inits = [self.init(shape, elem, read=read) for shape, elem, _, read in outs]
        # the body
        body: list[str] = []
        s = Scalars(self, body, "    ")
        leaves, in_args, out_args = [], [], []
        for t, _ in ins:
            a = self.fresh("in")
            in_args.append(f"{a}: {t.elem}")
            leaves.append(S(a, t.elem, t.bound))
        for (shape, elem, _, _), init in zip(outs, inits):
            out_args.append((self.fresh("out"), elem, init.bound if isinstance(init, T) else 0))
        indices = [d for d in range(n) if r.random() < 0.15]
        for d in indices:
            leaves.append(s.emit(f"linalg.index {d} : index", "index", max(dom[d] - 1, 0)))
            self.features.add("linalg.index")
        captured = []
        if self.scalar_chains and self.pool and r.random() < 0.15:
            top = Scalars(self, self.lines, "  ")
            captured.append(self.scalar_chain(top, r.choice(self.elems)))
            leaves.append(captured[-1])
        yields, out_bounds = [], []
        for (shape, elem, _, read), (oname, _, obound) in zip(outs, out_args):
            e = s.expr(leaves, elem, r.randint(1, 3))
            if "reduction" in iters:
                y, kind = s.combine(S(oname, elem, obound), e, red_points)
                self.features.add(f"reduce-{kind}")
            elif read:
                y = s.binary(S(oname, elem, obound), e)
            else:
                y = e
            yields.append(y)
            out_bounds.append(y.bound)
        n_res = len(outs)
        maps = [affine_map_text(n, res) for _, res in ins] + [affine_map_text(n, res) for _, _, res, _ in outs]
        its = ", ".join(f'"{i}"' for i in iters)
        ins_text = ", ".join(t.name for t, _ in ins) + " : " + ", ".join(t.type for t, _ in ins)
        init_names = [i.name if isinstance(i, T) else i for i in inits]
        out_types = [ttype(shape, elem) for shape, elem, _, _ in outs]
        outs_text = ", ".join(init_names) + " : " + ", ".join(out_types)
        name = self.fresh("g")
        lhs = f"{name}:{n_res}" if n_res > 1 else name
        args_text = ", ".join(in_args + [f"{a}: {e}" for a, e, _ in out_args])
        rtypes = ", ".join(out_types)
        self.emit(f"{lhs} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
                  f"iterator_types = [{its}]}} ins({ins_text}) outs({outs_text}) {{")
        self.lines.append(f"  ^bb0({args_text}):")
        self.lines.extend(body)
        self.lines.append(f"    linalg.yield {', '.join(y.name for y in yields)} : "
                          f"{', '.join(e for _, e, _, _ in outs)}")
        self.emit(f"}} -> {'(' + rtypes + ')' if n_res > 1 else rtypes}")
        self.features.add("linalg.generic")
        if "reduction" in iters:
            self.features.add("generic-reduction")
        for k, (shape, elem, _, _) in enumerate(outs):
            ref = f"{name}#{k}" if n_res > 1 else name
            self.add(T(ref, shape, elem, out_bounds[k]))

    def _operand_for(self, dom: list[int]) -> tuple[T, list]:
        """Another input of a generic over loops ``dom``: a pool value whose dims match
        distinct loops of their size (unit dims may be the constant 0), or a new argument
        over a random subset of the loops in a random order."""
        r = self.rng
        cands = list(self.pool)
        r.shuffle(cands)
        for t in cands[:6]:
            res = self._match(t.shape, dom)
            if res is not None and r.random() < 0.7:
                return t, res
        loops = [d for d in range(len(dom)) if r.random() < 0.6]
        r.shuffle(loops)
        res: list = list(loops)
        if r.random() < 0.2:
            res.insert(r.randrange(len(res) + 1), CONST0)
        shape = tuple(dom[x] if isinstance(x, int) else 1 for x in res)
        if r.random() < 0.08 and math.prod(shape) <= 64 and self.float:
            return self.dense_constant(shape), res
        return self.add(self.arg(shape, self.elem())), res

    def _match(self, shape, dom) -> list | None:
        r = self.rng
        used: set[int] = set()
        res: list = []
        for size in shape:
            opts = [d for d in range(len(dom)) if dom[d] == size and d not in used]
            if size == 1 and (not opts or r.random() < 0.4):
                res.append(CONST0)
                continue
            if not opts:
                return None
            d = r.choice(opts)
            used.add(d)
            res.append(d)
        return res

    def dense_constant(self, shape) -> T:
        r = self.rng
        elem = self.float
        vals = [r.choice(CONSTS) for _ in range(math.prod(shape))]
        arr = np.array(vals).reshape(shape)

        def fmt(a) -> str:
            if a.ndim == 0:
                return float_text(float(a))
            return "[" + ", ".join(fmt(x) for x in a) + "]"

        name = self.fresh("cst")
        self.emit(f"{name} = arith.constant dense<{fmt(arr)}> : {ttype(shape, elem)}")
        self.features.add("dense-constant")
        return T(name, tuple(shape), elem, max(abs(v) for v in vals))

    # --- the program
    OPS = (("generic", 10), ("matmul", 2), ("batch_matmul", 1), ("transpose", 1),
           ("broadcast", 1), ("reduce", 2), ("map", 1), ("elementwise", 3), ("copy", 0.3),
           ("expand", 1), ("collapse", 1), ("extract_slice", 1), ("insert_slice", 0.7),
           ("concat", 1), ("pad", 1), ("reshape", 0.4))

    def draw(self) -> Program:
        r = self.rng
        first = self.shape()
        self.add(self.arg(first, self.elem()))
        names, weights = zip(*self.OPS)
        for _ in range(r.randint(2, 7)):
            kind = r.choices(names, weights)[0]
            {"generic": self.generic, "matmul": lambda: self.matmul(False),
             "batch_matmul": lambda: self.matmul(True), "transpose": self.transpose,
             "broadcast": self.broadcast, "reduce": self.reduce, "map": self.map_op,
             "elementwise": self.elementwise_named, "copy": self.copy, "expand": self.expand,
             "collapse": self.collapse, "extract_slice": self.extract_slice,
             "insert_slice": self.insert_slice, "concat": self.concat, "pad": self.pad,
             "reshape": self.reshape}[kind]()
        computed = [t for t in self.pool if not t.name.startswith("%arg")]
        if not computed:
            self.generic()
            computed = [t for t in self.pool if not t.name.startswith("%arg")] or self.pool[:1]
        results = [computed[-1]]
        for t in r.sample(computed[:-1], min(len(computed) - 1, r.choice((0, 0, 1, 2)))):
            results.append(t)
        if r.random() < 0.05:
            results.append(self.args[0])  # an argument returned as it is
        sig = ", ".join(f"{a.name}: {a.type}" for a in self.args)
        rtypes = ", ".join(t.type for t in results)
        text = "\n".join(
            [f"func.func @main({sig}) -> ({rtypes}) {{", *self.lines,
             f"  return {', '.join(t.name for t in results)} : {rtypes}", "}", ""])
        return Program(self.seed, text, list(self.args), results, set(self.features))


def program(seed: int, **options) -> Program:
    """The program of ``seed``."""
    return Gen(seed, **options).draw()
