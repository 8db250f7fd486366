"""A small Python graph builder that writes linalg-on-tensors MLIR and evaluates it in numpy.

A :class:`Graph` records operators on :class:`Tensor` handles; :meth:`Graph.to_mlir` prints
one ``func.func`` in the form the fusion passes expect, and :meth:`Graph.reference`
evaluates the same graph with numpy, independently of the MLIR.

IR conventions (the fusion passes rely on them):

* One ``func.func @<name>``: inputs are arguments in :meth:`Graph.input` order, outputs are
  results in :meth:`Graph.output` order. Static shapes only. Every top-level op carries a
  ``NameLoc`` (``loc("gelu.tanh")``, ``loc("add_2")``); ``tensor.empty``/``linalg.fill``/
  ``arith.constant`` created for an op carry that op's name.
* An elementwise op is one ``linalg.generic``, all iterators ``"parallel"``, identity output
  map, ``tensor.empty`` destination. Broadcasting lives in the *input* maps: a missing
  leading dim is dropped (``(d0, d1) -> (d1)``), a size-1 dim reads index 0
  (``(d0, d1) -> (d0, 0)``). Python scalars are ``arith.constant`` ops inside the body.
* A reduction is one ``linalg.generic`` with ``"reduction"`` iterators on the reduced dims,
  the output map drops them, the init is ``linalg.fill`` of 0 (sum) or -inf (max, written
  as the hex bit pattern, e.g. ``0xFF800000 : f32``). f16/bf16 sums accumulate in f32
  (``arith.extf`` in the body, an f32 init) and are rounded by a following elementwise
  ``arith.truncf`` (named ``round``); other reductions stay in the tensor's dtype. ``keepdims=True`` is lazy: the handle keeps the reduced value and its logical
  shape with 1s; an elementwise consumer drops those axes from its input map
  (``(d0, d1) -> (d0)``). Only an output or a non-elementwise consumer materializes the
  1s with ``tensor.expand_shape``. ``mean`` is ``sum`` then an elementwise multiply by 1/N.
* f16/bf16: transcendental ops (exp, log, tanh, erf, sin, cos, sqrt, rsqrt, pow, sigmoid) are
  computed in f32 inside the body (``arith.extf`` -> math op -> ``arith.truncf``);
  arithmetic (add, mul, ...) stays in the tensor's dtype.
* ``matmul``: ``linalg.matmul`` (2-D) or ``linalg.batch_matmul`` (3-D; 4-D collapses the two
  batch dims with ``tensor.collapse_shape`` and expands the result back) on a
  ``linalg.fill`` 0 init (f32 for f16/bf16 operands, then a ``round`` op back to their
  dtype, like the sums). ``transpose``: ``linalg.transpose``. ``broadcast_to``:
  ``linalg.broadcast`` when it only adds leading dims, else a copy ``linalg.generic`` with a
  broadcasting input map. ``reshape``: ``tensor.collapse_shape``/``tensor.expand_shape``
  when it is a pure collapse or expand, else ``tensor.reshape`` with an i64 shape constant.
  ``concat``: one ``tensor.concat`` however many inputs (the fusion analysis sees a data
  movement op; the CPU backend bufferizes it to copies into subviews; a GPU kernel reads
  the one input an index falls in).
* Composite ops (gelu, silu, softmax, layernorm, rms_norm, mean) are chains of the ops
  above, one generic per step, named ``<scope>.<op>`` (``gelu.tanh``): fusing these chains
  is opfuse's job, so the builder never pre-fuses them.
* Integers and booleans (masks are made of them): ``i64`` tensors hold integers (``iota``,
  index arithmetic: add, sub, mul, neg, maximum, minimum, relu), ``i8`` tensors hold
  booleans as 0 or 1. A boolean is never an ``i1`` tensor: a memref of i1 can be neither a
  kernel argument nor a CPU buffer, so ``i1`` lives only inside a body. Comparisons
  (``eq ne lt le gt ge``: ``arith.cmpf`` ordered, ``une`` for ``ne``, or ``arith.cmpi``
  signed) and ``logical_not/and/or`` widen their ``i1`` with ``arith.extui`` to i8;
  ``where`` narrows its condition back with ``arith.cmpi ne, %c, 0`` and picks with
  ``arith.select``. ``cast`` converts between any two dtypes (to i8 means ``!= 0``).
  Reductions, matmul and the float functions (div, exp, ...) take float tensors only.
* Sources: ``iota`` (``start + step * index`` along one axis) and ``full`` are generics
  with no inputs, their body a ``linalg.index`` or a constant, so they fuse into their
  consumers as cheap elementwise producers. A ``full`` that an elementwise op reads where
  it does not set the op's shape is folded into that op's body as a constant
  (``masked_fill``'s ``where(mask, -inf, x)`` is one generic, like a python scalar).

Reference semantics: every op is computed in float64 and its result rounded to the graph
dtype (float32; float16; bf16 emulated as round-to-nearest-even float32 values, returned as
``np.float32``; i64 truncated toward zero; i8 as ``!= 0``), i.e. every intermediate tensor
has the storage precision the IR gives it.
Reductions are exact-then-rounded, so f16/bf16 sums differ from the IR's f32 accumulation
by the f32 rounding error only.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import OpfuseError

Shape = tuple[int, ...]
Scalar = float | int

DTYPES = ("f32", "f16", "bf16")  # float dtypes: a graph's default, and every op's
INT_DTYPES = ("i64", "i8")  # integers (iota, index arithmetic), booleans (0 or 1)
_ALL_DTYPES = DTYPES + INT_DTYPES
# Names double as SSA names (%x) and locations: MLIR suffix-id characters only.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.$-]*\Z")

_HALF = ("f16", "bf16")


def _np_erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


# The reference implementation of every elementwise function, on float64 arrays.
_NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "erf": _np_erf,
    "sin": np.sin,
    "cos": np.cos,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "copy": lambda x: x,
    "cast": lambda x: x,  # the rounding to the node's dtype happens for every node
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "where": lambda c, x, y: np.where(c != 0, x, y),
    "logical_not": lambda x: x == 0,
    "logical_and": lambda x, y: (x != 0) & (y != 0),
    "logical_or": lambda x, y: (x != 0) | (y != 0),
}
# Functions that also take i64 operands (i8 booleans only compare, select and cast).
_INT_FUNCTIONS = {"add", "sub", "mul", "maximum", "minimum", "neg", "relu", "copy"}


def round_to_dtype(a: np.ndarray | float, dtype: str) -> np.ndarray:
    """Round values to ``dtype``; returned as float64.

    bf16 is emulated: the float32 bits rounded to nearest even on the upper 16 bits. i64
    truncates toward zero (``arith.fptosi``), i8 booleans are ``a != 0``.
    """
    a = np.asarray(a, dtype=np.float64)
    if dtype == "i64":
        return np.trunc(a)
    if dtype == "i8":
        return (a != 0).astype(np.float64)
    if dtype == "f32":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float64)
    bits = np.ascontiguousarray(a.astype(np.float32)).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return bits.view(np.float32).astype(np.float64)


def numpy_dtype(dtype: str) -> type:
    """The numpy type that holds values of ``dtype`` (bf16 values live in float32)."""
    return {
        "f32": np.float32,
        "f16": np.float16,
        "bf16": np.float32,
        "i64": np.int64,
        "i8": np.int8,
    }[_check_dtype(dtype)]


def _check_dtype(dtype: str, allowed: tuple[str, ...] = _ALL_DTYPES) -> str:
    if dtype not in allowed:
        raise OpfuseError(f"unknown dtype {dtype!r}: expected one of {', '.join(allowed)}")
    return dtype


def _is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def _fill_value(t: Any) -> Scalar | None:
    """The value of a ``full`` tensor, else None."""
    if isinstance(t, Tensor) and t.node.op == "ew" and t.node.attrs["fn"] == "full":
        return t.node.attrs["value"]
    return None


def _check_name(name: str, what: str = "op name") -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise OpfuseError(f"invalid {what} {name!r}: use letters, digits, '_', '.', '-', '$'")
    return name


def _reassociation(small: Shape, big: Shape) -> list[list[int]] | None:
    """Groups of ``big``'s dims whose products are ``small``'s dims, or None if none exist."""
    if math.prod(small) != math.prod(big):
        return None
    groups: list[list[int]] = []
    j = 0
    for size in small:
        if j >= len(big):
            return None
        group, prod = [j], big[j]
        j += 1
        while prod < size and j < len(big):
            group.append(j)
            prod *= big[j]
            j += 1
        if prod != size:
            return None
        groups.append(group)
    if j < len(big):  # trailing 1s join the last group
        if not groups:
            return [] if all(d == 1 for d in big) else None
        groups[-1].extend(range(j, len(big)))
    return groups


def _comparison(fn: str, symbol: str) -> Callable[..., Tensor]:
    """The ``Graph`` method of one comparison (they differ in their predicate only)."""

    def compare(self: Graph, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        return self._compare(fn, x, y, name)

    nan = "true" if fn == "ne" else "false"
    compare.__name__ = compare.__qualname__ = fn
    compare.__doc__ = f"``x {symbol} y`` as an i8 boolean, numpy broadcasting ({nan} with NaN)."
    return compare


@dataclass(eq=False)
class _Node:
    """One op of the graph; its result has the physical ``shape``.

    ``op`` is one of: input, ew (elementwise generic), reduce, matmul, batch_matmul,
    transpose, broadcast, concat, collapse, expand, reshape.
    """

    op: str
    name: str
    shape: Shape
    dtype: str
    args: tuple[Any, ...] = ()  # Tensor handles; python numbers for elementwise scalars
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class Tensor:
    """A value of a :class:`Graph`: its logical shape, dtype and the op that computes it.

    Supports ``+ - * / @``, unary ``-`` and ``** constant``; python numbers on either side
    become constants.

    Attributes:
        graph: The graph that owns the value.
        shape: Logical (numpy) shape.
        lazy: Logical axes of size 1 that the underlying value does not have yet
            (a pending ``keepdims=True``; see the module docstring).
    """

    graph: Graph
    node: _Node
    shape: Shape
    lazy: tuple[int, ...] = ()
    _materialized: Tensor | None = field(default=None, repr=False)

    @property
    def dtype(self) -> str:
        """The element type: ``f32``, ``f16``, ``bf16``, ``i64`` or ``i8`` (booleans)."""
        return self.node.dtype

    @property
    def ndim(self) -> int:
        """The logical rank."""
        return len(self.shape)

    @property
    def name(self) -> str:
        """The location name of the op that computes the value (the input's name)."""
        return self.node.name

    def __repr__(self) -> str:
        return f"Tensor({self.node.name!r}, shape={self.shape}, dtype={self.dtype})"

    def __add__(self, o: Operand) -> Tensor:
        return self.graph.add(self, o)

    def __radd__(self, o: Operand) -> Tensor:
        return self.graph.add(o, self)

    def __sub__(self, o: Operand) -> Tensor:
        return self.graph.sub(self, o)

    def __rsub__(self, o: Operand) -> Tensor:
        return self.graph.sub(o, self)

    def __mul__(self, o: Operand) -> Tensor:
        return self.graph.mul(self, o)

    def __rmul__(self, o: Operand) -> Tensor:
        return self.graph.mul(o, self)

    def __truediv__(self, o: Operand) -> Tensor:
        return self.graph.div(self, o)

    def __rtruediv__(self, o: Operand) -> Tensor:
        return self.graph.div(o, self)

    def __neg__(self) -> Tensor:
        return self.graph.neg(self)

    def __pow__(self, exponent: Scalar) -> Tensor:
        return self.graph.pow(self, exponent)

    def __matmul__(self, o: Tensor) -> Tensor:
        return self.graph.matmul(self, o)


Operand = Tensor | float | int
Axes = int | Sequence[int] | None


class Graph:
    """A dataflow graph of tensor operators that prints as one MLIR ``func.func``.

    Every op method takes an optional ``name=`` used as its location (composite ops use it
    as the scope of their parts); without one, ops are named ``<scope>.<op>`` made unique
    with a counter (``mul``, ``mul_1``, ``gelu.tanh``).

    Args:
        name: The function's symbol name.
        dtype: Default element type of inputs: ``f32``, ``f16`` or ``bf16``.
        doc: Optional one-line description, printed as a comment above the module.

    Example:
        >>> g = Graph("g2")
        >>> x, a = g.input("x", (4, 8)), g.input("a", (8,))
        >>> g.output(g.relu(g.tanh(x * a + 1.5)))
        >>> text = g.to_mlir()
        >>> (y,) = g.reference(x=np.ones((4, 8)), a=np.ones(8))
    """

    def __init__(self, name: str, dtype: str = "f32", *, doc: str | None = None):
        self.name = _check_name(name, "graph name")
        self.dtype = _check_dtype(dtype, DTYPES)
        self.doc = doc
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self._nodes: list[_Node] = []  # in creation order, which is a topological order
        self._used_names: set[str] = set()
        self._next_suffix: dict[str, int] = {}
        self._scopes: list[str] = []

    # ----------------------------------------------------------------- graph edges

    def input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> Tensor:
        """Declare a function argument.

        Args:
            name: Argument name: its SSA name, location and :meth:`reference` keyword.
            shape: Static shape; every dim a positive integer.
            dtype: Element type; the graph's default if None. ``i8`` inputs hold booleans
                (0 or 1, like a numpy/torch bool array viewed as int8).

        Returns:
            The argument's tensor handle.
        """
        if _check_name(name, "input name") in self._used_names:
            raise OpfuseError(f"input name {name!r} is already used in graph {self.name!r}")
        shape = self._check_shape(shape, f"input {name!r}")
        self._used_names.add(name)
        t = Tensor(self, _Node("input", name, shape, _check_dtype(dtype or self.dtype)), shape)
        self.inputs.append(t)
        return t

    def output(self, *tensors: Tensor) -> None:
        """Append results to the function (order kept); pending keepdims are materialized."""
        for t in tensors:
            self.outputs.append(self._materialize(self._own(t)))

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[str]:
        """Name the ops built inside the block ``<scope>.<op>`` (``blk.mul``).

        Scopes nest (``blk.ln.sub``) and are made unique (``blk``, ``blk_1``).

        Yields:
            The scope's full name.
        """
        with self._scope(self._unique(self._scoped(None, _check_name(name)))) as full:
            yield full

    # ----------------------------------------------------------------- elementwise

    def add(self, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """``x + y`` with numpy broadcasting."""
        return self._elementwise("add", (x, y), name)

    def sub(self, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """``x - y`` with numpy broadcasting."""
        return self._elementwise("sub", (x, y), name)

    def mul(self, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """``x * y`` with numpy broadcasting."""
        return self._elementwise("mul", (x, y), name)

    def div(self, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """``x / y`` with numpy broadcasting."""
        return self._elementwise("div", (x, y), name)

    def maximum(self, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """Elementwise maximum, NaN-propagating (``arith.maximumf``)."""
        return self._elementwise("maximum", (x, y), name)

    def minimum(self, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """Elementwise minimum, NaN-propagating (``arith.minimumf``)."""
        return self._elementwise("minimum", (x, y), name)

    def neg(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``-x``."""
        return self._elementwise("neg", (x,), name)

    def exp(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``exp(x)``."""
        return self._elementwise("exp", (x,), name)

    def log(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Natural logarithm."""
        return self._elementwise("log", (x,), name)

    def tanh(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Hyperbolic tangent."""
        return self._elementwise("tanh", (x,), name)

    def erf(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Error function (``math.erf``; the CPU lowering needs ``convert-math-to-libm``)."""
        return self._elementwise("erf", (x,), name)

    def sin(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Sine (radians); RoPE's rotation tables."""
        return self._elementwise("sin", (x,), name)

    def cos(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Cosine (radians)."""
        return self._elementwise("cos", (x,), name)

    def sqrt(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Square root."""
        return self._elementwise("sqrt", (x,), name)

    def rsqrt(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``1 / sqrt(x)``."""
        return self._elementwise("rsqrt", (x,), name)

    def relu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``max(x, 0)``."""
        return self._elementwise("relu", (x,), name)

    def sigmoid(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``1 / (1 + exp(-x))``, one generic."""
        return self._elementwise("sigmoid", (x,), name)

    def pow(self, x: Tensor, exponent: Scalar, *, name: str | None = None) -> Tensor:
        """``x ** exponent`` for a constant exponent.

        Integral exponents 1 to 4 are repeated multiplications (exact for negative ``x``),
        others ``math.powf``; for f16/bf16 either is computed in f32.
        """
        if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
            raise OpfuseError("pow: the exponent must be a python number")
        return self._elementwise("pow", (x,), name, exponent=float(exponent))

    def broadcast_to(self, x: Tensor, shape: Sequence[int], *, name: str | None = None) -> Tensor:
        """Broadcast ``x`` to ``shape`` with numpy rules (a materialized copy)."""
        x = self._own(x)
        shape = self._check_shape(shape, "broadcast_to")
        lead = len(shape) - x.ndim
        if lead < 0 or any(s not in (1, shape[lead + i]) for i, s in enumerate(x.shape)):
            raise OpfuseError(f"broadcast_to: cannot broadcast {x.shape} to {shape}")
        if x.shape == shape and not x.lazy:
            return x
        source = self._respaced_source(x, shape, name)
        if source is not None:
            return source
        if x.lazy or x.shape != shape[lead:]:  # size-1 dims: a copy generic reading index 0
            return self._elementwise("copy", (x,), name, out_shape=shape, default="broadcast")
        node = self._node("broadcast", name, shape, x.dtype, (x,), dims=list(range(lead)))
        return Tensor(self, node, shape)

    # ----------------------------------------------------------------- comparisons, selection

    # x OP y as an i8 boolean (1 or 0), numpy broadcasting; a python number is a constant of
    # the other operand's dtype. Ordered: false where either is NaN, except ne (true).
    eq = _comparison("eq", "==")
    ne = _comparison("ne", "!=")
    lt = _comparison("lt", "<")
    le = _comparison("le", "<=")
    gt = _comparison("gt", ">")
    ge = _comparison("ge", ">=")

    def where(self, cond: Tensor, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        """``x`` where ``cond`` is nonzero, else ``y``; numpy broadcasting of all three.

        Args:
            cond: An i8 boolean tensor.
            x: A tensor, or a python number (a constant of the result's dtype).
            y: Likewise; tensors among ``x``, ``y`` share one dtype, which is the result's
                (the graph's default dtype if both are numbers).
            name: Location name.
        """
        cond = self._own(cond)
        if cond.dtype != "i8":
            raise OpfuseError(f"where: the condition must be an i8 boolean, got {cond.dtype}")
        values = [self._own(o) for o in (x, y) if isinstance(o, Tensor)]
        out = self._same_dtype("where", values) if values else self.dtype
        return self._elementwise("where", (cond, x, y), name, dtype=out, src=out)

    def logical_not(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``x == 0`` as an i8 boolean (any dtype; NaN counts as true, like torch)."""
        return self._elementwise("logical_not", (x,), name, dtype="i8")

    def logical_and(self, x: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """``x != 0 and y != 0`` as an i8 boolean; the operands' dtypes may differ."""
        return self._elementwise("logical_and", (self._own(x), self._own(y)), name, dtype="i8")

    def logical_or(self, x: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """``x != 0 or y != 0`` as an i8 boolean; the operands' dtypes may differ."""
        return self._elementwise("logical_or", (self._own(x), self._own(y)), name, dtype="i8")

    def cast(self, x: Tensor, dtype: str, *, name: str | None = None) -> Tensor:
        """``x`` converted to ``dtype`` (``x`` itself if it has that dtype already).

        Floats round to nearest even (``arith.extf``/``truncf``); i64 and i8 become floats
        exactly below 2**24 (``arith.sitofp``/``uitofp``; half types through f32); floats
        become i64 truncated toward zero (``arith.fptosi``); anything becomes an i8 boolean
        as ``x != 0`` (NaN is true).
        """
        x = self._own(x)
        if _check_dtype(dtype) == x.dtype:
            return x
        value = _fill_value(x)
        if value is not None:  # a constant, cast, is a constant (unless inf/NaN to i64)
            v = float(round_to_dtype(value, dtype))
            if not _is_int(dtype) or math.isfinite(v):
                return self.full(x.shape, int(v) if _is_int(dtype) else v, dtype=dtype, name=name)
        return self._elementwise("cast", (x,), name, dtype=dtype, src=x.dtype)

    # ----------------------------------------------------------------- sources

    def iota(
        self,
        shape: Sequence[int],
        axis: int = -1,
        *,
        start: Scalar = 0,
        step: Scalar = 1,
        dtype: str | None = None,
        name: str | None = None,
    ) -> Tensor:
        """``start + step * i`` at every index whose coordinate along ``axis`` is ``i``.

        One generic with no inputs: ``linalg.index`` cast to i64, times ``step``, plus
        ``start`` (in f32 for float dtypes, then rounded). ``iota((n,), 0)`` is
        ``arange(n)``; ``iota((L, S), 0)`` and ``iota((L, S), 1)`` are the row and column
        numbers a causal mask compares.

        Args:
            shape: The result's static shape.
            axis: The axis the values run along.
            start: The value at index 0 (an integer for i64).
            step: The increment per index (an integer for i64).
            dtype: A float dtype or i64 (default: the graph's).
            name: Location name.
        """
        shape = self._check_shape(shape, "iota")
        if not -len(shape) <= axis < len(shape):
            raise OpfuseError(f"iota: axis {axis} out of range for shape {shape}")
        dtype = _check_dtype(dtype or self.dtype, (*DTYPES, "i64"))
        for what, v in (("start", start), ("step", step)):
            self._check_scalar("iota", v, dtype, what)
        return self._source(
            "iota", shape, dtype, name, axis=axis % len(shape), start=start, step=step
        )

    def full(
        self,
        shape: Sequence[int],
        value: Scalar,
        *,
        dtype: str | None = None,
        name: str | None = None,
    ) -> Tensor:
        """A tensor of ``shape`` (``()`` for a scalar) holding ``value`` everywhere.

        A generic whose body yields a constant; an elementwise op that reads it where it
        does not set the op's shape gets ``value`` as a constant in its own body instead.
        For i8, ``value`` is a boolean (``True``/``False`` or 1/0).
        """
        shape = self._check_shape(shape, "full")
        dtype = _check_dtype(dtype or self.dtype)
        value = int(bool(value)) if dtype == "i8" else value
        self._check_scalar("full", value, dtype, "value")
        return self._source("full", shape, dtype, name, value=value)

    # ----------------------------------------------------------------- reductions

    def sum(
        self,
        x: Tensor,
        axis: Axes = None,
        keepdims: bool = False,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Sum over ``axis`` (all axes if None), accumulating in ``x``'s dtype."""
        return self._reduce("sum", x, axis, keepdims, name)

    def max(
        self,
        x: Tensor,
        axis: Axes = None,
        keepdims: bool = False,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Maximum over ``axis`` (all axes if None), from an init of -inf."""
        return self._reduce("max", x, axis, keepdims, name)

    def mean(
        self,
        x: Tensor,
        axis: Axes = None,
        keepdims: bool = False,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Mean over ``axis``: a sum, then an elementwise multiply by 1/N."""
        x = self._own(x)
        count = math.prod(x.shape[a] for a in self._axes(x, axis))
        with self._composite(name, "mean"):
            s = self._reduce("sum", x, axis, keepdims, None)
            return self._elementwise("mul", (s, 1.0 / count), None)

    # ----------------------------------------------------------------- data movement

    def transpose(self, x: Tensor, perm: Sequence[int], *, name: str | None = None) -> Tensor:
        """Permute dims: result dim ``i`` is ``x``'s dim ``perm[i]`` (``linalg.transpose``)."""
        x = self._materialize(self._own(x))
        perm = [int(p) for p in perm]
        if sorted(perm) != list(range(x.ndim)):
            raise OpfuseError(f"transpose: {perm} is not a permutation of {x.ndim} dims")
        shape = tuple(x.shape[p] for p in perm)
        return Tensor(self, self._node("transpose", name, shape, x.dtype, (x,), perm=perm), shape)

    def reshape(self, x: Tensor, shape: Sequence[int], *, name: str | None = None) -> Tensor:
        """Reshape in row-major order; one dim may be -1.

        A pure collapse or expand becomes ``tensor.collapse_shape``/``tensor.expand_shape``,
        anything else ``tensor.reshape``.
        """
        x = self._materialize(self._own(x))
        shape = self._infer_shape(x, shape)
        if shape == x.shape:
            return x
        source = self._respaced_source(x, shape, name, reshape=True)
        if source is not None:
            return source
        op, groups = "reshape", None
        if len(shape) < x.ndim:
            op, groups = "collapse", _reassociation(shape, x.shape)
        elif len(shape) > x.ndim:
            op, groups = "expand", _reassociation(x.shape, shape)
        if groups is None:
            op = "reshape"
        node = self._node(op, name, shape, x.dtype, (x,), "reshape", groups=groups)
        return Tensor(self, node, shape)

    def concat(
        self, tensors: Sequence[Tensor], axis: int = 0, *, name: str | None = None
    ) -> Tensor:
        """Join tensors along ``axis`` like ``np.concatenate``: one ``tensor.concat``.

        Args:
            tensors: One or more tensors of one dtype and rank whose shapes agree except
                along ``axis`` (a single tensor is returned as it is).
            axis: The axis to join along; negative counts from the end.
            name: Location name.
        """
        parts = [self._materialize(self._own(t)) for t in tensors]
        if not parts:
            raise OpfuseError("concat: needs at least one tensor")
        dtype = self._same_dtype("concat", parts)
        rank = parts[0].ndim
        if rank == 0 or any(t.ndim != rank for t in parts):
            ranks = sorted({t.ndim for t in parts})
            raise OpfuseError(f"concat: operands need one rank of at least 1, got ranks {ranks}")
        if not -rank <= axis < rank:
            raise OpfuseError(f"concat: axis {axis} out of range for rank {rank}")
        axis %= rank
        if len({t.shape[:axis] + t.shape[axis + 1 :] for t in parts}) > 1:
            shapes = ", ".join(str(t.shape) for t in parts)
            raise OpfuseError(f"concat: shapes {shapes} differ off axis {axis}")
        if len(parts) == 1:
            return parts[0]
        shape = list(parts[0].shape)
        shape[axis] = sum(t.shape[axis] for t in parts)
        node = self._node("concat", name, tuple(shape), dtype, tuple(parts), axis=axis)
        return Tensor(self, node, node.shape)

    # ----------------------------------------------------------------- contractions

    def matmul(self, x: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """Matrix product of 2-D, 3-D (batched) or 4-D (two batch dims) operands.

        The accumulator (a ``linalg.fill`` of 0) is f32 for f16/bf16 operands, with a ``round``
        op back to their dtype after it, else ``x``'s dtype. 4-D operands
        are collapsed to 3-D (``<name>.lhs``/``.rhs``) and the result expanded (``.out``).
        """
        x, y = (self._materialize(self._own(t)) for t in (x, y))
        self._same_dtype("matmul", (x, y))
        self._float_only("matmul", (x,))
        if x.ndim != y.ndim or x.ndim not in (2, 3, 4):
            raise OpfuseError(
                f"matmul: expected two 2-D, 3-D or 4-D operands, got {x.shape} and {y.shape}"
            )
        if x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-2]:
            raise OpfuseError(f"matmul: shapes {x.shape} and {y.shape} do not match")
        shape = (*x.shape[:-1], y.shape[-1])
        if x.ndim < 4:
            op = "matmul" if x.ndim == 2 else "batch_matmul"
            node = self._node(op, name, shape, self._accumulator(x), (x, y), "matmul")
            return self._round_to(Tensor(self, node, shape), x.dtype)
        full = self._unique(self._scoped(name, "matmul"))
        batch = x.shape[0] * x.shape[1]
        x3 = self.reshape(x, (batch, *x.shape[2:]), name=f"{full}.lhs")
        y3 = self.reshape(y, (batch, *y.shape[2:]), name=f"{full}.rhs")
        shape3 = (batch, *shape[2:])
        acc = self._accumulator(x)
        node = self._node("batch_matmul", None, shape3, acc, (x3, y3), exact=full)
        product = self._round_to(Tensor(self, node, shape3), x.dtype)
        return self.reshape(product, shape, name=f"{full}.out")

    @staticmethod
    def _accumulator(x: Tensor) -> str:
        """f16/bf16 products and sums accumulate in f32 (like torch and cuBLAS)."""
        return "f32" if x.dtype in _HALF else x.dtype

    def _round_to(self, t: Tensor, dtype: str) -> Tensor:
        """``t`` rounded to ``dtype`` by an elementwise ``round`` op (if it is not already)."""
        if t.dtype == dtype:
            return t
        return self._elementwise("cast", (t,), None, default="round", dtype=dtype, src=t.dtype)

    # ----------------------------------------------------------------- compositions

    def gelu(self, x: Tensor, approximate: str = "tanh", *, name: str | None = None) -> Tensor:
        """GELU as a chain of elementwise ops (one generic each).

        Args:
            x: Input.
            approximate: ``"tanh"``: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)));
                ``"none"``: 0.5·x·(1 + erf(x/√2)).
            name: Scope name of the chain.
        """
        if approximate not in ("tanh", "none"):
            raise OpfuseError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
        with self._composite(name, "gelu"):
            if approximate == "tanh":
                inner = self.add(x, self.mul(self.pow(x, 3), 0.044715))
                t = self.tanh(self.mul(inner, math.sqrt(2.0 / math.pi)))
            else:
                t = self.erf(self.mul(x, 1.0 / math.sqrt(2.0)))
            return self.mul(self.mul(x, self.add(t, 1.0)), 0.5)

    def silu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``x * sigmoid(x)``."""
        with self._composite(name, "silu"):
            return self.mul(x, self.sigmoid(x))

    def softmax(self, x: Tensor, axis: int = -1, *, name: str | None = None) -> Tensor:
        """Softmax along ``axis``: exp(x - max) / sum(exp(x - max))."""
        with self._composite(name, "softmax"):
            e = self.exp(self.sub(x, self.max(x, axis, keepdims=True)))
            return self.div(e, self.sum(e, axis, keepdims=True))

    def layernorm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Layer normalization over the last axis (biased variance), optional affine."""
        with self._composite(name, "layernorm"):
            d = self.sub(x, self.mean(x, -1, keepdims=True))
            var = self.mean(self.mul(d, d), -1, keepdims=True)
            y = self.mul(d, self.rsqrt(self.add(var, eps)))
            if weight is not None:
                y = self.mul(y, weight)
            return y if bias is None else self.add(y, bias)

    def rms_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        eps: float = 1e-6,
        *,
        name: str | None = None,
    ) -> Tensor:
        """RMS normalization over the last axis: x · rsqrt(mean(x²) + eps) · weight."""
        with self._composite(name, "rms_norm"):
            ms = self.mean(self.mul(x, x), -1, keepdims=True)
            y = self.mul(x, self.rsqrt(self.add(ms, eps)))
            return y if weight is None else self.mul(y, weight)

    # ----------------------------------------------------------------- results

    def to_mlir(self, comment: str | None = None) -> str:
        """MLIR text of a module holding one ``func.func @<name>`` (see module docstring).

        Only ops that reach an output are printed.

        Args:
            comment: First-line comment; defaults to the graph's ``doc``.
        """
        if not self.outputs:
            raise OpfuseError(f"graph {self.name!r} has no outputs")
        from .printer import Printer  # noqa: PLC0415  (the printer imports this module)

        return Printer(self).module(comment or self.doc)

    def to_module(self, ctx: Any = None) -> Any:
        """The parsed and verified ``mlir.ir.Module`` (raises OpfuseError if invalid)."""
        from ..ir import parse_module

        return parse_module(self.to_mlir(), ctx, filename=f"{self.name}.mlir")

    def reference(self, *args: np.ndarray, **kwargs: np.ndarray) -> list[np.ndarray]:
        """Evaluate the graph with numpy, independently of the MLIR.

        Each op is computed in float64 and rounded to its dtype (see the module docstring).

        Args:
            *args: Input arrays in :meth:`input` order, or
            **kwargs: input arrays by name.

        Returns:
            One array per output, as float32 (f32, bf16 values) or float16 (f16).
        """
        env = self._bind(args, kwargs)
        for node in self._live_nodes():
            env[id(node)] = round_to_dtype(self._eval(node, env), node.dtype)
        return [env[id(t.node)].reshape(t.shape).astype(numpy_dtype(t.dtype)) for t in self.outputs]

    def random_inputs(
        self, seed: int = 0, low: float = -1.0, high: float = 1.0
    ) -> dict[str, np.ndarray]:
        """Uniform random inputs by name, already rounded to each input's dtype (i8: 0 or 1;
        i64: integers in ``[low, high]``)."""
        rng = np.random.default_rng(seed)
        out = {}
        for t in self.inputs:
            if _is_int(t.dtype):  # booleans 0/1; integers in [low, high]
                lo, hi = (0, 1) if t.dtype == "i8" else (math.ceil(low), math.floor(high))
                values = rng.integers(lo, hi + 1, t.shape)
            else:
                values = round_to_dtype(rng.uniform(low, high, t.shape), t.dtype)
            out[t.name] = values.astype(numpy_dtype(t.dtype))
        return out

    # ----------------------------------------------------------------- naming

    def _unique(self, base: str) -> str:
        # remember the last suffix per base: probing from 0 every time made building an
        # n-op graph quadratic
        k = self._next_suffix.get(base, 0)
        name = base if k == 0 else f"{base}_{k}"
        while name in self._used_names:
            k += 1
            name = f"{base}_{k}"
        self._next_suffix[base] = k + 1
        self._used_names.add(name)
        return name

    def _scoped(self, name: str | None, default: str) -> str:
        """``name`` as given (checked), else ``<innermost scope>.<default>``."""
        if name is not None:
            return _check_name(name)
        return f"{self._scopes[-1]}.{default}" if self._scopes else default

    @contextlib.contextmanager
    def _scope(self, full: str) -> Iterator[str]:
        self._scopes.append(full)
        try:
            yield full
        finally:
            self._scopes.pop()

    def _composite(self, name: str | None, default: str) -> contextlib.AbstractContextManager:
        """The scope of a composite op: ``name`` as given, else nested ``default``."""
        return self._scope(self._unique(self._scoped(name, default)))

    def _node(
        self,
        op: str,
        name: str | None,
        shape: Shape,
        dtype: str,
        args: tuple,
        default: str | None = None,
        *,
        exact: str | None = None,
        **attrs: Any,
    ) -> _Node:
        """Append a node named ``exact``, else ``name``/``<scope>.<default or op>`` made unique."""
        if exact is None:
            exact = self._unique(self._scoped(name, default or op))
        node = _Node(op, exact, shape, dtype, args, attrs)
        self._nodes.append(node)
        return node

    # ----------------------------------------------------------------- checks

    def _own(self, t: Any) -> Tensor:
        if not isinstance(t, Tensor):
            raise OpfuseError(f"expected a Tensor, got {type(t).__name__}")
        if t.graph is not self:
            raise OpfuseError(f"tensor {t.name!r} belongs to graph {t.graph.name!r}")
        return t

    @staticmethod
    def _check_shape(shape: Sequence[int], what: str) -> Shape:
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise OpfuseError(f"{what}: shape must be a sequence of ints, got {shape!r}") from None
        if any(d <= 0 for d in dims):
            raise OpfuseError(f"{what}: static positive dims only, got {dims}")
        return dims

    def _infer_shape(self, x: Tensor, shape: Sequence[int]) -> Shape:
        dims = [int(d) for d in shape]
        size = math.prod(x.shape)
        if dims.count(-1) == 1:
            known = math.prod(d for d in dims if d != -1)
            if known > 0 and size % known == 0:
                dims[dims.index(-1)] = size // known
        out = self._check_shape(dims, "reshape")
        if math.prod(out) != size:
            raise OpfuseError(f"reshape: cannot reshape {x.shape} ({size} elements) to {out}")
        return out

    @staticmethod
    def _axes(x: Tensor, axis: Axes) -> tuple[int, ...]:
        raw = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
        axes = []
        for a in raw:
            if not -x.ndim <= int(a) < x.ndim:
                raise OpfuseError(f"axis {a} out of range for shape {x.shape}")
            axes.append(int(a) % x.ndim)
        if len(set(axes)) != len(axes):
            raise OpfuseError(f"repeated axis in {tuple(raw)}")
        return tuple(sorted(axes))

    @staticmethod
    def _same_dtype(op: str, tensors: Sequence[Tensor]) -> str:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1:
            raise OpfuseError(f"{op}: operands have different dtypes {sorted(dtypes)}")
        return dtypes.pop()

    @staticmethod
    def _float_only(op: str, tensors: Sequence[Tensor]) -> None:
        for t in tensors:
            if _is_int(t.dtype):
                raise OpfuseError(f"{op}: {t.dtype} operands are not supported (cast first)")

    @staticmethod
    def _check_scalar(op: str, value: Any, dtype: str, what: str = "scalar") -> None:
        """A python number that an op of ``dtype`` holds as a constant."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OpfuseError(f"{op}: unsupported {what} {value!r}")
        if _is_int(dtype) and not (math.isfinite(value) and float(value).is_integer()):
            raise OpfuseError(f"{op}: {what} {value!r} is not an integer ({dtype} operands)")

    # ----------------------------------------------------------------- op construction

    def _materialize(self, t: Tensor) -> Tensor:
        """``t`` with its pending keepdims 1s made real by one ``tensor.expand_shape``."""
        if not t.lazy:
            return t
        if t._materialized is None:
            value = Tensor(self, t.node, t.node.shape)
            groups = _reassociation(t.node.shape, t.shape)
            full = self._unique(f"{t.node.name}.keepdims")
            node = self._node("expand", None, t.shape, t.dtype, (value,), exact=full, groups=groups)
            t._materialized = Tensor(self, node, t.shape)
        return t._materialized

    def _elementwise(
        self,
        fn: str,
        operands: Sequence[Any],
        name: str | None,
        out_shape: Shape | None = None,
        default: str | None = None,
        *,
        dtype: str | None = None,
        src: str | None = None,
        **attrs: Any,
    ) -> Tensor:
        """One elementwise generic of ``fn`` over broadcast ``operands``.

        ``dtype`` is the result's dtype and ``src`` the operands' (python numbers become
        constants of ``src``); both default to the tensors' common dtype.
        """
        for o in operands:
            if isinstance(o, bool) or not isinstance(o, (Tensor, int, float)):
                raise OpfuseError(f"{fn}: unsupported operand {o!r}")
        if not any(isinstance(o, Tensor) for o in operands):
            raise OpfuseError(f"{fn}: needs at least one Tensor operand")
        if dtype is None:
            tensors = [self._own(o) for o in operands if isinstance(o, Tensor)]
            dtype = src = self._same_dtype(fn, tensors)
            if _is_int(dtype) and (fn not in _INT_FUNCTIONS or dtype == "i8" and fn != "copy"):
                raise OpfuseError(f"{fn}: {dtype} operands are not supported (cast first)")
        if src is not None:
            operands = self._fold_fills(operands, src, out_shape)
            for o in operands:
                if not isinstance(o, Tensor):
                    self._check_scalar(fn, o, src)
            attrs["src"] = src
        tensors = [self._own(o) for o in operands if isinstance(o, Tensor)]
        shape, lazy = self._broadcast(fn, tensors, out_shape)
        if not lazy and out_shape is None:  # sources read through a broadcast: in our shape
            operands = [self._widened(o, shape) for o in operands]
            tensors = [o for o in operands if isinstance(o, Tensor)]
        domain = [k for k in range(len(shape)) if k not in lazy]
        maps = [self._input_map(t, shape, domain) for t in tensors]
        physical = tuple(shape[k] for k in domain)
        node = self._node(
            "ew",
            name,
            physical,
            dtype,
            tuple(operands),
            default or fn,
            fn=fn,
            maps=maps,
            logical=shape,
            **attrs,
        )
        return Tensor(self, node, shape, lazy)

    def _fold_fills(self, operands: Sequence[Any], src: str, out_shape: Shape | None) -> list[Any]:
        """``operands`` with each ``full`` tensor of dtype ``src`` replaced by its value where
        the other tensors alone broadcast to the same shape (the value becomes a constant
        in the body, as if the caller had passed a python number)."""
        out = list(operands)
        for i, o in enumerate(operands):
            value = _fill_value(o)
            rest = [t.shape for t in out if isinstance(t, Tensor) and t is not o]
            if value is None or o.dtype != src or not rest:
                continue
            rest += [out_shape] if out_shape is not None else []
            try:
                if np.broadcast_shapes(*rest) == np.broadcast_shapes(*rest, o.shape):
                    out[i] = value
            except ValueError:
                continue  # _broadcast reports it
        return out

    def _source(self, fn: str, shape: Shape, dtype: str, name: str | None, **attrs: Any) -> Tensor:
        """A generic with no inputs (``iota``, ``full``)."""
        node = self._node("ew", name, shape, dtype, (), fn, fn=fn, maps=[], logical=shape, **attrs)
        return Tensor(self, node, shape)

    def _widened(self, o: Any, shape: Shape) -> Any:
        if not isinstance(o, Tensor) or o.shape == shape:
            return o
        source = self._respaced_source(o, shape, o.name)
        return o if source is None else source

    def _respaced_source(
        self, t: Tensor, shape: Shape, name: str | None, *, reshape: bool = False
    ) -> Tensor | None:
        """``t``, if an ``iota`` or a ``full``, broadcast to ``shape`` (or if ``reshape``,
        reshaped to it by adding or removing 1s) as a new source of that shape, else None.

        The values are the same; computed in the iteration space of the op that reads them,
        they fuse into it (``arange(T)[:, None] <= arange(T)``, ``x + arange(n)``) instead of
        staying a smaller kernel of their own that fusion cannot merge.
        """
        at = t.node.attrs
        if t.node.op != "ew" or at["fn"] not in ("iota", "full") or t.lazy:
            return None
        if at["fn"] == "full":
            return self.full(shape, at["value"], dtype=t.dtype, name=name)
        if t.shape[at["axis"]] == 1:  # one value along the axis: a constant
            return self.full(shape, at["start"], dtype=t.dtype, name=name)
        axis = at["axis"] + len(shape) - t.ndim
        if reshape:
            old = [k for k, d in enumerate(t.shape) if d != 1]
            new = [k for k, d in enumerate(shape) if d != 1]
            if [t.shape[k] for k in old] != [shape[k] for k in new]:
                return None  # a real reshape moves values across axes
            axis = new[old.index(at["axis"])]
        return self.iota(shape, axis, start=at["start"], step=at["step"], dtype=t.dtype, name=name)

    def _compare(self, fn: str, x: Operand, y: Operand, name: str | None) -> Tensor:
        tensors = [self._own(o) for o in (x, y) if isinstance(o, Tensor)]
        src = self._same_dtype(fn, tensors) if tensors else None
        return self._elementwise(fn, (x, y), name, dtype="i8", src=src)

    @staticmethod
    def _broadcast(
        fn: str, tensors: list[Tensor], out_shape: Shape | None
    ) -> tuple[Shape, tuple[int, ...]]:
        """The numpy broadcast shape, and which of its axes stay pending keepdims axes."""
        shapes = [t.shape for t in tensors] + ([out_shape] if out_shape is not None else [])
        try:
            shape = np.broadcast_shapes(*shapes)
        except ValueError:
            listed = " and ".join(str(s) for s in shapes)
            raise OpfuseError(f"{fn}: shapes {listed} cannot be broadcast together") from None
        if out_shape is not None:
            if shape != out_shape:
                raise OpfuseError(f"broadcast_to: cannot broadcast {shapes[0]} to {out_shape}")
            return shape, ()
        lazy = []
        for k in range(len(shape)):
            # an axis stays pending only if every operand that has it has it pending
            have = [(t, k - len(shape) + t.ndim) for t in tensors if k - len(shape) + t.ndim >= 0]
            if shape[k] == 1 and all(a in t.lazy for t, a in have):
                lazy.append(k)
        return shape, tuple(lazy)

    @staticmethod
    def _input_map(t: Tensor, shape: Shape, domain: list[int]) -> list[int | str]:
        """Results of ``t``'s indexing map over ``domain`` (ints are dims, "0" a constant)."""
        lead = len(shape) - t.ndim
        results: list[int | str] = []
        for a, size in enumerate(t.shape):
            if a in t.lazy:
                continue  # the value does not have this axis: broadcast by omission
            k = a + lead
            results.append(domain.index(k) if size == shape[k] else "0")
        return results

    def _reduce(self, kind: str, x: Tensor, axis: Axes, keepdims: bool, name: str | None) -> Tensor:
        x = self._materialize(self._own(x))
        self._float_only(kind, (x,))
        axes = self._axes(x, axis)
        physical = tuple(d for k, d in enumerate(x.shape) if k not in axes)
        # f16/bf16 sums accumulate in f32 (a bf16 accumulator loses the sum after a few
        # hundred terms), then round once; a max is exact in any dtype
        acc = self._accumulator(x) if kind == "sum" else x.dtype
        node = self._node("reduce", name, physical, acc, (x,), kind, kind=kind, axes=axes)
        if not keepdims:
            return self._round_to(Tensor(self, node, physical), x.dtype)
        logical = tuple(1 if k in axes else d for k, d in enumerate(x.shape))
        return self._round_to(Tensor(self, node, logical, axes), x.dtype)

    # ----------------------------------------------------------------- reference evaluation

    def _bind(self, args: tuple, kwargs: dict) -> dict[int, np.ndarray]:
        if args and kwargs:
            raise OpfuseError("reference: pass inputs either by position or by name")
        if args:
            if len(args) != len(self.inputs):
                raise OpfuseError(f"reference: expected {len(self.inputs)} inputs, got {len(args)}")
            kwargs = {t.name: a for t, a in zip(self.inputs, args)}
        missing = [t.name for t in self.inputs if t.name not in kwargs]
        extra = sorted(set(kwargs) - {t.name for t in self.inputs})
        if missing or extra:
            raise OpfuseError(f"reference: missing inputs {missing}, unknown inputs {extra}")
        env = {}
        for t in self.inputs:
            a = np.asarray(kwargs[t.name])
            if a.shape != t.shape:
                raise OpfuseError(
                    f"reference: input {t.name!r} has shape {a.shape}, expected {t.shape}"
                )
            env[id(t.node)] = round_to_dtype(a, t.dtype)
        return env

    def _live_nodes(self) -> list[_Node]:
        """Non-input nodes that reach an output, in creation order."""
        live: set[int] = set()
        stack = [t.node for t in self.outputs]
        while stack:
            n = stack.pop()
            if id(n) not in live:
                live.add(id(n))
                stack.extend(a.node for a in n.args if isinstance(a, Tensor))
        return [n for n in self._nodes if id(n) in live]

    @staticmethod
    def _eval(node: _Node, env: dict[int, np.ndarray]) -> np.ndarray:
        op, at = node.op, node.attrs
        vals = [
            (
                env[id(a.node)].reshape(a.shape)
                if isinstance(a, Tensor)
                else round_to_dtype(a, at.get("src", node.dtype))
            )
            for a in node.args
        ]
        with np.errstate(all="ignore"):
            if op == "ew" and at["fn"] == "iota":
                axis, n = at["axis"], node.shape[at["axis"]]
                along = at["start"] + at["step"] * np.arange(n, dtype=np.float64)
                return np.broadcast_to(
                    along.reshape([-1 if k == axis else 1 for k in range(len(node.shape))]),
                    node.shape,
                )
            if op == "ew" and at["fn"] == "full":
                return np.full(node.shape, float(at["value"]))
            if op == "ew":
                if at["fn"] == "pow":
                    out = np.power(vals[0], at["exponent"])
                else:
                    out = _NUMPY[at["fn"]](*vals)
                return np.broadcast_to(out, at["logical"]).reshape(node.shape)
            if op == "reduce":
                return (np.sum if at["kind"] == "sum" else np.max)(vals[0], axis=at["axes"])
            if op in ("matmul", "batch_matmul"):
                return np.matmul(vals[0], vals[1])
            if op == "transpose":
                return np.transpose(vals[0], at["perm"])
            if op == "broadcast":
                return np.broadcast_to(vals[0], node.shape)
            if op == "concat":
                return np.concatenate(vals, axis=at["axis"])
            return vals[0].reshape(node.shape)  # collapse, expand, reshape
