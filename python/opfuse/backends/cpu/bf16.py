"""bf16 values as their 16 bits in the lowered CPU module (the lowering's last stage).

Once the module is in the LLVM dialect no bf16 arithmetic is left in it:
``arith-emulate-unsupported-floats`` computes every bf16 op in f32 and
``arith-expand{include-bf16}`` turns the conversions into integer bit operations
(round to nearest even, NaN kept quiet). bf16 *values* remain, as data: loaded and
stored, chosen by ``llvm.select`` (a max reduction keeps the larger of two loaded values),
carried around loops as block arguments, as constants. LLVM's x86 backend has no bf16
registers without AVX512-BF16, so it promotes such a value to f32 where it crosses blocks
and truncates it back with a call of compiler-rt's ``__truncsfbf2``. The JIT finds that
helper in ``libmlir_float16_utils``; a bundle's shared library (llc for generic x86-64,
linked against libgcc 12, which lacks it) did not load (unfused G3, G5, G6 in bf16).

This stage gives every such value the i16 type of the same bits, so LLVM has no bf16
value to legalize and no helper to call, on any target. An op that gives its bf16
operands or results a float meaning (none is expected after the expansion; an
``llvm.call`` or a function's arguments may) keeps them, bridged by bitcasts.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, math

#: Ops that only move their bf16 values (no float meaning): their types may become i16.
_MOVES = frozenset({
    "llvm.load", "llvm.store", "llvm.select", "llvm.br", "llvm.cond_br", "llvm.freeze",
    "llvm.extractelement", "llvm.insertelement", "llvm.shufflevector",
    "llvm.mlir.undef", "llvm.mlir.poison", "llvm.mlir.zero",
    "llvm.intr.masked.load", "llvm.intr.masked.store",
})


def _bits_type(t: ir.Type) -> ir.Type | None:
    """``i16`` for ``bf16``, ``vector<...xi16>`` for a fixed ``vector<...xbf16>``, else None."""
    i16 = ir.IntegerType.get_signless(16, t.context)
    if isinstance(t, ir.BF16Type):
        return i16
    if isinstance(t, ir.VectorType) and isinstance(t.element_type, ir.BF16Type) \
            and not t.scalable:
        return ir.VectorType.get(t.shape, i16)
    return None


def bf16_as_bits(module: ir.Module) -> None:
    """Rewrite ``module`` (LLVM dialect) in place so that no bf16 value flows between ops."""
    with module.context, ir.Location.unknown():
        _rewrite(module)


def _rewrite(module: ir.Module) -> None:
    ops: list[ir.Operation] = []
    blocks: list[tuple[ir.Block, ir.Operation | None]] = []  # (block, function it enters)

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        ops.append(op)
        for region in op.regions:
            for i, block in enumerate(region.blocks):
                blocks.append((block, op if i == 0 and op.name == "llvm.func" else None))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    def bridge_result(value: ir.Value, ip: ir.InsertionPoint, loc: ir.Location) -> None:
        """Uses of the bf16 ``value`` read its bits from a bitcast instead."""
        cast = llvm.BitcastOp(value.type, value, loc=loc, ip=ip)
        value.replace_all_uses_except(cast.result, cast.operation)
        cast.result.set_type(_bits_type(value.type))

    # Values with a float meaning keep bf16 behind bridges (their other side becomes i16
    # below): a function's entry arguments, and operands/results of ops not in _MOVES.
    for block, func in blocks:
        if func is not None:
            for arg in block.arguments:
                if _bits_type(arg.type) is not None:
                    bridge_result(arg, ir.InsertionPoint.at_block_begin(block), func.location)
    for op in ops:
        if op.name in _MOVES or op.name == "llvm.bitcast":
            continue
        for i, operand in enumerate(op.operands):
            if _bits_type(operand.type) is not None:
                # bf16 -> bf16 for now: its operand becomes i16 below
                cast = llvm.BitcastOp(operand.type, operand, loc=op.location, ip=ir.InsertionPoint(op))
                op.operands[i] = cast.result
        for result in op.results:
            if _bits_type(result.type) is not None:
                bridge_result(result, ir.InsertionPoint.after(op), op.location)

    # Everything else that holds bf16 holds its bits: loop-carried block arguments, moved
    # values, bitcasts' bf16 sides.
    for block, func in blocks:
        if func is None:
            for arg in block.arguments:
                if (bits := _bits_type(arg.type)) is not None:
                    arg.set_type(bits)
    casts = []
    for op in ops:
        if op.name in _MOVES or op.name == "llvm.bitcast":
            for result in op.results:
                if (bits := _bits_type(result.type)) is not None:
                    result.set_type(bits)
            if op.name == "llvm.bitcast":
                casts.append(op)
    # The module's own bf16 <-> i16 bitcasts are i16 -> i16 now: gone (the bridges, made
    # after the walk, are not among them).
    for op in casts:
        if op.operands[0].type == op.results[0].type:
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()
    module.operation.verify()


def _like(t: ir.Type, element: ir.Type) -> ir.Type:
    """``element``, or a vector of it shaped like ``t`` when ``t`` is a vector."""
    return ir.VectorType.get(t.shape, element) if isinstance(t, ir.VectorType) else element


def _int_constant(t: ir.Type, value: int) -> ir.Value:
    if isinstance(t, ir.VectorType):
        attr = ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(t.element_type, value))
    else:
        attr = ir.IntegerAttr.get(t, value)
    return arith.ConstantOp(t, attr).result


def f64_to_bf16_through_odd_f32(module: ir.Module) -> None:
    """``arith.truncf`` f64 -> bf16 as f64 -> f32 rounded to odd, then f32 -> bf16.

    ``arith-expand{include-bf16}`` expands only f32 -> bf16; an f64 one stayed an
    ``fptrunc double to bfloat``, a call of ``__truncdfbf2`` (libgcc 12 has none; MLIR's
    float16 utils' rounds twice). Rounding to f32 *to odd* first (the nearest-even result,
    moved one ulp towards the f64 value when inexact and even) keeps the one correct
    rounding to nearest even: f32 carries 16 bits more than bf16, at every exponent.
    """
    with module.context, ir.Location.unknown():
        found: list[ir.Operation] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            if op.name == "arith.truncf":
                src, dst = op.operands[0].type, op.results[0].type
                elem = lambda t: t.element_type if isinstance(t, ir.VectorType) else t  # noqa: E731
                if isinstance(elem(src), ir.F64Type) and isinstance(elem(dst), ir.BF16Type):
                    found.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for op in found:
            x = op.operands[0]
            f32 = _like(x.type, ir.F32Type.get())
            i32 = _like(x.type, ir.IntegerType.get_signless(32))
            with ir.InsertionPoint(op), op.location:
                nearest = arith.truncf(f32, x)
                back = arith.extf(x.type, nearest)
                inexact = arith.cmpf(arith.CmpFPredicate.ONE, back, x)  # NaN: exact
                away = arith.cmpf(arith.CmpFPredicate.OGT, math.absf(back), math.absf(x))
                bits = arith.bitcast(i32, nearest)
                one = _int_constant(i32, 1)
                even = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(bits, one),
                                  _int_constant(i32, 0))
                towards_x = arith.select(away, arith.subi(bits, one), arith.addi(bits, one))
                odd = arith.select(arith.andi(inexact, even), towards_x, bits)
                result = arith.truncf(op.results[0].type, arith.bitcast(f32, odd))
            op.results[0].replace_all_uses_with(result)
            op.erase()
