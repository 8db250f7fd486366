"""Gathers of the builder ``Graph``: ``take`` (the one primitive), and ``embedding``,
``gather``, ``index`` and ``index_select`` written with it; and their transpose,
``scatter_add`` (an embedding's gradient).

A gather is one ``linalg.generic`` over its result's shape, all iterators parallel: its
``ins`` are the integer index tensors (numpy broadcasting in their input maps, like an
elementwise op), and the body reads the source with ``tensor.extract`` at coordinates that
are either a loop index (``linalg.index``) or an index tensor's value. It fuses like an
elementwise op with the index computations before it and the elementwise ops after it (an
embedding lookup, the position add and the LayerNorm after it are one kernel); the
source's producer never joins its kernel (it must be complete first:
``Planner.gather_via``).

Bounds are defined: an index ``i`` into a dim of size ``n`` reads ``i + n`` when negative
(python's and torch's wrap-around), then is clamped to ``[0, n - 1]``: an out-of-range index
reads the nearest edge element, never outside the buffer (torch raises instead).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...errors import OpfuseError
from .generics import ElementwiseGenerics
from .tensor import Shape, Tensor

#: dtypes an index tensor may have.
INDEX_DTYPES = ("i64", "i32")


class GatherOps(ElementwiseGenerics):
    """Ops that read a source tensor at computed positions."""

    def take(
        self,
        x: Tensor,
        coords: Sequence[int | Tensor],
        shape: Sequence[int],
        *,
        name: str | None = None,
        default: str = "take",
    ) -> Tensor:
        """The tensor of ``shape`` whose element at ``p`` is ``x[c_0(p), ..., c_k(p)]``.

        Args:
            x: The source.
            coords: One entry per dim of ``x``: an int ``k`` (the coordinate is ``p[k]``,
                a dim of the result), or an integer tensor broadcastable to ``shape`` (the
                coordinate is its value at ``p``, wrapped if negative and clamped to the
                dim: see the module docstring), or ``(tensor, dims)``: the tensor's dims
                run along the result's ``dims`` (broadcast along the others).
            shape: The result's shape.
            name: Location name.
            default: The name's stem when ``name`` is None.
        """
        x = self._materialize(self._own(x))
        shape = self._check_shape(shape, "take")
        if len(coords) != x.ndim:
            raise OpfuseError(f"take: {len(coords)} coordinates for a {x.ndim}-D source")
        spec: list[int | tuple[str, int, tuple[int, ...]]] = []
        tensors: list[Tensor] = []
        maps: list[list[int | str]] = []
        for d, c in enumerate(coords):
            if isinstance(c, (Tensor, tuple)):
                t, dims = self._index_operand(c, shape)
                spec.append(("arg", len(tensors), dims))
                tensors.append(t)
                maps.append([dims[a] if t.shape[a] == shape[dims[a]] else "0"
                             for a in range(t.ndim)])
            elif isinstance(c, int) and not isinstance(c, bool) and 0 <= c < len(shape):
                if shape[c] > x.shape[d]:
                    raise OpfuseError(f"take: result dim {c} ({shape[c]}) exceeds source dim {d}")
                spec.append(c)
            else:
                raise OpfuseError(f"take: coordinate {c!r} is neither a tensor nor a dim of {shape}")
        node = self._node(
            "take", name, shape, x.dtype, (x, *tensors), default, coords=spec, maps=maps
        )
        return Tensor(self, node, shape)

    def _index_operand(
        self, c: Tensor | tuple[Tensor, Sequence[int]], shape: Shape
    ) -> tuple[Tensor, tuple[int, ...]]:
        """An index tensor and the result dims its dims run along (numpy's right-aligned
        broadcasting unless given: ``(ids, (0, 1))``); an ``iota``/``full`` is rebuilt in
        the result's shape, so it fuses into the gather."""
        t, dims = c if isinstance(c, tuple) else (c, None)
        t = self._materialize(self._own(t))
        if t.dtype not in INDEX_DTYPES:
            raise OpfuseError(f"take: index tensors are integers, got {t.dtype}")
        dims = tuple(range(len(shape) - t.ndim, len(shape))) if dims is None else tuple(dims)
        fits = (
            len(dims) == t.ndim
            and list(dims) == sorted(set(dims))
            and all(0 <= k < len(shape) for k in dims)
            and all(t.shape[a] in (1, shape[k]) for a, k in enumerate(dims))
        )
        if not fits:
            raise OpfuseError(f"take: index shape {t.shape} along dims {dims} does not fit {shape}")
        aligned = [1] * len(shape)
        for a, k in enumerate(dims):
            aligned[k] = t.shape[a]
        source = self._respaced_source(t, tuple(aligned), None, reshape=True)
        if source is not None:
            return self._widened(source, shape), tuple(range(len(shape)))
        return t, dims

    def embedding(self, weight: Tensor, indices: Tensor, *, name: str | None = None) -> Tensor:
        """Rows of ``weight`` (V, D) at ``indices`` (any shape): shape ``(*indices, D)``."""
        weight, indices = self._own(weight), self._own(indices)
        if weight.ndim != 2:
            raise OpfuseError(f"embedding: the weight is 2-D (rows, dim), got {weight.shape}")
        shape = (*indices.shape, weight.shape[1])
        rows = (indices, tuple(range(indices.ndim)))  # one id per row of the result
        return self.take(weight, [rows, len(shape) - 1], shape, name=name, default="embedding")

    def scatter_add(self, updates: Tensor, indices: Tensor, rows: int, *, skip: int | None = None,
                    name: str | None = None) -> Tensor:
        """Rows summed by an index (``np.add.at``, torch's ``embedding_dense_backward``): the
        ``(rows, *updates.shape[indices.ndim:])`` tensor whose row ``v`` is the sum of
        ``updates[t]`` over the positions ``t`` of ``indices`` that hold ``v`` (and not
        ``skip``, an embedding's ``padding_idx``), in position order; an index outside
        ``[0, rows)`` adds nothing. f16/bf16 updates are summed in f32, then rounded.

        One ``linalg.generic``: loop ``v`` over the rows (read by no input), the update's
        trailing dims, and reduction loops over ``indices``; the payload adds the update
        where ``indices[t] == v`` (``opfuse.analysis.scatter`` recognizes it: a ``scatter``
        kernel visits each update once)."""
        updates, indices = self._own(updates), self._own(indices)
        if indices.dtype not in INDEX_DTYPES:
            raise OpfuseError(f"scatter_add: indices are integers, got {indices.dtype}")
        self._float_only("scatter_add", (updates,))
        k = indices.ndim
        if tuple(updates.shape[:k]) != tuple(indices.shape):
            raise OpfuseError(f"scatter_add: updates {updates.shape} do not start with the "
                              f"indices' shape {indices.shape}")
        if rows < 1:
            raise OpfuseError(f"scatter_add: {rows} rows")
        updates, indices = self._materialize(updates), self._materialize(indices)
        shape = (rows, *updates.shape[k:])
        node = self._node("scatter_add", name, shape, self._accumulator(updates),
                          (updates, indices), skip=skip)
        return self._round_to(Tensor(self, node, shape), updates.dtype)

    def gather(self, x: Tensor, axis: int, index: Tensor, *, name: str | None = None) -> Tensor:
        """``torch.gather``: ``out[p] = x[p with p[axis] replaced by index[p]]``; the result
        has ``index``'s shape."""
        x, index = self._own(x), self._own(index)
        if index.ndim != x.ndim:
            raise OpfuseError(f"gather: index rank {index.ndim} != source rank {x.ndim}")
        axis = self._axes(x, axis)[0]
        coords: list[int | Tensor] = [index if d == axis else d for d in range(x.ndim)]
        return self.take(x, coords, index.shape, name=name, default="gather")

    def index_select(
        self, x: Tensor, axis: int, index: Tensor, *, name: str | None = None
    ) -> Tensor:
        """``torch.index_select``: the slices of ``x`` along ``axis`` at the 1-D ``index``."""
        x, index = self._own(x), self._own(index)
        if index.ndim != 1:
            raise OpfuseError(f"index_select: the index is 1-D, got {index.shape}")
        axis = self._axes(x, axis)[0]
        shape = (*x.shape[:axis], index.shape[0], *x.shape[axis + 1 :])
        coords: list = [(index, (axis,)) if d == axis else d for d in range(x.ndim)]
        return self.take(x, coords, shape, name=name, default="index_select")

    def index(
        self, x: Tensor, indices: Sequence[Tensor | None], *, name: str | None = None
    ) -> Tensor:
        """Advanced indexing ``x[i_0, ..., i_k]`` (``aten.index.Tensor``): integer index
        tensors, None for a whole dim; the index tensors broadcast together and, when they
        are adjacent, their shape replaces their dims (numpy's rule; apart: in front)."""
        x = self._own(x)
        indices = list(indices) + [None] * (x.ndim - len(indices))
        if len(indices) != x.ndim:
            raise OpfuseError(f"index: {len(indices)} indices for a {x.ndim}-D tensor")
        at = [d for d, i in enumerate(indices) if i is not None]
        if not at:
            return x
        tensors = [self._own(indices[d]) for d in at]
        try:
            batch: Shape = tuple(np.broadcast_shapes(*(t.shape for t in tensors)))
        except ValueError:
            raise OpfuseError("index: index shapes do not broadcast together") from None
        adjacent = at == list(range(at[0], at[-1] + 1))
        before = list(range(at[0])) if adjacent else []
        after = [d for d in range(x.ndim) if indices[d] is None and d not in before]
        shape = (*(x.shape[d] for d in before), *batch, *(x.shape[d] for d in after))
        lead = len(before)
        coords: list[int | Tensor] = []
        for d in range(x.ndim):
            if indices[d] is None:
                coords.append(before.index(d) if d in before else lead + len(batch) + after.index(d))
            else:
                t = self._own(indices[d])
                coords.append((t, tuple(range(lead + len(batch) - t.ndim, lead + len(batch)))))
        return self.take(x, coords, shape, name=name, default="index")
