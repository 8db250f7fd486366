"""opfuse-fold-unit-dims: size-1 dims of linalg ops are folded away before fusion.

Producers other than opfuse's own importer keep reduced dims as size 1: torch-mlir's
softmax and LayerNorm reduce into ``tensor<32x1xf32>`` through the output map
``(d0, d1) -> (d0, 0)``, or reduce to ``32`` and ``tensor.expand_shape`` the result to
``32x1`` before a broadcasting generic reads it at ``(d0, 0)``. The fusion passes compare
iteration spaces by shape, so ``32x1`` glue next to a row reduction over ``32`` looks like
another domain and those programs fuse into 3 kernels (softmax) or 7 (LayerNorm) where the
same computations from the builder fuse into 1. Upstream's
``linalg-fold-unit-extent-dims`` rewrites every linalg op with unit loops to drop them
(reshaping its operands, which the fusion passes see through as free views); afterwards the
reductions, their glue and their consumers share the row domain.

Only functions that have a unit dim to fold are rewritten: the upstream pass also hoists the
constants of every payload it visits, which would change the register estimates of programs
it has nothing to fold in (G1-G8). The rewritten ops keep their locations, so ledger
entries still name the producer's ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.passmanager import PassManager

from opfuse.analysis.graph import functions

NAME = "opfuse-fold-unit-dims"
_UPSTREAM = "func.func(linalg-fold-unit-extent-dims)"


@dataclass(frozen=True)
class Options:
    """No options: the upstream pass runs with its defaults (reshapes, not slices)."""


def run(module: ir.Module, options: Options = Options()) -> None:
    pm = None
    for func_op in functions(module):
        if not has_unit_dims(func_op):
            continue
        if pm is None:
            pm = PassManager.parse(_UPSTREAM, module.context)
        pm.run(func_op)


def has_unit_dims(func_op: ir.Operation) -> bool:
    """Whether a linalg op of ``func_op`` has a size-1 tensor dim (which its maps index
    with ``0``, as in ``(d0, d1) -> (d0, 0)``): something the upstream pass would fold."""
    for op in func_op.regions[0].blocks[0].operations:
        op = op.operation
        if not op.name.startswith("linalg.") or op.name == "linalg.yield":
            continue
        for v in [*op.operands, *op.results]:
            t = v.type
            if isinstance(t, ir.RankedTensorType) and 1 in t.shape:
                return True
    return False
