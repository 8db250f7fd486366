"""A graph's contractions alone: how much of the unfused time fusion can remove at all.

Fusion removes the memory traffic and the launches of the ops around the contractions
(matmuls, batched matmuls); it leaves the contractions' own work. On a matmul-bound graph
whose matmuls run near the machine's peak on both sides (the same micro-kernel fused and
unfused), ``unfused / contractions alone`` is about the most fused/unfused can be: the
speedup of a program whose every other op were free. (Not a strict bound: a fused
attention never writes its scores, and sibling matmuls run as one, so fused can dip
under it.) The bench times this program beside fused and unfused, in the same rounds.

:func:`contractions_alone` builds it from the graph's own text: one public function that
computes each contraction of the entry on fresh arguments (one per distinct operand of
the original, so a weight read by two matmuls is one argument), into zero-filled
results, and returns them all.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, linalg, tensor

from opfuse.analysis.opinfo import OpKind, describe_all
from opfuse.ir import make_context
from opfuse.ir import find_entry

#: The function's name.
ENTRY = "contractions_alone"


def contractions_alone(text: str) -> str | None:
    """The MLIR text of the entry function's contractions alone; None when it has none."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        entry = find_entry(module)
        ops = [op.operation for op in entry.regions[0].blocks[0].operations]
        picked = [op for op, info in zip(ops, describe_all(entry, ops))
                  if info.kind == OpKind.CONTRACTION]
        if not picked:
            return None
        inputs: list[ir.Value] = []
        for op in picked:
            for v in op.opview.inputs:
                if v not in inputs:
                    inputs.append(v)
        out = ir.Module.create()
        with ir.InsertionPoint(out.body):
            ftype = ir.FunctionType.get([v.type for v in inputs],
                                        [op.results[0].type for op in picked])
            fn = func.FuncOp(ENTRY, ftype)
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                results = [_recompute(op, inputs, block.arguments) for op in picked]
                func.ReturnOp(results)
        return str(out)


def _recompute(op: ir.Operation, inputs: list[ir.Value], args) -> ir.Value:
    """``op`` cloned at the insertion point, reading the arguments that stand for its
    inputs and writing a zero-filled tensor of its result's type."""
    n_in = len(op.opview.inputs)
    t = ir.RankedTensorType(op.results[0].type)
    zero_attr = (ir.IntegerAttr.get(t.element_type, 0)
                 if isinstance(t.element_type, ir.IntegerType)
                 else ir.FloatAttr.get(t.element_type, 0.0))
    zero = arith.ConstantOp(t.element_type, zero_attr).result
    init = linalg.fill(zero, outs=[tensor.EmptyOp(t.shape, t.element_type).result])
    copy = op.clone()
    for j, v in enumerate(op.opview.inputs):
        copy.operands[j] = args[inputs.index(v)]
    copy.operands[n_in] = init
    return copy.results[0]


__all__ = ["ENTRY", "contractions_alone"]
