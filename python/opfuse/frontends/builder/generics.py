"""How an elementwise op becomes one ``linalg.generic``: numpy broadcasting in the input maps,
pending keepdims axes, python scalars and ``full`` tensors as body constants, and sources
(``iota``, ``full``) rebuilt in the shape of the op that reads them.

The conventions are written down in ``opfuse.frontends.builder.graph``'s module docstring.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...errors import OpfuseError
from .core import GraphCore
from .tensor import Scalar, Shape, Tensor, _is_int

# Functions that also take i64 operands (i8 booleans only compare, select and cast).
_INT_FUNCTIONS = {"add", "sub", "mul", "maximum", "minimum", "neg", "relu", "copy"}


def _fill_value(t: Any) -> Scalar | None:
    """The value of a ``full`` tensor, else None."""
    if isinstance(t, Tensor) and t.node.op == "ew" and t.node.attrs["fn"] == "full":
        return t.node.attrs["value"]
    return None


class ElementwiseGenerics(GraphCore):
    """The elementwise-generic machinery the op mixins share (``full``/``iota`` are
    :class:`~opfuse.frontends.builder.elementwise.ElementwiseOps`')."""

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
