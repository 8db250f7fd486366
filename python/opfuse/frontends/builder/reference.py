"""The builder ``Graph``'s numpy reference: every op in float64, rounded to its dtype (the
semantics are in ``opfuse.frontends.builder.graph``'s module docstring), independently of the MLIR.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...errors import OpfuseError
from .core import GraphCore
from .tensor import Tensor, _is_int, _Node, numpy_dtype, round_to_dtype


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


def _conv2d(x: np.ndarray, w: np.ndarray, strides, dilations, groups: int) -> np.ndarray:
    """Cross-correlation of an (already padded) NCHW ``x`` with an FCHW ``w`` in float64:
    ``out[n, f, i, j] = sum_{c, p, q} x[n, g·C/G + c, i·s0 + p·d0, j·s1 + q·d1] · w[f, c, p, q]``
    with ``g`` the group of ``f``."""
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    (s0, s1), (d0, d1) = strides, dilations
    oh = (h - d0 * (kh - 1) - 1) // s0 + 1
    ow = (wd - d1 * (kw - 1) - 1) // s1 + 1
    fg = f // groups
    out = np.zeros((n, f, oh, ow))
    for p in range(kh):
        for q in range(kw):
            rows = x[:, :, p * d0 : p * d0 + s0 * (oh - 1) + 1 : s0, q * d1 : q * d1 + s1 * (ow - 1) + 1 : s1]
            for g in range(groups):
                patch = rows[:, g * cg : (g + 1) * cg]
                out[:, g * fg : (g + 1) * fg] += np.einsum("ncij,fc->nfij", patch, w[g * fg : (g + 1) * fg, :, p, q])
    return out


def _take(node: _Node, vals: list[np.ndarray]) -> np.ndarray:
    """A gather: the source at one coordinate array per dim (``builder_gather``)."""
    source, shape = vals[0], node.shape
    grids = []
    for d, c in enumerate(node.attrs["coords"]):
        n = source.shape[d]
        if isinstance(c, int):
            g = np.arange(shape[c]).reshape([-1 if k == c else 1 for k in range(len(shape))])
        else:
            aligned = [1] * len(shape)
            for a, k in enumerate(c[2]):
                aligned[k] = node.args[1 + c[1]].shape[a]
            g = vals[1 + c[1]].astype(np.int64).reshape(aligned)
            g = np.clip(np.where(g < 0, g + n, g), 0, n - 1)
        grids.append(np.broadcast_to(g, shape))
    return source[tuple(grids)]


class ReferenceEvaluation(GraphCore):
    """``reference`` and ``random_inputs``: the graph run in numpy."""

    def reference(self, *args: np.ndarray, **kwargs: np.ndarray) -> list[np.ndarray]:
        """Evaluate the graph with numpy, independently of the MLIR.

        Each op is computed in float64 and rounded to its dtype (see ``opfuse.frontends.builder.graph``).

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
            if op == "cumsum":
                return np.cumsum(vals[0], axis=at["axis"])
            if op == "take":
                return _take(node, vals)
            if op == "scatter_add":
                return _scatter_add(node, vals)
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
            if op == "pad":
                widths = list(zip(at["low"], at["high"]))
                return np.pad(vals[0], widths, constant_values=at["value"])
            if op == "conv":
                return _conv2d(vals[0], vals[1], at["strides"], at["dilations"], at["groups"])
            return vals[0].reshape(node.shape)  # collapse, expand, reshape


def _scatter_add(node: _Node, vals: list[np.ndarray]) -> np.ndarray:
    """``np.add.at`` of the updates into the rows their indices pick (in position order),
    indices outside the rows and ``skip`` adding nothing."""
    updates, ids = vals[0], vals[1].astype(np.int64)
    rows = node.shape[0]
    keep = (ids >= 0) & (ids < rows)
    if node.attrs["skip"] is not None:
        keep &= ids != node.attrs["skip"]
    out = np.zeros(node.shape, dtype=np.float64)
    np.add.at(out, ids[keep], updates[keep].astype(np.float64))
    return out
