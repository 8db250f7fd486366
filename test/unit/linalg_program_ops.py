"""The named linalg ops and the tensor ops a random program draws (linalg_programs.py):
each picks operands from the pool (or new arguments), emits one op and adds its result."""

from __future__ import annotations

import math

from linalg_program_values import SIZES, MAX_REDUCTION, S, Scalars, T, affine_map_text, is_float, ttype


class OpDraws:
    """Mixin of linalg_programs.Gen: one method per op kind."""

    def matmul(self, batch: bool) -> None:
        r = self.rng
        combos = [(self.float, self.float)] if self.float else []
        combos += [("f16", "f32"), ("bf16", "f32"), (self.int, self.int)]
        in_elem, out_elem = r.choice(combos)
        variant = r.choice(("mk,kn", "mk,kn", "km,kn", "mk,nk"))
        lead = (r.choice((1, 2, 3)),) if batch else ()
        a = self.pick(lambda t: t.elem == in_elem and len(t.shape) == len(lead) + 2,
                      fresh_shape=lead + self.shape(2), elem=in_elem)
        if batch:
            lead = a.shape[:1]
        if variant.startswith("mk"):
            m, k = a.shape[-2:]
        else:
            k, m = a.shape[-2:]
        nn = r.choice(SIZES)
        bshape = lead + ((k, nn) if variant.endswith("kn") else (nn, k))
        if math.prod(bshape) > self.max_elems or math.prod(lead + (m, nn)) > self.max_elems:
            return
        if tuple(a.shape[-2:]) != ((m, k) if variant.startswith("mk") else (k, m)):
            return
        b = self.pick(lambda t: t.elem == in_elem and t.shape == bshape, fresh_shape=bshape,
                      elem=in_elem)
        oshape = lead + (m, nn)
        if k * a.bound * b.bound > 4096:
            return
        c = self.init(oshape, out_elem, read=True)
        op = "linalg.batch_matmul" if batch else "linalg.matmul"
        maps = ""
        if variant != "mk,kn":
            bd = "d3, " if batch else ""
            pre = "(d3, d0, d1, d2)" if batch else "(d0, d1, d2)"
            amap = f"{bd}d0, d2" if variant.startswith("mk") else f"{bd}d2, d0"
            bmap = f"{bd}d2, d1" if variant.endswith("kn") else f"{bd}d1, d2"
            maps = (f" indexing_maps = [affine_map<{pre} -> ({amap})>, affine_map<{pre} -> ({bmap})>,"
                    f" affine_map<{pre} -> ({bd}d0, d1)>]")
            if batch:  # batch dims come first in the loop order of batch_matmul
                maps = (" indexing_maps = [affine_map<(d0, d1, d2, d3) -> "
                        + ("(d0, d1, d3)" if variant.startswith("mk") else "(d0, d3, d1)")
                        + ">, affine_map<(d0, d1, d2, d3) -> "
                        + ("(d0, d3, d2)" if variant.endswith("kn") else "(d0, d2, d3)")
                        + ">, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]")
        name = self.fresh("mm")
        self.emit(f"{name} = {op}{maps} ins({a.name}, {b.name} : {a.type}, {ttype(bshape, in_elem)}) "
                  f"outs({c.name} : {ttype(oshape, out_elem)}) -> {ttype(oshape, out_elem)}")
        self.features.add(op + ("" if variant == "mk,kn" else "-transposed"))
        self.add(T(name, oshape, out_elem, c.bound + k * a.bound * b.bound))

    def transpose(self) -> None:
        r = self.rng
        x = self.pick(lambda t: len(t.shape) >= 2, fresh_shape=self.shape(r.choice((2, 3))))
        perm = list(range(len(x.shape)))
        while perm == sorted(perm):
            r.shuffle(perm)
        shape = tuple(x.shape[p] for p in perm)
        e = self.empty(shape, x.elem)
        name = self.fresh("tr")
        self.emit(f"{name} = linalg.transpose ins({x.name} : {x.type}) outs({e} : {ttype(shape, x.elem)}) "
                  f"permutation = [{', '.join(map(str, perm))}]")
        self.features.add("linalg.transpose")
        self.add(T(name, shape, x.elem, x.bound))

    def broadcast(self) -> None:
        r = self.rng
        x = self.pick(lambda t: len(t.shape) <= 3)
        shape = list(x.shape)
        dims = []
        for _ in range(r.choice((1, 1, 2))):
            pos = r.randrange(len(shape) + 1)
            shape.insert(pos, r.choice(SIZES))
            dims = [d + 1 if d >= pos else d for d in dims] + [pos]
        if math.prod(shape) > self.max_elems:
            return
        shape = tuple(shape)
        e = self.empty(shape, x.elem)
        name = self.fresh("bc")
        self.emit(f"{name} = linalg.broadcast ins({x.name} : {x.type}) outs({e} : {ttype(shape, x.elem)}) "
                  f"dimensions = [{', '.join(map(str, sorted(dims)))}]")
        self.features.add("linalg.broadcast")
        self.add(T(name, shape, x.elem, x.bound))

    def reduce(self) -> None:
        r = self.rng
        x = self.pick(lambda t: len(t.shape) >= 1 and t.size > 1)
        dims, points = [], 1
        for d in range(len(x.shape)):
            if r.random() < 0.5 and points * x.shape[d] <= MAX_REDUCTION:
                dims.append(d)
                points *= x.shape[d]
        if not dims:
            dims = [0] if x.shape[0] <= MAX_REDUCTION else []
            points = x.shape[0]
        if not dims:
            return
        shape = tuple(s for d, s in enumerate(x.shape) if d not in dims)
        init = self.init(shape, x.elem, read=True)
        body: list[str] = []
        s = Scalars(self, body, "      ")
        a, b = self.fresh("in"), self.fresh("acc")
        y, kind = s.combine(S(b, x.elem, init.bound), S(a, x.elem, x.bound), points)
        name = self.fresh("red")
        self.emit(f"{name} = linalg.reduce ins({x.name} : {x.type}) outs({init.name} : "
                  f"{ttype(shape, x.elem)}) dimensions = [{', '.join(map(str, dims))}]")
        self.lines.append(f"    ({a}: {x.elem}, {b}: {x.elem}) {{")
        self.lines.extend(body)
        self.lines.append(f"      linalg.yield {y.name} : {x.elem}")
        self.lines.append("    }")
        self.features.add("linalg.reduce")
        self.add(T(name, shape, x.elem, y.bound))

    def map_op(self) -> None:
        r = self.rng
        x = self.pick()
        ins = [x]
        if r.random() < 0.6:
            ins.append(self.pick(lambda t: t.shape == x.shape, fresh_shape=x.shape))
        elem = self.elem()
        body: list[str] = []
        s = Scalars(self, body, "      ")
        leaves, args = [], []
        for t in ins:
            a = self.fresh("in")
            args.append(f"{a}: {t.elem}")
            leaves.append(S(a, t.elem, t.bound))
        o = self.fresh("out")
        args.append(f"{o}: {elem}")
        y = s.expr(leaves, elem, r.randint(1, 3))
        e = self.empty(x.shape, elem)
        name = self.fresh("map")
        self.emit(f"{name} = linalg.map ins({', '.join(t.name for t in ins)} : "
                  f"{', '.join(t.type for t in ins)}) outs({e} : {ttype(x.shape, elem)})")
        self.lines.append(f"    ({', '.join(args)}) {{")
        self.lines.extend(body)
        self.lines.append(f"      linalg.yield {y.name} : {elem}")
        self.lines.append("    }")
        self.features.add("linalg.map")
        self.add(T(name, x.shape, elem, y.bound))

    def elementwise_named(self) -> None:
        r = self.rng
        x = self.pick()
        e = x.elem
        fl = is_float(e)
        unary = ["exp", "tanh", "negf", "abs", "square", "erf"] if fl else []
        binary = ["add", "sub", "mul", "max", "min"] + (["div"] if fl else [])
        kind = r.choice(unary + binary + binary)
        use_generic_form = r.random() < 0.35
        if kind in unary:
            if kind == "exp" and x.bound > 2 or kind == "square" and x.bound > 8:
                kind = "tanh"
            bound = {"exp": math.exp(x.bound), "tanh": 1.0, "erf": 1.0,
                     "square": x.bound ** 2}.get(kind, x.bound)
            ins = [(x, None)]
        else:
            if kind == "div":
                # x / (1 + y*y) would be several ops: divide by a fill of 2.0 or 0.5 instead
                y = self.fill(x.shape, e, r.choice((2.0, 0.5, -4.0)))
                bound = x.bound / 0.5
                ins = [(x, None), (y, None)]
            elif use_generic_form and len(x.shape) >= 1 and r.random() < 0.5:
                # linalg.elementwise with a broadcast second operand (a projection)
                keep = sorted(r.sample(range(len(x.shape)), r.randrange(len(x.shape))))
                yshape = tuple(x.shape[d] for d in keep)
                y = self.pick(lambda t: t.shape == yshape and t.elem == e, fresh_shape=yshape, elem=e)
                ins = [(x, None), (y, keep)]
                bound = self._ew_bound(kind, x.bound, y.bound)
            else:
                y = self.pick(lambda t: t.shape == x.shape and t.elem == e, fresh_shape=x.shape, elem=e)
                ins = [(x, None), (y, None)]
                bound = self._ew_bound(kind, x.bound, y.bound)
        if kind == "mul" and bound > 256 or kind in ("add", "sub") and bound > 4096:
            return
        out_t = ttype(x.shape, e)
        em = self.empty(x.shape, e)
        name = self.fresh("ew")
        names = ", ".join(t.name for t, _ in ins)
        types = ", ".join(t.type for t, _ in ins)
        ekind = {"max": "max_signed", "min": "min_signed"}.get(kind, kind)
        if use_generic_form or any(k is not None for _, k in ins):
            rank = len(x.shape)
            maps = ""
            if any(k is not None for _, k in ins):
                ms = [affine_map_text(rank, list(range(rank))) if k is None else affine_map_text(rank, k) for _, k in ins]
                ms.append(affine_map_text(rank, list(range(rank))))
                maps = f" indexing_maps = [{', '.join(ms)}]"
            self.emit(f"{name} = linalg.elementwise kind=#linalg.elementwise_kind<{ekind}>{maps} "
                      f"ins({names} : {types}) outs({em} : {out_t}) -> {out_t}")
            self.features.add("linalg.elementwise")
        else:
            self.emit(f"{name} = linalg.{kind} ins({names} : {types}) outs({em} : {out_t}) -> {out_t}")
            self.features.add(f"linalg.{kind}")
        self.add(T(name, x.shape, e, bound))

    @staticmethod
    def _ew_bound(kind: str, a: float, b: float) -> float:
        return a * b if kind == "mul" else a + b if kind in ("add", "sub") else max(a, b)

    def copy(self) -> None:
        x = self.pick()
        e = self.empty(x.shape, x.elem)
        name = self.fresh("cp")
        self.emit(f"{name} = linalg.copy ins({x.name} : {x.type}) outs({e} : {x.type}) -> {x.type}")
        self.features.add("linalg.copy")
        self.add(T(name, x.shape, x.elem, x.bound))

    def expand(self) -> None:
        r = self.rng
        x = self.pick(lambda t: len(t.shape) <= 3 and len(t.shape) >= 1)
        d = r.randrange(len(x.shape))
        size = x.shape[d]
        splits = [(a, size // a) for a in range(1, size + 1) if size % a == 0]
        a, b = r.choice(splits)
        shape = x.shape[:d] + (a, b) + x.shape[d + 1:]
        reassoc, out = [], 0
        for i in range(len(x.shape)):
            if i == d:
                reassoc.append([out, out + 1])
                out += 2
            else:
                reassoc.append([out])
                out += 1
        name = self.fresh("ex")
        self.emit(f"{name} = tensor.expand_shape {x.name} {reassoc} output_shape "
                  f"[{', '.join(map(str, shape))}] : {x.type} into {ttype(shape, x.elem)}")
        self.features.add("tensor.expand_shape")
        self.add(T(name, shape, x.elem, x.bound))

    def collapse(self) -> None:
        r = self.rng
        x = self.pick(lambda t: len(t.shape) >= 2, fresh_shape=self.shape(3))
        d = r.randrange(len(x.shape) - 1)
        shape = x.shape[:d] + (x.shape[d] * x.shape[d + 1],) + x.shape[d + 2:]
        reassoc, i = [], 0
        while i < len(x.shape):
            if i == d:
                reassoc.append([i, i + 1])
                i += 2
            else:
                reassoc.append([i])
                i += 1
        name = self.fresh("co")
        self.emit(f"{name} = tensor.collapse_shape {x.name} {reassoc} : {x.type} into "
                  f"{ttype(shape, x.elem)}")
        self.features.add("tensor.collapse_shape")
        self.add(T(name, shape, x.elem, x.bound))

    def extract_slice(self) -> None:
        r = self.rng
        x = self.pick(lambda t: t.size > 1)
        offs, sizes, strides = [], [], []
        for n in x.shape:
            st = 2 if n >= 4 and r.random() < 0.3 else 1
            size = r.randint(1, (n - 1) // st + 1)
            off = r.randint(0, n - 1 - (size - 1) * st)
            offs.append(off)
            sizes.append(size)
            strides.append(st)
        shape = [s for s in sizes]
        if 1 in shape and r.random() < 0.5:  # rank-reducing: drop one unit dim
            drop = r.choice([i for i, s in enumerate(shape) if s == 1])
            shape.pop(drop)
        shape = tuple(shape)
        name = self.fresh("sl")
        self.emit(f"{name} = tensor.extract_slice {x.name}[{', '.join(map(str, offs))}] "
                  f"[{', '.join(map(str, sizes))}] [{', '.join(map(str, strides))}] : "
                  f"{x.type} to {ttype(shape, x.elem)}")
        self.features.add("tensor.extract_slice")
        self.add(T(name, shape, x.elem, x.bound))

    def insert_slice(self) -> None:
        r = self.rng
        dst = self.pick(lambda t: t.size > 1)
        sizes = [r.randint(1, n) for n in dst.shape]
        offs = [r.randint(0, n - s) for n, s in zip(dst.shape, sizes)]
        sshape = tuple(sizes)
        src = self.pick(lambda t: t.shape == sshape and t.elem == dst.elem, fresh_shape=sshape,
                        elem=dst.elem)
        name = self.fresh("is")
        self.emit(f"{name} = tensor.insert_slice {src.name} into {dst.name}"
                  f"[{', '.join(map(str, offs))}] [{', '.join(map(str, sizes))}] "
                  f"[{', '.join('1' for _ in sizes)}] : {src.type} into {dst.type}")
        self.features.add("tensor.insert_slice")
        self.add(T(name, dst.shape, dst.elem, max(src.bound, dst.bound)))

    def concat(self) -> None:
        r = self.rng
        a = self.pick(lambda t: len(t.shape) >= 1)
        d = r.randrange(len(a.shape))
        others = [a]
        for _ in range(r.choice((1, 1, 2))):
            want = lambda t: (t.elem == a.elem and len(t.shape) == len(a.shape)  # noqa: E731
                              and all(x == y for i, (x, y) in enumerate(zip(t.shape, a.shape)) if i != d))
            shape = list(a.shape)
            shape[d] = r.choice(SIZES)
            others.append(self.pick(want, fresh_shape=tuple(shape), elem=a.elem))
        shape = list(a.shape)
        shape[d] = sum(t.shape[d] for t in others)
        shape = tuple(shape)
        if math.prod(shape) > self.max_elems:
            return
        name = self.fresh("cat")
        self.emit(f"{name} = tensor.concat dim({d}) {', '.join(t.name for t in others)} : "
                  f"({', '.join(t.type for t in others)}) -> {ttype(shape, a.elem)}")
        self.features.add("tensor.concat")
        self.add(T(name, shape, a.elem, max(t.bound for t in others)))

    def pad(self) -> None:
        r = self.rng
        x = self.pick(lambda t: len(t.shape) >= 1)
        low = [r.choice((0, 0, 1, 2)) for _ in x.shape]
        high = [r.choice((0, 0, 1, 2)) for _ in x.shape]
        shape = tuple(n + lo + hi for n, lo, hi in zip(x.shape, low, high))
        if math.prod(shape) > self.max_elems:
            return
        v = self.scalar_value(x.elem)
        name = self.fresh("pad")
        idx = ", ".join(f"{self.fresh('i')}: index" for _ in x.shape)
        self.emit(f"{name} = tensor.pad {x.name} low[{', '.join(map(str, low))}] "
                  f"high[{', '.join(map(str, high))}] {{")
        self.lines.append(f"  ^bb0({idx}):")
        self.lines.append(f"    tensor.yield {v.name} : {x.elem}")
        self.emit(f"}} : {x.type} to {ttype(shape, x.elem)}")
        self.features.add("tensor.pad")
        self.add(T(name, shape, x.elem, max(x.bound, v.bound)))

    def reshape(self) -> None:
        r = self.rng
        x = self.pick(lambda t: t.size > 1)
        n = x.size
        dims = []
        rest = n
        for _ in range(r.choice((1, 2, 3))):
            divs = [a for a in range(1, rest + 1) if rest % a == 0]
            a = r.choice(divs)
            dims.append(a)
            rest //= a
        dims.append(rest)
        shape = tuple(dims)
        c = self.fresh("shape")
        self.emit(f"{c} = arith.constant dense<[{', '.join(map(str, shape))}]> : tensor<{len(shape)}xi64>")
        name = self.fresh("rs")
        self.emit(f"{name} = tensor.reshape {x.name}({c}) : ({x.type}, tensor<{len(shape)}xi64>) -> "
                  f"{ttype(shape, x.elem)}")
        self.features.add("tensor.reshape")
        self.add(T(name, shape, x.elem, x.bound))
