"""Elementwise ops of the builder ``Graph``: arithmetic and float functions, comparisons,
``where``, logical ops and ``cast`` (masks: booleans as i8), and the sources ``iota`` and
``full``. Each is one ``linalg.generic`` (see ``opfuse.frontends.builder.graph`` for the IR).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ...errors import OpfuseError
from .generics import ElementwiseGenerics, _fill_value
from .tensor import DTYPES, Operand, Scalar, Tensor, _check_dtype, _is_int, round_to_dtype


def _comparison(fn: str, symbol: str) -> Callable[..., Tensor]:
    """The ``Graph`` method of one comparison (they differ in their predicate only)."""

    def compare(self: ElementwiseOps, x: Operand, y: Operand, *, name: str | None = None) -> Tensor:
        return self._compare(fn, x, y, name)

    nan = "true" if fn == "ne" else "false"
    compare.__name__ = compare.__qualname__ = fn
    compare.__doc__ = f"``x {symbol} y`` as an i8 boolean, numpy broadcasting ({nan} with NaN)."
    return compare


class ElementwiseOps(ElementwiseGenerics):
    """One-generic ops: math, comparisons and selection, casts, and sources."""

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

    def _compare(self, fn: str, x: Operand, y: Operand, name: str | None) -> Tensor:
        tensors = [self._own(o) for o in (x, y) if isinstance(o, Tensor)]
        src = self._same_dtype(fn, tensors) if tensors else None
        return self._elementwise(fn, (x, y), name, dtype="i8", src=src)
