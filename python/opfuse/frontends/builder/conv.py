"""Padding and convolution of the builder ``Graph``: ``pad`` and ``conv2d`` (NCHW input, FCHW
filter), in the forms torch-mlir prints for ``torch.nn.Conv2d`` (see
``opfuse.frontends.builder.graph`` for the IR conventions).

* ``pad``: one ``tensor.pad`` whose region yields a constant.
* ``conv2d``: the input padded by one ``pad`` op when ``padding`` is not 0, then
  ``linalg.conv_2d_nchw_fchw`` (``groups=1``), ``linalg.depthwise_conv_2d_nchw_chw``
  (``groups`` = input channels = output channels; the filter collapsed to CxKHxKW) or
  ``linalg.conv_2d_ngchw_gfchw`` (other groups; input, filter and init expanded to their
  grouped shapes and the result collapsed back), with ``strides``/``dilations`` attributes,
  on a ``linalg.fill`` 0 init (f32 for f16/bf16 operands, then a ``round`` op, like
  matmul). A bias is a separate elementwise add of the channel vector, so fusing it into
  the convolution's kernel is the epilogue pass's job.
"""

from __future__ import annotations

from typing import Sequence

from ...errors import OpfuseError
from .generics import ElementwiseGenerics
from .tensor import _HALF, Scalar, Shape, Tensor


def _pair(value: int | Sequence[int], what: str, minimum: int) -> tuple[int, int]:
    """``value`` as (height, width): an int for both, or a pair."""
    items = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        pair = tuple(int(v) for v in items)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise OpfuseError(f"conv2d: {what} must be an int or a pair of ints, got {value!r}") from None
    if len(pair) != 2 or any(isinstance(v, bool) or v < minimum for v in items):  # type: ignore[union-attr]
        raise OpfuseError(f"conv2d: {what} must be an int or a pair of ints >= {minimum}, got {value!r}")
    return pair  # type: ignore[return-value]


class ConvolutionOps(ElementwiseGenerics):
    """``pad`` and ``conv2d``; ``conv2d``'s bias needs the ``Graph``'s ``add``."""

    def pad(
        self,
        x: Tensor,
        pads: Sequence[tuple[int, int]],
        value: Scalar = 0.0,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Pad ``x`` with ``value`` like ``np.pad(x, pads, constant_values=value)``.

        Args:
            x: A float tensor.
            pads: One ``(before, after)`` pair of non-negative ints per dim of ``x``.
            value: The padding value (a python number).
            name: Location name.
        """
        x = self._materialize(self._own(x))
        self._float_only("pad", (x,))
        self._check_scalar("pad", value, x.dtype, "padding value")
        try:
            pairs = [(int(lo), int(hi)) for lo, hi in pads]
        except (TypeError, ValueError):
            raise OpfuseError(f"pad: pads must be (before, after) pairs of ints, got {pads!r}") from None
        if len(pairs) != x.ndim or any(lo < 0 or hi < 0 for lo, hi in pairs):
            raise OpfuseError(
                f"pad: expected {x.ndim} non-negative (before, after) pairs for shape {x.shape}, "
                f"got {pads!r}"
            )
        if all(lo == hi == 0 for lo, hi in pairs):
            return x
        shape = tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pairs))
        node = self._node("pad", name, shape, x.dtype, (x,), low=[lo for lo, _ in pairs],
                          high=[hi for _, hi in pairs], value=float(value))
        return Tensor(self, node, shape)

    def conv2d(
        self,
        x: Tensor,
        w: Tensor,
        bias: Tensor | None = None,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> Tensor:
        """2-D convolution (cross-correlation, like ``torch.nn.functional.conv2d``).

        Args:
            x: Input, ``N x C x H x W``.
            w: Filter, ``F x C/groups x KH x KW``.
            bias: Optional ``F`` vector added to every output channel.
            stride, padding, dilation: An int for both spatial dims, or a (height, width)
                pair; the padding is zeros on both sides.
            groups: Input and output channels are split into this many groups.
            name: Scope name: the padding is ``<name>.pad``, the convolution ``<name>``
                (``<name>.conv`` when there is a bias, which is ``<name>.bias``).
            The bias is read as the channel vector itself (input map ``(d0, d1, d2, d3)
            -> (d1)``), not reshaped.

        Returns:
            ``N x F x OH x OW`` with ``OH = (H + 2·pad - dil·(KH - 1) - 1) // stride + 1``.
        """
        x, w = (self._materialize(self._own(t)) for t in (x, w))
        self._same_dtype("conv2d", (x, w))
        self._float_only("conv2d", (x,))
        if x.ndim != 4 or w.ndim != 4:
            raise OpfuseError(f"conv2d: expected a 4-D input and filter, got {x.shape} and {w.shape}")
        s, p, d = (_pair(v, what, m) for v, what, m in
                   ((stride, "stride", 1), (padding, "padding", 0), (dilation, "dilation", 1)))
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise OpfuseError(f"conv2d: groups must be a positive int, got {groups!r}")
        n, c, h, wd = x.shape
        f, cg, kh, kw = w.shape
        if c % groups or f % groups or cg != c // groups:
            raise OpfuseError(
                f"conv2d: input {x.shape} and filter {w.shape} do not fit groups={groups} "
                f"(the filter's dim 1 must be C/groups, C and F multiples of groups)"
            )
        oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
        ow = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
        if oh < 1 or ow < 1:
            raise OpfuseError(f"conv2d: the filter {w.shape} does not fit the padded input {x.shape}")
        if bias is not None:
            bias = self._own(bias)
            self._same_dtype("conv2d", (x, bias))
            if bias.shape != (f,):
                raise OpfuseError(f"conv2d: bias must have shape ({f},), got {bias.shape}")
        shape: Shape = (n, f, oh, ow)
        full = self._unique(self._scoped(name, "conv"))
        with self._scope(full):
            if p != (0, 0):
                x = self.pad(x, [(0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])], name=f"{full}.pad")
            form = "nchw" if groups == 1 else "depthwise" if groups == c == f else "grouped"
            acc = "f32" if x.dtype in _HALF else x.dtype
            exact = full if bias is None else f"{full}.conv"
            node = self._node("conv", None, shape, acc, (x, w), exact=self._unique(exact),
                              strides=list(s), dilations=list(d), groups=groups, form=form)
            out = Tensor(self, node, shape)
            if acc != x.dtype:
                out = self._elementwise("cast", (out,), None, default="round", dtype=x.dtype, src=acc)
            if bias is not None:
                # the channel vector seen as 1 x F x 1 x 1 without a reshape: its map is (d1)
                channel = Tensor(self, self._materialize(bias).node, (1, f, 1, 1), (0, 2, 3))
                out = self._elementwise("add", (out, channel), f"{full}.bias")
        return out
