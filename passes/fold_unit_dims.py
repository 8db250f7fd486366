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
from opfuse.analysis.opinfo import invalidate_cache
from opfuse.frontends.mlir.contract import unread_inits_to_empty

NAME = "opfuse-fold-unit-dims"
_UPSTREAM = "func.func(linalg-fold-unit-extent-dims)"


@dataclass(frozen=True)
class Options:
    """No options: the upstream pass runs with its defaults (reshapes, not slices)."""


_MARK = "opfuse.before_fold"
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


def run(module: ir.Module, options: Options = Options()) -> None:
    pm = None
    for func_op in functions(module):
        if not has_unit_dims(func_op):
            continue
        if pm is None:
            pm = PassManager.parse(_UPSTREAM, module.context)
        block = func_op.regions[0].blocks[0]
        for op in block.operations:
            op.operation.attributes[_MARK] = ir.UnitAttr.get(module.context)
        pm.run(func_op)
        # the upstream pass replaces ops: op descriptions and graphs kept for this run
        # are stale (the pipeline drops them after any upstream step for the same reason)
        invalidate_cache()
        _name_new_reshapes(block)
        # the rewritten ops' outs are reshapes of the old ones: where unread, a dependency
        # on an op of its own (a fill's outs, an argument before) that outlining would
        # leave in another kernel; the contract's normalization again
        unread_inits_to_empty(func_op)


def _name_new_reshapes(block: ir.Block) -> None:
    """The pass gives the reshapes it adds the location of the op it rewrote; where that is
    a name (``loc("neg")``, the builder's), the reshape is called ``neg.collapse_shape``, so
    that ledger entries between the two do not read ``neg -> neg``."""
    for op in block.operations:
        op = op.operation
        if _MARK in op.attributes:
            del op.attributes[_MARK]
        elif op.name in _RESHAPES and op.location.is_a_name():
            name = f"{op.location.name_str}.{op.name.split('.')[1]}"
            op.location = ir.Location.name(name, childLoc=op.location.child_loc, context=op.context)


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
