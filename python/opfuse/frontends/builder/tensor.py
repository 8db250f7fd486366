"""The builder's values: :class:`Tensor` handles, the :class:`_Node` behind each, and dtypes.

``round_to_dtype`` is the reference's storage rounding (see ``opfuse.frontends.builder.graph`` for
the reference semantics and the IR conventions every op follows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...errors import OpfuseError

if TYPE_CHECKING:
    from .graph import Graph

Shape = tuple[int, ...]
Scalar = float | int

DTYPES = ("f32", "f16", "bf16")  # float dtypes: a graph's default, and every op's
INT_DTYPES = ("i64", "i32", "i8")  # integers (iota, index arithmetic), booleans (0 or 1)
_ALL_DTYPES = DTYPES + INT_DTYPES
# Names double as SSA names (%x) and locations: MLIR suffix-id characters only.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.$-]*\Z")

_HALF = ("f16", "bf16")


def round_to_dtype(a: np.ndarray | float, dtype: str) -> np.ndarray:
    """Round values to ``dtype``; returned as float64.

    bf16 is emulated: the float32 bits rounded to nearest even on the upper 16 bits. i64
    truncates toward zero (``arith.fptosi``), i8 booleans are ``a != 0``.
    """
    a = np.asarray(a, dtype=np.float64)
    if dtype in ("i64", "i32"):
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
        "i32": np.int32,
        "i8": np.int8,
    }[_check_dtype(dtype)]


def _check_dtype(dtype: str, allowed: tuple[str, ...] = _ALL_DTYPES) -> str:
    if dtype not in allowed:
        raise OpfuseError(f"unknown dtype {dtype!r}: expected one of {', '.join(allowed)}")
    return dtype


def _is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def _check_name(name: str, what: str = "op name") -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise OpfuseError(f"invalid {what} {name!r}: use letters, digits, '_', '.', '-', '$'")
    return name


@dataclass(eq=False)
class _Node:
    """One op of the graph; its result has the physical ``shape``.

    ``op`` is one of: input, ew (elementwise generic), reduce, matmul, batch_matmul,
    transpose, broadcast, concat, collapse, expand, reshape, pad, conv.
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
            (a pending ``keepdims=True``; see ``opfuse.frontends.builder.graph``).
    """

    graph: Graph
    node: _Node
    shape: Shape
    lazy: tuple[int, ...] = ()
    _materialized: Tensor | None = field(default=None, repr=False)

    @property
    def dtype(self) -> str:
        """The element type: ``f32``, ``f16``, ``bf16``, ``i64``, ``i32`` or ``i8`` (booleans)."""
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
