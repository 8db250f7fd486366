"""How an affine index expression varies across the lanes of a per-thread vector.

A thread handles ``V`` consecutive values of one index variable (the vector dim ``d``,
whose value is always a multiple of ``V``). For an index expression ``e`` the emitters need
to know whether lane ``l`` sees ``e(d + l) == e(d)`` (INVARIANT: load once, broadcast),
``e(d + l) == e(d) + l`` (CONTIG: one vector load) or anything else (OTHER: gather), and
whether ``e(d)`` is a multiple of ``V`` (ALIGNED: the vector load is ``V``-aligned).
The rules are syntactic over MLIR's affine expressions, which is all the emitters produce:
``d mod B`` and ``d floordiv B`` behave when ``B`` is a multiple of ``V``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mlir import ir


class Kind(enum.Enum):
    INVARIANT = "invariant"
    CONTIG = "contig"
    OTHER = "other"


@dataclass(frozen=True)
class Lanes:
    kind: Kind
    aligned: bool


_INV = Lanes(Kind.INVARIANT, False)
_INV_AL = Lanes(Kind.INVARIANT, True)
_OTHER = Lanes(Kind.OTHER, False)


def analyze(e: ir.AffineExpr, vdim: frozenset[int] | int | None, v: int) -> Lanes:
    """Classify ``e`` for vector dims ``vdim`` (a set: several chunks of one thread may each
    have their own index variable; an expression uses at most one) with ``v`` lanes."""
    if not isinstance(vdim, frozenset):
        vdim = frozenset() if vdim is None else frozenset([vdim])
    e = e.maybe_downcast()
    if isinstance(e, ir.AffineConstantExpr):
        return Lanes(Kind.INVARIANT, e.value % v == 0)
    if isinstance(e, ir.AffineDimExpr):
        if e.position in vdim:
            return Lanes(Kind.CONTIG, True)
        return _INV if v > 1 else _INV_AL
    if isinstance(e, ir.AffineSymbolExpr):
        return _INV
    if isinstance(e, ir.AffineAddExpr):
        a, b = analyze(e.lhs, vdim, v), analyze(e.rhs, vdim, v)
        if a.kind == Kind.OTHER or b.kind == Kind.OTHER:
            return _OTHER
        if a.kind == Kind.CONTIG and b.kind == Kind.CONTIG:
            return _OTHER
        kind = Kind.CONTIG if Kind.CONTIG in (a.kind, b.kind) else Kind.INVARIANT
        return Lanes(kind, a.aligned and b.aligned)
    if isinstance(e, ir.AffineMulExpr):
        a = analyze(e.lhs, vdim, v)
        c = _constant(e.rhs)
        if c is None:
            b = analyze(e.rhs, vdim, v)
            if a.kind == Kind.INVARIANT and b.kind == Kind.INVARIANT:
                return Lanes(Kind.INVARIANT, a.aligned or b.aligned)
            return _OTHER
        if a.kind == Kind.INVARIANT:
            return Lanes(Kind.INVARIANT, a.aligned or c % v == 0)
        if a.kind == Kind.CONTIG and c == 1:
            return a
        return _OTHER
    if isinstance(e, (ir.AffineFloorDivExpr, ir.AffineCeilDivExpr)):
        a = analyze(e.lhs, vdim, v)
        c = _constant(e.rhs)
        if a.kind == Kind.INVARIANT:
            return _INV
        if (
            a.kind == Kind.CONTIG
            and a.aligned
            and c is not None
            and c % v == 0
            and isinstance(e, ir.AffineFloorDivExpr)
        ):
            return _INV
        return _OTHER
    if isinstance(e, ir.AffineModExpr):
        a = analyze(e.lhs, vdim, v)
        c = _constant(e.rhs)
        if a.kind == Kind.INVARIANT:
            return Lanes(Kind.INVARIANT, False)
        if a.kind == Kind.CONTIG and a.aligned and c is not None and c % v == 0:
            return Lanes(Kind.CONTIG, True)
        return _OTHER
    return _OTHER


def _constant(e: ir.AffineExpr) -> int | None:
    e = e.maybe_downcast()
    return e.value if isinstance(e, ir.AffineConstantExpr) else None


def lane_map(n_dims: int, vdim: frozenset[int], lane: int, ctx: ir.Context) -> ir.AffineMap:
    """The map that shifts the vector dims by ``lane`` (to index one lane of a gather)."""
    exprs = [ir.AffineDimExpr.get(i, ctx) for i in range(n_dims)]
    for d in vdim:
        if d < n_dims:
            exprs[d] = exprs[d] + lane
    return ir.AffineMap.get(n_dims, 0, exprs, ctx)
