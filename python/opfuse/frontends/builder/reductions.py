"""Reductions and matmul of the builder ``Graph``: ``sum``, ``max``, ``mean``, ``matmul``, and
the f32 accumulation of f16/bf16 operands they share (see ``opfuse.frontends.builder.graph``).
"""

from __future__ import annotations

import math

from ...errors import OpfuseError
from .generics import ElementwiseGenerics
from .tensor import _HALF, Axes, Tensor


class ReductionOps(ElementwiseGenerics):
    """Ops that accumulate: reductions over axes and matrix products.

    ``matmul`` of 4-D operands reshapes them, so the ``Graph`` must have ``reshape`` too.
    """

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

    def cumsum(self, x: Tensor, axis: int, *, name: str | None = None) -> Tensor:
        """Running sum along ``axis`` (``torch.cumsum``), in ``x``'s dtype (f16/bf16
        accumulate in f32, then round; integers wrap like torch's).

        One ``linalg.generic`` with a reduction loop ``r`` along the axis added to the
        result's loops: the point ``j`` sums ``x[r]`` for ``r <= j`` (``O(n²)`` per row:
        meant for the short rows models scan, position ids from an attention mask).
        """
        x = self._materialize(self._own(x))
        if x.dtype == "i8":
            raise OpfuseError("cumsum: of booleans (cast them to an integer first)")
        axis = self._axes(x, axis)[0]
        node = self._node("cumsum", name, x.shape, self._accumulator(x), (x,), axis=axis)
        return self._round_to(Tensor(self, node, x.shape), x.dtype)

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
