"""i1 tensors become i8 tensors inside functions (booleans stored as bytes, 0 or 1).

A memref of i1 aborts the process in MemRefToLLVM (an LLVM assertion: sub-byte stores),
and torch-mlir and IREE print i1 tensors in every masked attention (``masked_fill``'s
mask, ``_safe_softmax``'s ``andi`` reduction). Scalars stay i1: only values in memory
change. Every payload stays exact: an i8 block argument becomes its i1 with
``arith.cmpi ne, %b, 0`` at the top of the body, an i1 yielded into an i8 output is stored
with ``arith.extui`` (0 or 1), a dense i1 constant becomes the same 0/1 bytes. Named ops
that only move data (copy, transpose, broadcast, fill) keep their names; other named ops
on i1 tensors are generalized first, so their bodies can be rewritten.

Function boundaries are not changed: a public function taking or returning i1 tensors is
refused by the contract (store booleans as i8 there, as the graph builder does); private
functions are inside the program and are widened with their calls.
"""

from __future__ import annotations

import numpy as np
from mlir import ir

from ...analysis.opinfo import generalize
from ...ir import walk_nested

#: Named linalg ops whose body only forwards an input element: on 0/1 bytes they do what
#: they did on i1, so their (implicit, regenerated-on-parse) bodies need no rewrite.
_DATA_MOVEMENT = frozenset({"linalg.copy", "linalg.transpose", "linalg.broadcast", "linalg.fill"})
#: linalg ops whose bodies are printed, so they can be rewritten in place.
_EXPLICIT_BODY = frozenset({"linalg.generic", "linalg.reduce", "linalg.map"})


def is_i1(t: ir.Type) -> bool:
    return isinstance(t, ir.IntegerType) and t.width == 1


def is_i1_tensor(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and is_i1(t.element_type)


def _i8(ctx: ir.Context) -> ir.Type:
    return ir.IntegerType.get_signless(8, ctx)


def _wide(t: ir.RankedTensorType) -> ir.Type:
    return ir.RankedTensorType.get(list(t.shape), _i8(t.context), t.encoding)


def widen_i1(module: ir.Module) -> int:
    """Rewrite every i1 tensor of ``module``'s functions as i8, in place; returns how many
    values changed type."""
    _generalize_named_on_i1(module)
    changed = 0
    with module.context, ir.Location.unknown(module.context):
        for fn in _functions(module):
            changed += _widen_function(fn)
        for fn in _functions(module):
            _update_signature(fn)
    return changed


def _functions(module: ir.Module) -> list[ir.Operation]:
    return [op.operation for op in module.body.operations
            if op.operation.name == "func.func" and op.operation.regions[0].blocks]


def _touches_i1(op: ir.Operation) -> bool:
    return any(is_i1_tensor(v.type) for v in (*op.operands, *op.results))


def _generalize_named_on_i1(module: ir.Module) -> None:
    for fn in _functions(module):
        ops = [op.operation for op in fn.regions[0].blocks[0].operations]
        named = [op for op in ops if op.name.startswith("linalg.") and op.regions
                 and op.name not in _EXPLICIT_BODY | _DATA_MOVEMENT and _touches_i1(op)]
        if not named:
            continue
        twins, scratch = generalize(named)
        for op, twin in zip(named, twins):
            if twin is None:
                continue
            new = twin.clone(ip=ir.InsertionPoint(op))
            for i, v in enumerate(op.operands):
                new.operands[i] = v
            for old, res in zip(op.results, new.results):
                old.replace_all_uses_with(res)
            op.erase()
        del scratch


def _widen_function(fn: ir.Operation) -> int:
    block = fn.regions[0].blocks[0]
    changed = 0
    for arg in block.arguments:
        if is_i1_tensor(arg.type):
            arg.set_type(_wide(arg.type))
            changed += 1
    ops = [op for top in block.operations for op in walk_nested(top.operation)]
    for op in ops:
        changed += _widen_op(op)
    return changed


def _widen_op(op: ir.Operation) -> int:
    name = op.name
    if name == "arith.constant" and is_i1_tensor(op.results[0].type):
        _replace_constant(op)
        return 1
    changed = 0
    was_i1 = [is_i1_tensor(r.type) for r in op.results]
    for r, narrow in zip(op.results, was_i1):
        if narrow:
            r.set_type(_wide(r.type))
            changed += 1
    if name.startswith("linalg.") and op.regions:
        _widen_linalg_body(op)
    elif name == "tensor.pad" and any(was_i1):
        _store_yields_as_i8(op.regions[0].blocks[0], [True])
    elif name == "tensor.extract" and _is_i8_tensor(op.operands[0].type) and is_i1(op.results[0].type):
        _extract_as_i8(op)
    elif name in ("tensor.from_elements", "tensor.splat") and any(was_i1):
        for i, v in enumerate(op.operands):
            if is_i1(v.type):
                op.operands[i] = _extui_before(op, v)
    return changed


def _is_i8_tensor(t: ir.Type) -> bool:
    return (isinstance(t, ir.RankedTensorType) and isinstance(t.element_type, ir.IntegerType)
            and t.element_type.width == 8)


def _replace_constant(op: ir.Operation) -> None:
    t = op.results[0].type
    values = np.array(ir.DenseElementsAttr(op.attributes["value"])).astype(np.int8)
    wide = _wide(t)
    dense = ir.DenseElementsAttr(op.attributes["value"])
    if dense.is_splat:
        attr = ir.DenseElementsAttr.get_splat(
            wide, ir.IntegerAttr.get(_i8(op.context), int(values.reshape(-1)[0])))
    else:
        attr = ir.DenseElementsAttr.get(np.ascontiguousarray(values.reshape(t.shape)), type=wide)
    op.attributes["value"] = attr
    op.results[0].set_type(wide)


def _widen_linalg_body(op: ir.Operation) -> None:
    """Block arguments of widened tensor operands become i8; explicit bodies get the
    narrowing/widening casts, data-movement named ops forward the bytes as they are."""
    if op.name == "linalg.fill" and is_i1(op.operands[0].type) and _is_i8_tensor(op.operands[1].type):
        op.operands[0] = _extui_before(op, op.operands[0])  # the fill value, as a byte
    operands = list(op.operands)
    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    n_init = len(op.results)
    inputs = operands[: len(operands) - n_init]
    # linalg.map's body has one argument per input only; the others one per operand
    bound = inputs if op.name == "linalg.map" else operands
    explicit = op.name in _EXPLICIT_BODY
    for arg, v in zip(args, bound):
        t = v.type
        if is_i1(arg.type) and (_is_i8_tensor(t) or (op.name == "linalg.fill" and t == _i8(op.context))):
            arg.set_type(_i8(op.context))
            if explicit and list(arg.uses):
                _narrow_at_top(block, arg)
    if explicit:
        outputs_i8 = [_is_i8_tensor(r.type) for r in op.results]
        _store_yields_as_i8(block, outputs_i8)


def _narrow_at_top(block: ir.Block, arg: ir.BlockArgument) -> None:
    from mlir.dialects import arith

    first = list(block.operations)[0]
    with ir.InsertionPoint(first):
        zero = arith.ConstantOp(_i8(arg.context), 0)
        narrow = arith.CmpIOp(arith.CmpIPredicate.ne, arg, zero.result)
    arg.replace_all_uses_except(narrow.result, narrow.operation)


def _store_yields_as_i8(block: ir.Block, outputs_i8: list[bool]) -> None:
    term = list(block.operations)[-1]
    for i, v in enumerate(list(term.operands)):
        if i < len(outputs_i8) and outputs_i8[i] and is_i1(v.type):
            term.operands[i] = _extui_before(term, v)


def _extui_before(op: ir.Operation, v: ir.Value) -> ir.Value:
    """``v`` (i1) as an i8 0/1 just before ``op``: a constant when ``v`` is one (a fill
    value at the top level of a function must stay a constant)."""
    from mlir.dialects import arith

    owner = v.owner
    with ir.InsertionPoint(op), op.location:
        if not isinstance(owner, ir.Block) and owner.operation.name == "arith.constant":
            bit = int(ir.IntegerAttr(owner.operation.attributes["value"]).value) & 1
            return arith.ConstantOp(_i8(v.context), bit).result
        return arith.ExtUIOp(_i8(v.context), v).result


def _extract_as_i8(op: ir.Operation) -> None:
    from mlir.dialects import arith

    r = op.results[0]
    r.set_type(_i8(op.context))
    ops = [o.operation for o in op.block.operations]
    with ir.InsertionPoint(ops[ops.index(op) + 1]), op.location:
        zero = arith.ConstantOp(_i8(op.context), 0)
        narrow = arith.CmpIOp(arith.CmpIPredicate.ne, r, zero.result)
    r.replace_all_uses_except(narrow.result, narrow.operation)


def _update_signature(fn: ir.Operation) -> None:
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    results = [v.type for v in ret.operands] if ret.name == "func.return" else []
    old = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    if not results and old.results:
        results = list(old.results)
    new = ir.FunctionType.get([a.type for a in block.arguments], results)
    if new != old:
        fn.attributes["function_type"] = ir.TypeAttr.get(new)
