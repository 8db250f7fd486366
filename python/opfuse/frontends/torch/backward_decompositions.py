"""Decompositions of the ops a training step's graphs hold, spelled in ops opfuse imports.

Core ATen's own decompositions of these use ops that scatter (``scatter``,
``index_put`` with ``accumulate=True``) or count booleans as integers, which the importer
has no rule for, so a loss or an embedding's gradient would leave its partition eager.
These say the same in comparisons, ``where``, float sums and a matmul:

* ``nll_loss_forward`` (cross-entropy's second half): core ATen's, except that the count
  of targets not ignored is summed as floats (``(target != ignore).to(dtype).sum()``, the
  same value up to 2**24 targets) instead of as an int64 cast afterwards.
* ``nll_loss_backward``: the one-hot ``scatter`` of -1 at each row's target becomes a
  comparison of the class index (``arange``) with the target.
* ``embedding_dense_backward``: kept whole (``NotImplemented``), so the importer makes it
  the builder's ``scatter_add`` (the gradient of row ``v`` of the table is the sum of the
  output gradients of the tokens whose id is ``v``), one ``scatter`` kernel that visits each
  gradient once. ``scale_grad_by_freq`` (and integer gradients) keep core ATen's
  decomposition, whose ``index_put`` runs eagerly in PyTorch.

* ``max_pool2d_with_indices_backward``: per window offset, the windows' gradients where
  that offset holds the argmax, spread back to the input with zeros for the stride
  (``max_pool2d_with_indices`` itself gets the argmax from the importer).
* ``convolution_backward`` (2-D, ``groups == 1``): the input and weight gradients as
  convolutions (``convolution_backward``'s docstring), the bias gradient as a sum.

Each falls back to core ATen's decomposition (or, where core ATen has none, leaves the op
whole: ``NotImplemented``) where its case is not covered.
"""

from __future__ import annotations

from typing import Any

from .aten_conv import _pair

_MEAN, _SUM = 1, 2  # torch's Reduction enum: none 0, mean 1, sum 2


def _core(op: Any) -> Any:
    from torch._decomp import decomposition_table

    return decomposition_table[op]


def nll_loss_forward(self: Any, target: Any, weight: Any, reduction: int,
                     ignore_index: int) -> tuple[Any, Any]:
    import torch

    if weight is not None or self.dim() != 2:
        return _core(torch.ops.aten.nll_loss_forward.default)(
            self, target, weight, reduction, ignore_index)
    kept = target != ignore_index
    safe = torch.where(kept, target, 0)
    result = torch.where(kept, -torch.gather(self, 1, safe.unsqueeze(1)).squeeze(1), 0)
    if reduction not in (_MEAN, _SUM):
        return result, self.new_full((), 0.0)
    total_weight = kept.to(self.dtype).sum()
    result = result.sum()
    return (result / total_weight if reduction == _MEAN else result), total_weight


def nll_loss_backward(grad_output: Any, self: Any, target: Any, weight: Any, reduction: int,
                      ignore_index: int, total_weight: Any) -> Any:
    import torch

    if self.dim() != 2:
        return _core(torch.ops.aten.nll_loss_backward.default)(
            grad_output, self, target, weight, reduction, ignore_index, total_weight)
    if reduction == _MEAN:
        grad_output = grad_output / total_weight
    target = target.unsqueeze(1)
    kept = target != ignore_index
    classes = torch.arange(self.shape[1], device=self.device).unsqueeze(0)
    hit = (classes == torch.where(kept, target, 0)) & kept
    if grad_output.dim() > 0:
        grad_output = grad_output.unsqueeze(1)
    scale = -grad_output if weight is None else -grad_output * weight.unsqueeze(0)
    return torch.where(hit, scale, torch.zeros((), dtype=self.dtype, device=self.device))


def embedding_dense_backward(grad_output: Any, indices: Any, num_weights: int,
                             padding_idx: int, scale_grad_by_freq: bool) -> Any:
    import torch

    if scale_grad_by_freq or \
            grad_output.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return _core(torch.ops.aten.embedding_dense_backward.default)(
            grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    return NotImplemented  # whole, to the importer: the builder's scatter_add


def _zero_insert(t: Any, stride: list[int]) -> Any:
    """``t`` (N, C, H, W) with ``stride - 1`` zeros between neighbours along H and W:
    (N, C, (H-1)·s + 1, (W-1)·s + 1), in views and pads (no scatter)."""
    import torch.nn.functional as F

    n, c, h, w = t.shape
    if stride == [1, 1]:
        return t
    t = F.pad(t.reshape(n, c, h, 1, w, 1), (0, stride[1] - 1, 0, 0, 0, stride[0] - 1))
    t = t.reshape(n, c, h * stride[0], w * stride[1])
    return t[:, :, : (h - 1) * stride[0] + 1, : (w - 1) * stride[1] + 1]


def max_pool2d_with_indices_backward(grad_output: Any, self: Any, kernel_size: Any,
                                     stride: Any, padding: Any, dilation: Any,
                                     ceil_mode: bool, indices: Any) -> Any:
    """The gradient of each input point: the sum over the windows that hold it of the
    window's gradient where its argmax (``indices``) is that point. One term per window
    offset: the windows' gradients where the offset is the argmax, spread to the offset's
    input points (zeros between them for the stride, shifted by the offset)."""
    import torch
    import torch.nn.functional as F

    if ceil_mode or self.dim() != 4:
        return NotImplemented
    k = _pair(kernel_size, 2)
    s = _pair(stride, 2) if stride else k
    p, d = _pair(padding, 2), _pair(dilation, 2)
    height, width = self.shape[2:]
    out_h, out_w = grad_output.shape[2:]
    rows = torch.arange(out_h, device=self.device).view(out_h, 1) * s[0]
    cols = torch.arange(out_w, device=self.device).view(1, out_w) * s[1]
    total = None
    zero = torch.zeros((), dtype=grad_output.dtype, device=self.device)
    for a in range(k[0]):
        for b in range(k[1]):
            r, c = rows + (a * d[0] - p[0]), cols + (b * d[1] - p[1])
            valid = (r >= 0) & (r < height) & (c >= 0) & (c < width)
            hit = (indices == r * width + c) & valid
            spread = _zero_insert(torch.where(hit, grad_output, zero), s)
            up_h, up_w = spread.shape[2:]
            placed = F.pad(spread, (b * d[1], width + 2 * p[1] - b * d[1] - up_w,
                                    a * d[0], height + 2 * p[0] - a * d[0] - up_h))
            total = placed if total is None else total + placed
    return total[:, :, p[0]: p[0] + height, p[1]: p[1] + width]


def convolution_backward(grad_output: Any, input: Any, weight: Any, bias_sizes: Any,
                         stride: Any, padding: Any, dilation: Any, transposed: bool,
                         output_padding: Any, groups: int, output_mask: Any) -> tuple:
    """A 2-D convolution's gradients as convolutions (``groups == 1``, not transposed):

    * input: the output gradient with zeros inserted for the stride, padded by
      ``d·(k-1) - p`` before (cropped where negative) and to the input's size after,
      convolved with the filter flipped in space and with its channel dims swapped;
    * weight: the input and the output gradient with their batch and channel dims
      swapped, convolved with the forward's dilation as the stride and its stride as the
      dilation, cropped to the filter's size;
    * bias: the output gradient summed over batch and space.
    """
    import torch
    import torch.nn.functional as F

    if transposed or groups != 1 or input.dim() != 4:
        return NotImplemented
    s, p, d = (_pair(v, 2) for v in (stride, padding, dilation))
    k = list(weight.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        spread = _zero_insert(grad_output, s)
        flip = [torch.arange(n - 1, -1, -1, device=weight.device) for n in k]
        w = weight.index_select(2, flip[0]).index_select(3, flip[1]).transpose(0, 1)
        # before: d·(k-1) - p; after: as much more as the input rows the last window
        # did not reach (the forward's floor division), so the result has the input's size
        before = [d[i] * (k[i] - 1) - p[i] for i in range(2)]
        after = [input.shape[2 + i] - spread.shape[2 + i] + d[i] * (k[i] - 1) - before[i]
                 for i in range(2)]
        grad_input = F.conv2d(F.pad(spread, (before[1], after[1], before[0], after[0])), w,
                              dilation=d)
    if output_mask[1]:
        gw = F.conv2d(input.transpose(0, 1), grad_output.transpose(0, 1), stride=d,
                      padding=p, dilation=s)
        grad_weight = gw[:, :, : k[0], : k[1]].transpose(0, 1)
    if output_mask[2]:
        grad_bias = grad_output.sum((0, 2, 3))
    return grad_input, grad_weight, grad_bias


def table() -> dict[Any, Any]:
    """The ops above and their decompositions."""
    import torch

    aten = torch.ops.aten
    return {
        aten.nll_loss_forward.default: nll_loss_forward,
        aten.nll_loss_backward.default: nll_loss_backward,
        aten.embedding_dense_backward.default: embedding_dense_backward,
        aten.max_pool2d_with_indices_backward.default: max_pool2d_with_indices_backward,
        aten.convolution_backward.default: convolution_backward,
    }
