"""Data movement ops of the builder ``Graph``: ``broadcast_to``, ``transpose``, ``reshape`` and
``concat`` (see ``opfuse.frontends.builder.graph`` for the ops each becomes).
"""

from __future__ import annotations

import math
from typing import Sequence

from ...errors import OpfuseError
from .core import _reassociation
from .generics import ElementwiseGenerics
from .tensor import Shape, Tensor


class DataMovementOps(ElementwiseGenerics):
    """Ops that move values without computing new ones."""

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

    def expand_dims(self, x: Tensor, axes: Sequence[int], *, name: str | None = None) -> Tensor:
        """``x`` with size-1 axes inserted at ``axes`` (positions in the result), pending
        like a ``keepdims=True`` result: an elementwise consumer broadcasts along them by
        its input map (a per-channel vector ``(C,)`` as ``(C, 1, 1)`` is read as ``(d1)``
        by an NCHW op, no reshape kernel); any other consumer materializes them."""
        x = self._materialize(self._own(x))
        rank = x.ndim + len(axes)
        at = sorted({int(a) % rank for a in axes})
        if len(at) != len(axes):
            raise OpfuseError(f"expand_dims: repeated axes {list(axes)}")
        shape = list(x.shape)
        for a in at:
            shape.insert(a, 1)
        del name  # nothing is built until a consumer materializes it
        return Tensor(self, x.node, tuple(shape), tuple(at))

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
