"""The builder graph the torch importer builds on: :class:`TorchGraph`, ``Graph`` plus
``slice`` (``tensor.extract_slice``), the one op the ATen rules need that the builder lacks.

A stopgap (the class docstring says why and how it goes away); the rules that slice are in
``aten_views``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...errors import OpfuseError
from ..builder import printer as _printer
from ..builder.graph import Graph, Tensor


class TorchGraph(Graph):
    """The builder graph plus ``slice`` (``tensor.extract_slice``), which the builder lacks.

    Stopgap: ``nn.MultiheadAttention`` selects Q, K and V out of one packed projection
    (``aten.select``), and ``split``/``chunk`` need slices too. Move ``slice`` into
    ``Graph`` (printer and reference) and this class goes away.
    """

    def slice(
        self,
        x: Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        strides: Sequence[int] | None = None,
        *,
        drop: Sequence[int] = (),
        name: str | None = None,
    ) -> Tensor:
        """``x[offsets : offsets + sizes*strides : strides]`` per dim; ``drop`` removes dims
        of size 1 from the result (a rank-reducing ``tensor.extract_slice``)."""
        x = self._materialize(self._own(x))
        strides = list(strides or [1] * x.ndim)
        offsets, sizes = [int(o) for o in offsets], [int(s) for s in sizes]
        for k in range(x.ndim):
            last = offsets[k] + (sizes[k] - 1) * strides[k]
            if not (0 <= offsets[k] and sizes[k] >= 1 and strides[k] >= 1 and last < x.shape[k]):
                raise OpfuseError(f"slice: dim {k} out of range for shape {x.shape}")
        if any(sizes[k] != 1 for k in drop):
            raise OpfuseError(f"slice: only size-1 dims can be dropped, got {list(drop)}")
        shape = tuple(s for k, s in enumerate(sizes) if k not in drop)
        node = self._node(
            "slice", name, shape, x.dtype, (x,), offsets=offsets, sizes=sizes, strides=strides
        )
        return Tensor(self, node, shape)

    def to_mlir(self, comment: str | None = None) -> str:
        if not self.outputs:
            raise OpfuseError(f"graph {self.name!r} has no outputs")
        return _TorchPrinter(self).module(comment or self.doc)

    @staticmethod
    def _eval(node: Any, env: dict[int, np.ndarray]) -> np.ndarray:
        if node.op != "slice":
            return Graph._eval(node, env)
        (x,) = node.args
        at = node.attrs
        index = tuple(
            slice(o, o + (s - 1) * st + 1, st)
            for o, s, st in zip(at["offsets"], at["sizes"], at["strides"])
        )
        return env[id(x.node)].reshape(x.shape)[index].reshape(node.shape)


class _TorchPrinter(_printer.Printer):
    def _slice(self, node: Any) -> str:
        (x,) = node.args
        at = node.attrs
        out = _printer._tensor_type(node.shape, node.dtype)
        return self.emit(
            f"tensor.extract_slice {self.val(x)}{at['offsets']}{at['sizes']}{at['strides']} : "
            f"{_printer._ty(x)} to {out}",
            node,
        )
