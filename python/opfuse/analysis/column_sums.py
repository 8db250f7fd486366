"""Which column reductions a row kernel can add up atomically (opfuse-fuse-column-sums and
the GPU emitters' ``emit/column_sums.py`` ask the same questions here).

A column sum reduces leading loops and keeps trailing ones (``dY.sum(0)``). A row kernel
holding one row per team can still compute it by adding each element into the result
with a float atomic, provided that the reduction is a plain f32 sum (``red.add.f32``
exists; other combiners and types would need compare-and-swap loops) and that its
accumulator starts at zero (the runtime zeroes the result before the launch; an
accumulator that starts at a tensor would have to be added once, by one block).
"""

from __future__ import annotations

from mlir import ir

from .indexing import op_of


def leading_reductions(iterators) -> int:
    """How many leading loops a generic reduces when all its reduction loops come before
    its parallel ones and it keeps at least one; 0 otherwise."""
    its = list(iterators)
    p = its.count("reduction")
    if 0 < p < len(its) and its == ["reduction"] * p + ["parallel"] * (len(its) - p):
        return p
    return 0


def why_not_atomic_sum(op: ir.Operation) -> str | None:
    """None when ``op`` (a column-reduction ``linalg.generic``) is an f32 sum from zero
    with one result, which atomics can accumulate; otherwise why not."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return "not a single-result linalg.generic"
    block = op.regions[0].blocks[0]
    acc = block.arguments[len(block.arguments) - 1]
    if not isinstance(acc.type, ir.F32Type):
        return f"a sum of {acc.type} (float atomics add f32)"
    yielded = list(block.operations)[-1].operands[0]
    comb = op_of(yielded)
    if comb is None or comb.name != "arith.addf" or acc not in list(comb.operands):
        return "a column reduction that is not a sum"
    if list(comb.operands).count(acc) != 1 or len(list(acc.uses)) != 1:
        return "a sum that reads its accumulator elsewhere"
    if not starts_at_zero(op.operands[len(op.operands) - 1]):
        return "a sum whose accumulator does not start at zero"
    return None


def starts_at_zero(init: ir.Value) -> bool:
    """Whether a reduction's init tensor is a fill of the constant +0.0: ``linalg.fill``, or
    the ``linalg.generic`` it generalizes to (a scalar input its body yields)."""
    fill = op_of(init)
    if fill is None or fill.name not in ("linalg.fill", "linalg.generic"):
        return False
    scalar = fill.operands[0]
    if fill.name == "linalg.generic":
        body = list(fill.regions[0].blocks[0].operations)
        if (len(fill.operands) != 2 or isinstance(scalar.type, ir.ShapedType) or len(body) != 1
                or list(body[0].operands) != [fill.regions[0].blocks[0].arguments[0]]):
            return False
    c = op_of(scalar)
    if c is None or c.name != "arith.constant":
        return False
    attr = c.attributes["value"]
    if not isinstance(attr, ir.FloatAttr):
        try:
            attr = ir.FloatAttr(attr)
        except ValueError:
            return False
    return float(attr.value) == 0.0 and not str(attr).lstrip().startswith("-")


__all__ = ["leading_reductions", "starts_at_zero", "why_not_atomic_sum"]
