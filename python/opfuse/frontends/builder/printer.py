"""MLIR text for an ``opfuse.builder.Graph``: one ``func.func`` of linalg on tensors.

The IR conventions are the builder's (see ``opfuse.frontends.builder.graph``); this module only
spells them. Kept apart from the graph so that each file stays readable.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .graph import Graph, Shape, Tensor
from .tensor import _is_int, _Node

# -inf, +inf and NaN as the bit patterns of each type: a decimal literal cannot spell them.
_NEG_INF = {"f32": "0xFF800000", "f16": "0xFC00", "bf16": "0xFF80"}
_POS_INF = {"f32": "0x7F800000", "f16": "0x7C00", "bf16": "0x7F80"}
_NAN = {"f32": "0x7FC00000", "f16": "0x7E00", "bf16": "0x7FC0"}

_UNARY_MATH = ("exp", "log", "tanh", "erf", "sin", "cos", "sqrt", "rsqrt")
_BINARY_ARITH = {
    "add": "arith.addf",
    "sub": "arith.subf",
    "mul": "arith.mulf",
    "div": "arith.divf",
    "maximum": "arith.maximumf",
    "minimum": "arith.minimumf",
}
_INT_ARITH = {
    "add": "arith.addi",
    "sub": "arith.subi",
    "mul": "arith.muli",
    "maximum": "arith.maxsi",
    "minimum": "arith.minsi",
}
# comparison -> (arith.cmpf predicate, arith.cmpi predicate): ordered, except ``ne``, which
# is true on NaN like torch's and numpy's
_COMPARE = {
    "eq": ("oeq", "eq"),
    "ne": ("une", "ne"),
    "lt": ("olt", "slt"),
    "le": ("ole", "sle"),
    "gt": ("ogt", "sgt"),
    "ge": ("oge", "sge"),
}
_INT_BITS = {"i8": 8, "i32": 32, "i64": 64}
_REDUCE = {"sum": ("arith.addf", 0.0), "max": ("arith.maximumf", -math.inf)}


def _tensor_type(shape: Shape, dtype: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"


def _float_literal(value: float, dtype: str) -> str:
    if math.isnan(value):
        return _NAN[dtype]
    if math.isinf(value):
        return (_NEG_INF if value < 0 else _POS_INF)[dtype]
    text = repr(float(value))
    # MLIR float literals need a '.' before an exponent ("1e-05" lexes as an integer).
    return text if "." in text else text.replace("e", ".0e")


def _affine_map(rank: int, results: Sequence[int | str]) -> str:
    dims = ", ".join(f"d{i}" for i in range(rank))
    res = ", ".join(f"d{r}" if isinstance(r, int) else r for r in results)
    return f"affine_map<({dims}) -> ({res})>"


class _Body:
    """The scalar payload of one ``linalg.generic``, in the op's dtype ``t``."""

    def __init__(self, printer: Printer, dtype: str):
        self.p, self.t, self.lines = printer, dtype, []

    def op(self, text: str) -> str:
        v = self.p.fresh()
        self.lines.append(f"{v} = {text}")
        return v

    def const(self, value: float, t: str | None = None) -> str:
        t = t or self.t
        literal = str(int(value)) if _is_int(t) else _float_literal(value, t)
        return self.op(f"arith.constant {literal} : {t}")

    def to_f32(self, v: str, t: str | None = None) -> str:
        t = t or self.t
        return v if t == "f32" else self.op(f"arith.extf {v} : {t} to f32")

    def from_f32(self, v: str) -> str:
        return v if self.t == "f32" else self.op(f"arith.truncf {v} : f32 to {self.t}")

    def truth(self, v: str, t: str, negate: bool = False) -> str:
        """The i1 ``v != 0`` (``v == 0`` if ``negate``) of a value of type ``t``."""
        zero = self.const(0, t)
        if _is_int(t):
            return self.op(f"arith.cmpi {'eq' if negate else 'ne'}, {v}, {zero} : {t}")
        return self.op(f"arith.cmpf {'oeq' if negate else 'une'}, {v}, {zero} : {t}")

    def bounded_index(self, v: str, t: str, n: int) -> str:
        """The ``index`` of the integer ``v`` (type ``t``) into a dim of size ``n``: ``v + n``
        if negative, then clamped to ``[0, n - 1]`` (never outside the buffer)."""
        zero, size, last = self.const(0, t), self.const(n, t), self.const(n - 1, t)
        negative = self.op(f"arith.cmpi slt, {v}, {zero} : {t}")
        wrapped = self.op(f"arith.addi {v}, {size} : {t}")
        w = self.op(f"arith.select {negative}, {wrapped}, {v} : {t}")
        clamped = self.op(f"arith.minsi {self.op(f'arith.maxsi {w}, {zero} : {t}')}, {last} : {t}")
        return self.op(f"arith.index_cast {clamped} : {t} to index")

    def boolean(self, c: str) -> str:
        """An i1 widened to the i8 that booleans are stored as."""
        return self.op(f"arith.extui {c} : i1 to i8")

    def compute(self, fn: str, a: list[str], attrs: dict, types: list[str]) -> str:
        """Emit ``fn`` on the operand names ``a`` of types ``types``; returns the result."""
        t = self.t
        if fn in _COMPARE:
            src, (fpred, ipred) = types[0], _COMPARE[fn]
            cmp = f"arith.cmpi {ipred}" if _is_int(src) else f"arith.cmpf {fpred}"
            return self.boolean(self.op(f"{cmp}, {a[0]}, {a[1]} : {src}"))
        if fn == "where":
            c = self.truth(a[0], types[0])
            return self.op(f"arith.select {c}, {a[1]}, {a[2]} : {t}")
        if fn == "logical_not":
            return self.boolean(self.truth(a[0], types[0], negate=True))
        if fn in ("logical_and", "logical_or"):
            x, y = self.truth(a[0], types[0]), self.truth(a[1], types[1])
            return self.boolean(self.op(f"arith.{fn[8:]}i {x}, {y} : i1"))
        if fn == "cast":
            return self._cast(a[0], types[0])
        if fn in ("iota", "full"):
            return self._source(fn, attrs)
        if fn == "copy":
            return a[0]
        if _is_int(t):
            return self._integer(fn, a)
        if fn in _BINARY_ARITH:
            return self.op(f"{_BINARY_ARITH[fn]} {a[0]}, {a[1]} : {t}")
        if fn == "neg":
            return self.op(f"arith.negf {a[0]} : {t}")
        if fn == "relu":
            zero = self.const(0.0)
            return self.op(f"arith.maximumf {a[0]}, {zero} : {t}")
        # transcendental: computed in f32 so that f16/bf16 lower everywhere
        x = self.to_f32(a[0])
        if fn in _UNARY_MATH:
            r = self.op(f"math.{fn} {x} : f32")
        elif fn == "sigmoid":
            one = self.const(1.0, "f32")
            neg = self.op(f"arith.negf {x} : f32")
            e = self.op(f"math.exp {neg} : f32")
            den = self.op(f"arith.addf {e}, {one} : f32")
            r = self.op(f"arith.divf {one}, {den} : f32")
        else:
            r = self._pow(x, attrs["exponent"])
        return self.from_f32(r)

    def _integer(self, fn: str, a: list[str]) -> str:
        t = self.t
        if fn in _INT_ARITH:
            return self.op(f"{_INT_ARITH[fn]} {a[0]}, {a[1]} : {t}")
        zero = self.const(0)
        if fn == "neg":
            return self.op(f"arith.subi {zero}, {a[0]} : {t}")
        return self.op(f"arith.maxsi {a[0]}, {zero} : {t}")  # relu

    def _cast(self, v: str, src: str) -> str:
        """``v`` of type ``src`` converted to the body's type (see ``Graph.cast``)."""
        t = self.t
        if t == "i8":
            return self.boolean(self.truth(v, src))
        if _is_int(src) and _is_int(t):  # i8 booleans are 0/1; i32 <-> i64 keep the sign
            wider = _INT_BITS[t] > _INT_BITS[src]
            conv = ("extui" if src == "i8" else "extsi") if wider else "trunci"
            return self.op(f"arith.{conv} {v} : {src} to {t}")
        if _is_int(src):  # to a float, through f32
            conv = "uitofp" if src == "i8" else "sitofp"
            return self.from_f32(self.op(f"arith.{conv} {v} : {src} to f32"))
        if _is_int(t):
            return self.op(f"arith.fptosi {self.to_f32(v, src)} : f32 to {t}")
        if src == "f32":
            return self.op(f"arith.truncf {v} : f32 to {t}")
        return self.from_f32(self.to_f32(v, src))  # a half type to f32 or to the other half

    def _source(self, fn: str, attrs: dict) -> str:
        if fn == "full":
            return self.const(attrs["value"])
        i = self.op(f"linalg.index {attrs['axis']} : index")
        n = self.op(f"arith.index_cast {i} : index to i64")
        start, step = attrs["start"], attrs["step"]
        if _is_int(self.t):
            if step != 1:
                n = self.op(f"arith.muli {n}, {self.const(step)} : i64")
            return n if start == 0 else self.op(f"arith.addi {n}, {self.const(start)} : i64")
        x = self.op(f"arith.sitofp {n} : i64 to f32")
        if step != 1:
            x = self.op(f"arith.mulf {x}, {self.const(step, 'f32')} : f32")
        if start != 0:
            x = self.op(f"arith.addf {x}, {self.const(start, 'f32')} : f32")
        return self.from_f32(x)

    def _pow(self, x: str, exponent: float) -> str:
        if exponent.is_integer() and 1 <= exponent <= 4:
            r = x
            for _ in range(int(exponent) - 1):
                r = self.op(f"arith.mulf {r}, {x} : f32")
            return r
        c = self.const(exponent, "f32")
        return self.op(f"math.powf {x}, {c} : f32")


class Printer:
    """Prints the live nodes of a graph as MLIR text in the ops' custom syntax."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.lines: list[str] = []
        self.vals: dict[int, str] = {}
        self.count = 0

    def fresh(self) -> str:
        v = f"%{self.count}"
        self.count += 1
        return v

    def val(self, t: Tensor) -> str:
        return self.vals[id(t.node)]

    def emit(self, text: str, node: _Node) -> str:
        v = self.fresh()
        self.lines.append(f'    {v} = {text} loc("{node.name}")')
        return v

    def module(self, comment: str | None) -> str:
        g = self.g
        for t in g.inputs:
            self.vals[id(t.node)] = f"%{t.name}"
        for node in g._live_nodes():
            self.vals[id(node)] = getattr(self, f"_{node.op}")(node)
        args = ", ".join(f'%{t.name}: {_ty(t)} loc("{t.name}")' for t in g.inputs)
        types = ", ".join(_ty(t) for t in g.outputs)
        results = ", ".join(self.val(t) for t in g.outputs)
        return "\n".join(
            [
                *([f"// {comment}"] if comment else []),
                "module {",
                f"  func.func @{g.name}({args}) -> ({types}) {{",
                *self.lines,
                f"    return {results} : {types}",
                f'  }} loc("{g.name}")',
                "}",
                "",
            ]
        )

    def _init(self, node: _Node, value: float | None) -> str:
        """``tensor.empty`` for ``node``'s result, filled with ``value`` unless None."""
        ty = _tensor_type(node.shape, node.dtype)
        e = self.emit(f"tensor.empty() : {ty}", node)
        if value is None:
            return e
        literal = str(int(value)) if _is_int(node.dtype) else _float_literal(value, node.dtype)
        c = self.emit(f"arith.constant {literal} : {node.dtype}", node)
        return self.emit(f"linalg.fill ins({c} : {node.dtype}) outs({e} : {ty}) -> {ty}", node)

    def _generic(
        self,
        node: _Node,
        ins: list[Tensor],
        maps: list[str],
        iterators: list[str],
        init: str,
        payload: Callable[[_Body, list[str], str], str],
    ) -> str:
        ty = _tensor_type(node.shape, node.dtype)
        result = self.fresh()
        block = [self.fresh() for _ in ins]
        acc = self.fresh()
        body = _Body(self, node.dtype)
        r = payload(body, block, acc)
        names = ", ".join(self.val(t) for t in ins)
        types = ", ".join(_ty(t) for t in ins)
        operands = f" ins({names} : {types})" if ins else ""  # iota, full: no inputs
        bb_args = [f"{v}: {t.dtype}" for v, t in zip(block, ins)] + [f"{acc}: {node.dtype}"]
        iters = ", ".join(f'"{i}"' for i in iterators)
        self.lines += [
            f"    {result} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
            f"iterator_types = [{iters}]}}{operands} outs({init} : {ty}) {{",
            f"    ^bb0({', '.join(bb_args)}):",
            *(f"      {line}" for line in body.lines),
            f"      linalg.yield {r} : {node.dtype}",
            f'    }} -> {ty} loc("{node.name}")',
        ]
        return result

    def _ew(self, node: _Node) -> str:
        ins = [a for a in node.args if isinstance(a, Tensor)]
        rank = len(node.shape)
        maps = [_affine_map(rank, m) for m in node.attrs["maps"]]
        maps.append(_affine_map(rank, range(rank)))

        scalar = node.attrs.get("src", node.dtype)  # python numbers: constants of the operands'
        types = [a.dtype if isinstance(a, Tensor) else scalar for a in node.args]

        def payload(body: _Body, block: list[str], acc: str) -> str:
            it = iter(block)
            operands = [
                next(it) if isinstance(a, Tensor) else body.const(a, scalar) for a in node.args
            ]
            return body.compute(node.attrs["fn"], operands, node.attrs, types)

        init = self._init(node, None)
        return self._generic(node, ins, maps, ["parallel"] * rank, init, payload)

    def _reduce(self, node: _Node) -> str:
        (x,) = node.args
        axes = node.attrs["axes"]
        op, init = _REDUCE[node.attrs["kind"]]
        kept = [k for k in range(x.ndim) if k not in axes]
        maps = [_affine_map(x.ndim, range(x.ndim)), _affine_map(x.ndim, kept)]
        iterators = ["reduction" if k in axes else "parallel" for k in range(x.ndim)]

        def payload(body: _Body, block: list[str], acc: str) -> str:
            v = block[0]
            if x.dtype != node.dtype:  # a half-precision input summed in f32
                v = body.op(f"arith.extf {v} : {x.dtype} to {node.dtype}")
            return body.op(f"{op} {v}, {acc} : {node.dtype}")

        return self._generic(node, [x], maps, iterators, self._init(node, init), payload)

    def _cumsum(self, node: _Node) -> str:
        """A running sum along ``axis`` as a reduction over a triangular domain: loop ``r``
        (the last) runs along the axis, and the point ``j`` adds ``x[.., r, ..]`` where
        ``r <= j`` (``builder_reductions.cumsum``)."""
        (x,) = node.args
        axis, n = node.attrs["axis"], x.ndim
        src = [f"d{n}" if k == axis else f"d{k}" for k in range(n)]
        maps = [f"affine_map<({', '.join(f'd{k}' for k in range(n + 1))}) -> ({', '.join(src)})>",
                _affine_map(n + 1, range(n))]
        t = node.dtype

        def payload(body: _Body, block: list[str], acc: str) -> str:
            v = block[0]
            if x.dtype != t:  # a half-precision input summed in f32
                v = body.op(f"arith.extf {v} : {x.dtype} to {t}")
            j = body.op(f"linalg.index {axis} : index")
            r = body.op(f"linalg.index {n} : index")
            inside = body.op(f"arith.cmpi ule, {r}, {j} : index")
            add = "arith.addi" if _is_int(t) else "arith.addf"
            s = body.op(f"{add} {acc}, {v} : {t}")
            return body.op(f"arith.select {inside}, {s}, {acc} : {t}")

        iterators = ["parallel"] * n + ["reduction"]
        return self._generic(node, [x], maps, iterators, self._init(node, 0), payload)

    def _scatter_add(self, node: _Node) -> str:
        """Rows summed by an index (``builder_gather.scatter_add``): loops ``(v, w.., t..)``,
        the update read at ``(t.., w..)``, the index at ``(t..)``, added where it is ``v``."""
        x, ids = node.args
        k, width = ids.ndim, len(node.shape) - 1
        rank = 1 + width + k
        ts = [1 + width + i for i in range(k)]
        ws = [1 + i for i in range(width)]
        maps = [_affine_map(rank, ts + ws), _affine_map(rank, ts), _affine_map(rank, [0, *ws])]
        t, it = node.dtype, ids.dtype

        def payload(body: _Body, block: list[str], acc: str) -> str:
            v, i = block
            if x.dtype != t:  # a half-precision update summed in f32
                v = body.op(f"arith.extf {v} : {x.dtype} to {t}")
            row = body.op(f"arith.index_cast {body.op('linalg.index 0 : index')} : index to {it}")
            hit = body.op(f"arith.cmpi eq, {i}, {row} : {it}")
            if node.attrs["skip"] is not None:
                keep = body.op(f"arith.cmpi ne, {i}, {body.const(node.attrs['skip'], it)} : {it}")
                hit = body.op(f"arith.andi {hit}, {keep} : i1")
            s = body.op(f"arith.select {hit}, {v}, {body.const(0.0, t)} : {t}")
            return body.op(f"arith.addf {acc}, {s} : {t}")

        iterators = ["parallel"] * (1 + width) + ["reduction"] * k
        return self._generic(node, [x, ids], maps, iterators, self._init(node, 0.0), payload)

    def _take(self, node: _Node) -> str:
        """A gather (``builder_gather``): index tensors as ins, the source read with
        ``tensor.extract`` at loop indices or at bounded index values."""
        x, *index = node.args
        rank = len(node.shape)
        maps = [_affine_map(rank, m) for m in node.attrs["maps"]]
        maps.append(_affine_map(rank, range(rank)))

        def payload(body: _Body, block: list[str], acc: str) -> str:
            coords = []
            for d, c in enumerate(node.attrs["coords"]):
                if isinstance(c, int):
                    coords.append(body.op(f"linalg.index {c} : index"))
                else:
                    coords.append(body.bounded_index(block[c[1]], index[c[1]].dtype, x.shape[d]))
            return body.op(f"tensor.extract {self.val(x)}[{', '.join(coords)}] : {_ty(x)}")

        init = self._init(node, None)
        return self._generic(node, index, maps, ["parallel"] * rank, init, payload)

    def _matmul(self, node: _Node) -> str:
        x, y = node.args
        ty = _tensor_type(node.shape, node.dtype)
        init = self._init(node, 0.0)
        ins = f"ins({self.val(x)}, {self.val(y)} : {_ty(x)}, {_ty(y)})"
        return self.emit(f"linalg.{node.op} {ins} outs({init} : {ty}) -> {ty}", node)

    _batch_matmul = _matmul

    def _transpose(self, node: _Node) -> str:
        (x,) = node.args
        outs = f"outs({self._init(node, None)} : {_tensor_type(node.shape, node.dtype)})"
        perm = node.attrs["perm"]
        return self.emit(
            f"linalg.transpose ins({self.val(x)} : {_ty(x)}) {outs} permutation = {perm}", node
        )

    def _broadcast(self, node: _Node) -> str:
        (x,) = node.args
        outs = f"outs({self._init(node, None)} : {_tensor_type(node.shape, node.dtype)})"
        dims = node.attrs["dims"]
        return self.emit(
            f"linalg.broadcast ins({self.val(x)} : {_ty(x)}) {outs} dimensions = {dims}", node
        )

    def _concat(self, node: _Node) -> str:
        names = ", ".join(self.val(t) for t in node.args)
        types = ", ".join(_ty(t) for t in node.args)
        out = _tensor_type(node.shape, node.dtype)
        axis = node.attrs["axis"]
        return self.emit(f"tensor.concat dim({axis}) {names} : ({types}) -> {out}", node)

    def _collapse(self, node: _Node) -> str:
        (x,) = node.args
        groups, out = node.attrs["groups"], _tensor_type(node.shape, node.dtype)
        return self.emit(
            f"tensor.collapse_shape {self.val(x)} {groups} : {_ty(x)} into {out}", node
        )

    def _expand(self, node: _Node) -> str:
        (x,) = node.args
        groups, out = node.attrs["groups"], _tensor_type(node.shape, node.dtype)
        return self.emit(
            f"tensor.expand_shape {self.val(x)} {groups} output_shape {list(node.shape)} : "
            f"{_ty(x)} into {out}",
            node,
        )

    def _pad(self, node: _Node) -> str:
        (x,) = node.args
        at, dtype = node.attrs, node.dtype
        c = self.emit(f"arith.constant {_float_literal(at['value'], dtype)} : {dtype}", node)
        result = self.fresh()
        indices = ", ".join(f"{self.fresh()}: index" for _ in node.shape)
        self.lines += [
            f"    {result} = tensor.pad {self.val(x)} low{at['low']} high{at['high']} {{",
            f"    ^bb0({indices}):",
            f"      tensor.yield {c} : {dtype}",
            f'    }} : {_ty(x)} to {_tensor_type(node.shape, dtype)} loc("{node.name}")',
        ]
        return result

    def _conv(self, node: _Node) -> str:
        x, w = node.args
        at = node.attrs
        attrs = (
            f"{{dilations = dense<{at['dilations']}> : vector<2xi64>, "
            f"strides = dense<{at['strides']}> : vector<2xi64>}}"
        )
        xv, wv, xt, wt = self.val(x), self.val(w), _ty(x), _ty(w)
        if at["form"] == "nchw":
            op, out_shape = "conv_2d_nchw_fchw", node.shape
        elif at["form"] == "depthwise":  # F x 1 x KH x KW -> F x KH x KW
            op, out_shape = "depthwise_conv_2d_nchw_chw", node.shape
            collapsed = _tensor_type((w.shape[0], *w.shape[2:]), w.dtype)
            wv = self.emit(f"tensor.collapse_shape {wv} [[0, 1], [2], [3]] : {wt} into {collapsed}", node)
            wt = collapsed
        else:  # channels split into groups: N x G x C/G x H x W, G x F/G x C/G x KH x KW
            op, g = "conv_2d_ngchw_gfchw", at["groups"]
            n, c, h, wd = x.shape
            f = w.shape[0]
            xs, ws = (n, g, c // g, h, wd), (g, f // g, *w.shape[1:])
            out_shape = (n, g, f // g, *node.shape[2:])
            xv = self._expand_to(xv, xt, [[0], [1, 2], [3], [4]], xs, x.dtype, node)
            wv = self._expand_to(wv, wt, [[0, 1], [2], [3], [4]], ws, w.dtype, node)
            xt, wt = _tensor_type(xs, x.dtype), _tensor_type(ws, w.dtype)
        ty = _tensor_type(out_shape, node.dtype)
        e = self.emit(f"tensor.empty() : {ty}", node)
        zero = self.emit(f"arith.constant {_float_literal(0.0, node.dtype)} : {node.dtype}", node)
        init = self.emit(f"linalg.fill ins({zero} : {node.dtype}) outs({e} : {ty}) -> {ty}", node)
        r = self.emit(f"linalg.{op} {attrs} ins({xv}, {wv} : {xt}, {wt}) outs({init} : {ty}) -> {ty}", node)
        if out_shape == node.shape:
            return r
        return self.emit(
            f"tensor.collapse_shape {r} [[0], [1, 2], [3], [4]] : {ty} into "
            f"{_tensor_type(node.shape, node.dtype)}",
            node,
        )

    def _expand_to(self, v: str, t: str, groups: list, shape: Shape, dtype: str, node: _Node) -> str:
        out = _tensor_type(shape, dtype)
        return self.emit(
            f"tensor.expand_shape {v} {groups} output_shape {list(shape)} : {t} into {out}", node
        )

    def _reshape(self, node: _Node) -> str:
        (x,) = node.args
        st = f"tensor<{len(node.shape)}xi64>"
        s = self.emit(f"arith.constant dense<{list(node.shape)}> : {st}", node)
        out = _tensor_type(node.shape, node.dtype)
        return self.emit(f"tensor.reshape {self.val(x)}({s}) : ({_ty(x)}, {st}) -> {out}", node)


def _ty(t: Tensor) -> str:
    """The MLIR type of the value behind ``t`` (without pending keepdims axes)."""
    return _tensor_type(t.node.shape, t.dtype)
