"""A small Python graph builder that writes linalg-on-tensors MLIR and evaluates it in numpy.

A :class:`Graph` records operators on :class:`Tensor` handles; :meth:`Graph.to_mlir` prints
one ``func.func`` in the form the fusion passes expect, and :meth:`Graph.reference`
evaluates the same graph with numpy, independently of the MLIR.

IR conventions (the fusion passes rely on them):

* One ``func.func @<name>``: inputs are arguments in :meth:`Graph.input` order, outputs are
  results in :meth:`Graph.output` order. Static shapes only. Every top-level op carries a
  ``NameLoc`` (``loc("gelu.tanh")``, ``loc("add_2")``); ``tensor.empty``/``linalg.fill``/
  ``arith.constant`` created for an op carry that op's name.
* An elementwise op is one ``linalg.generic``, all iterators ``"parallel"``, identity output
  map, ``tensor.empty`` destination. Broadcasting lives in the *input* maps: a missing
  leading dim is dropped (``(d0, d1) -> (d1)``), a size-1 dim reads index 0
  (``(d0, d1) -> (d0, 0)``). Python scalars are ``arith.constant`` ops inside the body.
* A reduction is one ``linalg.generic`` with ``"reduction"`` iterators on the reduced dims,
  the output map drops them, the init is ``linalg.fill`` of 0 (sum) or -inf (max, written
  as the hex bit pattern, e.g. ``0xFF800000 : f32``). f16/bf16 sums accumulate in f32
  (``arith.extf`` in the body, an f32 init) and are rounded by a following elementwise
  ``arith.truncf`` (named ``round``); other reductions stay in the tensor's dtype. ``keepdims=True`` is lazy: the handle keeps the reduced value and its logical
  shape with 1s; an elementwise consumer drops those axes from its input map
  (``(d0, d1) -> (d0)``). Only an output or a non-elementwise consumer materializes the
  1s with ``tensor.expand_shape``. ``mean`` is ``sum`` then an elementwise multiply by 1/N.
* f16/bf16: transcendental ops (exp, log, tanh, erf, sin, cos, sqrt, rsqrt, pow, sigmoid) are
  computed in f32 inside the body (``arith.extf`` -> math op -> ``arith.truncf``);
  arithmetic (add, mul, ...) stays in the tensor's dtype.
* ``matmul``: ``linalg.matmul`` (2-D) or ``linalg.batch_matmul`` (3-D; 4-D collapses the two
  batch dims with ``tensor.collapse_shape`` and expands the result back) on a
  ``linalg.fill`` 0 init (f32 for f16/bf16 operands, then a ``round`` op back to their
  dtype, like the sums). ``transpose``: ``linalg.transpose``. ``broadcast_to``:
  ``linalg.broadcast`` when it only adds leading dims, else a copy ``linalg.generic`` with a
  broadcasting input map. ``reshape``: ``tensor.collapse_shape``/``tensor.expand_shape``
  when it is a pure collapse or expand, else ``tensor.reshape`` with an i64 shape constant.
  ``concat``: one ``tensor.concat`` however many inputs (the fusion analysis sees a data
  movement op; the CPU backend bufferizes it to copies into subviews; a GPU kernel reads
  the one input an index falls in).
* ``pad``: one ``tensor.pad`` yielding a constant. ``conv2d`` (NCHW input, FCHW filter):
  ``pad`` when padding is not 0, then ``linalg.conv_2d_nchw_fchw`` (``groups=1``),
  ``linalg.depthwise_conv_2d_nchw_chw`` (one filter per channel) or
  ``linalg.conv_2d_ngchw_gfchw`` between ``expand_shape``s and a ``collapse_shape`` (other
  groups), the forms torch-mlir prints; a ``linalg.fill`` 0 init (f32 and a ``round`` op
  for f16/bf16) and the bias as an elementwise add reading the channel vector.
* Composite ops (gelu, silu, softmax, layernorm, rms_norm, mean) are chains of the ops
  above, one generic per step, named ``<scope>.<op>`` (``gelu.tanh``): fusing these chains
  is opfuse's job, so the builder never pre-fuses them.
* Integers and booleans (masks are made of them): ``i64`` tensors hold integers (``iota``,
  index arithmetic: add, sub, mul, neg, maximum, minimum, relu), ``i8`` tensors hold
  booleans as 0 or 1. A boolean is never an ``i1`` tensor: a memref of i1 can be neither a
  kernel argument nor a CPU buffer, so ``i1`` lives only inside a body. Comparisons
  (``eq ne lt le gt ge``: ``arith.cmpf`` ordered, ``une`` for ``ne``, or ``arith.cmpi``
  signed) and ``logical_not/and/or`` widen their ``i1`` with ``arith.extui`` to i8;
  ``where`` narrows its condition back with ``arith.cmpi ne, %c, 0`` and picks with
  ``arith.select``. ``cast`` converts between any two dtypes (to i8 means ``!= 0``).
  Reductions, matmul and the float functions (div, exp, ...) take float tensors only.
* Sources: ``iota`` (``start + step * index`` along one axis) and ``full`` are generics
  with no inputs, their body a ``linalg.index`` or a constant, so they fuse into their
  consumers as cheap elementwise producers. A ``full`` that an elementwise op reads where
  it does not set the op's shape is folded into that op's body as a constant
  (``masked_fill``'s ``where(mask, -inf, x)`` is one generic, like a python scalar).

Reference semantics: every op is computed in float64 and its result rounded to the graph
dtype (float32; float16; bf16 emulated as round-to-nearest-even float32 values, returned as
``np.float32``; i64 truncated toward zero; i8 as ``!= 0``), i.e. every intermediate tensor
has the storage precision the IR gives it.
Reductions are exact-then-rounded, so f16/bf16 sums differ from the IR's f32 accumulation
by the f32 rounding error only.

Where it lives: :class:`Graph` (here) joins the op families, one module each:
``builder_tensor`` (``Tensor``, nodes, dtypes, ``round_to_dtype``), ``builder_core``
(construction, inputs/outputs, naming, checks, printing), ``builder_generics`` (the
elementwise generic: broadcasting, keepdims, constants), ``builder_elementwise`` (math,
comparisons, masks, casts, ``iota``/``full``), ``builder_movement`` (broadcast_to,
transpose, reshape, concat), ``builder_reductions`` (reductions, matmul),
``builder_conv`` (pad, conv2d),
``builder_gather`` (take, embedding, gather, index, index_select: ``tensor.extract`` in a
generic, bounds clamped), ``builder_composites`` (gelu ... rms_norm) and
``builder_reference`` (the numpy reference).
The public names (``__all__``) are importable from here.
"""

from __future__ import annotations

from .composites import CompositeOps
from .conv import ConvolutionOps
from .core import GraphCore
from .elementwise import ElementwiseOps
from .gather import GatherOps
from .movement import DataMovementOps
from .reductions import ReductionOps
from .reference import ReferenceEvaluation
from .tensor import (
    DTYPES,
    INT_DTYPES,
    Axes,
    Operand,
    Scalar,
    Shape,
    Tensor,
    numpy_dtype,
    round_to_dtype,
)

__all__ = [
    "Axes",
    "DTYPES",
    "Graph",
    "INT_DTYPES",
    "Operand",
    "Scalar",
    "Shape",
    "Tensor",
    "numpy_dtype",
    "round_to_dtype",
]


class Graph(
    ElementwiseOps,
    DataMovementOps,
    ReductionOps,
    ConvolutionOps,
    GatherOps,
    CompositeOps,
    ReferenceEvaluation,
    GraphCore,
):
    """A dataflow graph of tensor operators that prints as one MLIR ``func.func``.

    Every op method takes an optional ``name=`` used as its location (composite ops use it
    as the scope of their parts); without one, ops are named ``<scope>.<op>`` made unique
    with a counter (``mul``, ``mul_1``, ``gelu.tanh``).

    Args:
        name: The function's symbol name.
        dtype: Default element type of inputs: ``f32``, ``f16`` or ``bf16``.
        doc: Optional one-line description, printed as a comment above the module.

    Example:
        >>> g = Graph("g2")
        >>> x, a = g.input("x", (4, 8)), g.input("a", (8,))
        >>> g.output(g.relu(g.tanh(x * a + 1.5)))
        >>> text = g.to_mlir()
        >>> (y,) = g.reference(x=np.ones((4, 8)), a=np.ones(8))
    """
