"""The decomposition table opfuse runs ``torch.export`` programs through.

It is ``torch.export.default_decompositions()`` (core ATen) with a few composite ops taken
out, so that they reach the importer whole and become the same builder ops as the
hand-written graphs (``opfuse.frontends.builder.graphs``). Without this, for example,
``aten.matmul`` on 4-D operands decomposes to ``expand``/``view``/``bmm``/``view`` and, on a
transposed operand, into a broadcast copy of the weight; and ``scaled_dot_product_attention``
into a "safe softmax" guarded by boolean ops (``eq``, ``any``, ``where``) that no fusion
pass needs.

Kept whole (see ``PRESERVED``), each one imported as:

* ``aten.linear``: ``x @ transpose(W) + b`` on 2-D operands (leading dims folded).
* ``aten.matmul``: ``Graph.matmul`` (2-D, 3-D, 4-D; batch dims broadcast/folded).
* ``aten.scaled_dot_product_attention``: ``softmax(Q Kᵀ · scale) V``, as G5/G6 write it
  (a mask, or ``is_causal``'s, applied to the scaled scores).
* ``aten._safe_softmax``: ``Graph.softmax`` (differs only on rows that are all -inf).
* ``aten.rms_norm``: ``Graph.rms_norm``; ``aten.silu``: ``Graph.silu``.

Taken out too, for correctness: ``aten._scaled_dot_product_flash_attention_for_cpu``,
whose core ATen decomposition (written for inference export) returns the attention
weights where the op returns its log-sum-exp; a backward graph that reads the log-sum-exp
would compute wrong gradients from it, so the op stays whole (and eager) if it appears.

Added (``backward_decompositions``): the loss and embedding-gradient ops of a training
step, spelled without scatters.

Everything else follows the default table; the core ATen ops it leaves (``gelu``,
``_softmax``, ``native_layer_norm``, ``addmm``, ``permute``, ``view`` ...) are imported
one by one (the op table in ``opfuse.frontends.torch.aten``).
"""

from __future__ import annotations

from typing import Any

# Op overload names (``str(torch.ops.aten.linear.default)``) kept out of the table.
PRESERVED = (
    "aten.linear.default",
    "aten.matmul.default",
    "aten.scaled_dot_product_attention.default",
    "aten._safe_softmax.default",
    "aten.rms_norm.default",
    "aten.silu.default",
)


# Decompositions that are wrong where their op's every result is read.
WRONG_FOR_TRAINING = ("aten._scaled_dot_product_flash_attention_for_cpu.default",)


def decomposition_table() -> dict[Any, Any]:
    """The table for ``ExportedProgram.run_decompositions`` and AOTAutograd (a fresh copy
    per call)."""
    import torch

    from .backward_decompositions import table as backward_table

    table = torch.export.default_decompositions()
    for name in PRESERVED + WRONG_FOR_TRAINING:
        namespace, op, overload = name.split(".")
        table.pop(getattr(getattr(getattr(torch.ops, namespace), op), overload), None)
    table.update(backward_table())
    return table
