"""ATen rules for data movement: permutes, views, broadcasts, slices, splits, ``cat``,
``repeat``, ``slice_scatter``, ``constant_pad_nd``.

``slice_scatter`` (a slice's gradient) and ``constant_pad_nd`` are slices and ``concat``s.
Permutes, views, broadcasts and ``cat`` are the builder's ``transpose``, ``reshape``,
``broadcast_to`` and ``concat``; selects, slices and splits are ``TorchGraph.slice``
(``torch_graph``).
``getitem`` picks one result of a multi-result op. How rules are written: ``aten_rule``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..builder.graph import Graph, Tensor
from .aten_rule import Rule, RuleContext, promote, registrar

RULES: dict[str, Rule] = {}
rule = registrar(RULES)


@rule("aten.permute.default")
def _permute(imp: RuleContext, x: Tensor, dims: Sequence[int]) -> Tensor:
    perm = [d % x.ndim for d in dims]
    return x if perm == list(range(x.ndim)) else imp.g.transpose(x, perm, name=imp.name)


@rule("aten.transpose.int")
def _transpose(imp: RuleContext, x: Tensor, dim0: int, dim1: int) -> Tensor:
    perm = list(range(x.ndim))
    perm[dim0 % x.ndim], perm[dim1 % x.ndim] = perm[dim1 % x.ndim], perm[dim0 % x.ndim]
    return _permute(imp, x, perm)


@rule("aten.t.default")
def _t(imp: RuleContext, x: Tensor) -> Tensor:
    return _permute(imp, x, list(range(x.ndim))[::-1])


@rule("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(imp: RuleContext, x: Tensor, size: Sequence[int]) -> Tensor:
    return imp.g.reshape(x, size, name=imp.name)


@rule("aten.unsqueeze.default")
def _unsqueeze(imp: RuleContext, x: Tensor, dim: int) -> Tensor:
    shape = list(x.shape)
    shape.insert(dim % (x.ndim + 1), 1)
    return imp.g.reshape(x, shape, name=imp.name)


@rule("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(imp: RuleContext, x: Tensor, dim: Any = None) -> Tensor:
    dims = range(x.ndim) if dim is None else dim if isinstance(dim, (list, tuple)) else [dim]
    drop = {d % x.ndim for d in dims if x.shape[d % x.ndim] == 1} if x.ndim else set()
    return imp.g.reshape(x, [s for k, s in enumerate(x.shape) if k not in drop], name=imp.name)


@rule("aten.expand.default")
def _expand(imp: RuleContext, x: Tensor, size: Sequence[int], *, implicit: bool = False) -> Tensor:
    lead = len(size) - x.ndim
    shape = [x.shape[k - lead] if s == -1 else s for k, s in enumerate(size)]
    return imp.g.broadcast_to(x, shape, name=imp.name)


@rule("aten.select.int")
def _select(imp: RuleContext, x: Tensor, dim: int, index: int) -> Tensor:
    dim = dim % x.ndim
    offsets = [index % x.shape[dim] if k == dim else 0 for k in range(x.ndim)]
    sizes = [1 if k == dim else s for k, s in enumerate(x.shape)]
    return imp.g.slice(x, offsets, sizes, drop=[dim], name=imp.name)


@rule("aten.slice.Tensor")
def _slice(
    imp: RuleContext, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Tensor:
    dim = dim % x.ndim
    begin, stop, step = slice(start, end, step).indices(x.shape[dim])  # python's clamping
    size = len(range(begin, stop, step))
    if size == x.shape[dim]:
        return x
    if size == 0:
        raise imp.unsupported("an empty slice")
    return _slice_dim(imp.g, x, dim, begin, size, step, imp.name)


def _slice_dim(
    g: Graph, x: Tensor, dim: int, begin: int, size: int, step: int, name: str
) -> Tensor:
    offsets = [begin if k == dim else 0 for k in range(x.ndim)]
    sizes = [size if k == dim else s for k, s in enumerate(x.shape)]
    strides = [step if k == dim else 1 for k in range(x.ndim)]
    return g.slice(x, offsets, sizes, strides, name=name)


@rule("aten.split_with_sizes.default", "aten.split.Tensor")
def _split(imp: RuleContext, x: Tensor, split: Any, dim: int = 0) -> list[Tensor]:
    dim = dim % x.ndim
    if isinstance(split, int):  # split.Tensor: equal chunks, the last one shorter
        split = [min(split, x.shape[dim] - b) for b in range(0, x.shape[dim], split)]
    pieces, begin = [], 0
    for i, size in enumerate(split):
        pieces.append(_slice_dim(imp.g, x, dim, begin, size, 1, f"{imp.name}.{i}"))
        begin += size
    return pieces


@rule("aten.unbind.int")
def _unbind(imp: RuleContext, x: Tensor, dim: int = 0) -> list[Tensor]:
    dim = dim % x.ndim
    sizes = [1 if k == dim else s for k, s in enumerate(x.shape)]
    return [
        imp.g.slice(
            x,
            [i if k == dim else 0 for k in range(x.ndim)],
            sizes,
            drop=[dim],
            name=f"{imp.name}.{i}",
        )
        for i in range(x.shape[dim])
    ]


@rule("aten.cat.default")
def _cat(imp: RuleContext, tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    # torch promotes mixed dtypes (cat of f16 and f32 is f32); its legacy rule skips 1-D
    # empty tensors, which static positive shapes never have
    parts = promote(imp, *tensors)
    return imp.g.concat(parts, dim, name=imp.name)


@rule("getitem")
def _getitem(imp: RuleContext, values: Sequence[Any], index: int) -> Any:
    return values[index]


@rule("aten.repeat.default")
def _repeat(imp: RuleContext, x: Tensor, repeats: Sequence[int]) -> Tensor:
    # tile: view x as (1, s0, 1, s1, ...), broadcast to (r0, s0, r1, s1, ...), fold pairs
    g, n = imp.g, imp.name
    shape = (1,) * (len(repeats) - x.ndim) + x.shape
    spread = [d for s in shape for d in (1, s)]
    tiled = [d for r, s in zip(repeats, shape) for d in (r, s)]
    y = g.broadcast_to(g.reshape(x, spread, name=f"{n}.spread"), tiled, name=f"{n}.tile")
    return g.reshape(y, [r * s for r, s in zip(repeats, shape)], name=n)


@rule("aten.slice_scatter.default")
def _slice_scatter(imp: RuleContext, x: Tensor, src: Tensor, dim: int = 0, start: Any = None,
                   end: Any = None, step: int = 1) -> Tensor:
    """``x`` with ``src`` written over ``x[start:end]`` along ``dim`` (a sliced view's
    gradient): the pieces of ``x`` before and after, and ``src``, concatenated."""
    dim = dim % x.ndim
    begin, stop, step = slice(start, end, step).indices(x.shape[dim])
    if step != 1:
        raise imp.unsupported(f"a strided slice_scatter (step {step})")
    if src.dtype != x.dtype:
        src = imp.g.cast(src, x.dtype)
    pieces = []
    if begin > 0:
        pieces.append(_slice_dim(imp.g, x, dim, 0, begin, 1, f"{imp.name}.before"))
    pieces.append(src)
    if stop < x.shape[dim]:
        pieces.append(_slice_dim(imp.g, x, dim, stop, x.shape[dim] - stop, 1, f"{imp.name}.after"))
    return imp.g.concat(pieces, dim, name=imp.name)


@rule("aten.constant_pad_nd.default")
def _constant_pad_nd(imp: RuleContext, x: Tensor, pad: Sequence[int], value: Any = 0) -> Tensor:
    """``F.pad(x, pad, value=value)``: ``pad`` holds (before, after) pairs from the last
    dim back; a negative amount crops. Floats pad with the builder's ``pad``; other dtypes
    (a label tensor padded with ``ignore_index``) concatenate ``full`` blocks."""
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise imp.unsupported(f"padding {list(pad)} for a {x.ndim}-D tensor")
    pairs = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        pairs[x.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    for dim, (lo, hi) in enumerate(pairs):  # crop first
        if lo < 0 or hi < 0:
            begin, end = max(0, -lo), x.shape[dim] - max(0, -hi)
            x = _slice_dim(imp.g, x, dim, begin, end - begin, 1, f"{imp.name}.crop{dim}")
    pairs = [(max(0, lo), max(0, hi)) for lo, hi in pairs]
    if all(p == (0, 0) for p in pairs):
        return x
    if x.dtype in ("f32", "f16", "bf16"):
        return imp.g.pad(x, pairs, float(value), name=imp.name)
    value = int(value)
    for dim, (lo, hi) in enumerate(pairs):
        parts = []
        for k, amount in (("before", lo), ("after", hi)):
            if amount:
                shape = tuple(amount if d == dim else s for d, s in enumerate(x.shape))
                parts.append((k, imp.g.full(shape, value, dtype=x.dtype,
                                            name=f"{imp.name}.{k}{dim}")))
        if parts:
            before = [t for k, t in parts if k == "before"]
            after = [t for k, t in parts if k == "after"]
            x = imp.g.concat([*before, x, *after], dim, name=f"{imp.name}.{dim}")
    return x
