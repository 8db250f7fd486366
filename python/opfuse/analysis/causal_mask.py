"""Causal masks in attention's score tree: which keys a mask makes ``-inf``.

A causal mask is written many ways (``iota`` and a comparison, ``triu`` of ones turned
into a boolean, ``where(mask, s, -inf)``, an additive ``-inf`` bias, a boolean mask inside
another); what they share is a ``select`` between the score and ``-inf`` whose condition
is a linear predicate over the loop indices. :func:`causal_offset` finds the ``c`` with
every key ``n > m + c`` masked, so a kernel can skip the key tiles above the diagonal;
:func:`causal_selects` names the selects it may bypass below it.

``trees`` is the score expansion of :mod:`opfuse.analysis.attention` (its ``consts``,
``indices`` and ``selects`` tables); a tree is ``("op", name, attrs, *kids)``,
``("const", k)``, ``("index", k)`` or a leaf read.
"""

from __future__ import annotations

import math

from mlir import ir

Tree = tuple

#: The float casts a score passes through unchanged in sign.
CASTS = ("arith.extf", "arith.truncf")
INDEX_CASTS = (
    "arith.index_cast", "arith.index_castui", "arith.sitofp", "arith.uitofp", "arith.extsi",
    "arith.extui", "arith.trunci", "arith.fptosi", "arith.fptoui",
)


def float_value(attr: ir.Attribute) -> float | None:
    """A float attribute's value, or None."""
    return ir.FloatAttr(attr).value if isinstance(attr, ir.FloatAttr) else None



def causal_offset(x: Tree, trees, m: int, n: int) -> int | None:
    """``c`` when the score tree ``x`` is ``-inf`` wherever key ``n > m + c`` (a causal
    mask, found from the index comparisons that select ``-inf``), else None."""
    offsets = [c for c, _, _ in _masked(x, trees, m, n) if c is not None]
    return min(offsets) if offsets else None


def causal_selects(x: Tree, trees, m: int, n: int) -> dict[ir.Operation, int]:
    """The payload selects of the causal masks of score tree ``x`` (those
    :func:`causal_offset` found) and the operand each keeps (1 or 2) where ``n <= m +
    c``: with ``c`` the smallest offset, every one of them keeps it there."""
    return {op: kept for c, t, kept in _masked(x, trees, m, n) if c is not None
            for op in trees.selects.get(t, ())}


def _masked(t: Tree, trees, m: int, n: int) -> list[tuple[int | None, Tree, int]]:
    """(causal offset, select tree, the operand it keeps where it is not -inf) of the
    selects that make ``t`` certainly -inf in a region."""
    if t[0] != "op":
        return []
    name, kids = t[1], t[3:]
    if name in CASTS:
        return _masked(kids[0], trees, m, n)
    if name == "arith.addf":
        return _masked(kids[0], trees, m, n) + _masked(kids[1], trees, m, n)
    if name in ("arith.mulf", "arith.divf"):
        positive = [i for i, c in enumerate(kids) if c[0] == "const"
                    and (float_value(trees.consts[c[1]]) or 0) > 0 and (name == "arith.mulf" or i == 1)]
        if positive:
            return _masked(kids[1 - positive[0]], trees, m, n)
        return []
    if name == "arith.select":
        cond, a, b = kids
        out = []
        for branch, keep_when, kept in ((b, True, 1), (a, False, 2)):
            if branch[0] == "const" and float_value(trees.consts[branch[1]]) == -math.inf:
                form = _predicate(cond, trees)
                if form is not None:
                    out.append((_causal(form if keep_when else _negate(form), m, n), t, kept))
                # where the kept operand is -inf, so is the select (a causal mask inside
                # a boolean one: where(mask, where(causal, s, -inf), -inf))
                out += _masked(kids[kept], trees, m, n)
        return out
    return []


# A linear predicate: (coefficients by dim, constant, strict): sum(c * d) + k > 0 (strict)
# or >= 0. For integer loop indices, "f >= 0" is "f + 1 > 0".
_Form = tuple[dict[int, int], int, bool]


def _negate(form: _Form) -> _Form:
    coeffs, k, strict = form
    return {d: -c for d, c in coeffs.items()}, -k, not strict


def _causal(keep: _Form, m: int, n: int) -> int | None:
    """The causal offset ``c`` when ``keep`` is ``n <= m + c``."""
    coeffs, k, strict = keep
    if strict:
        k -= 1  # f > 0  <=>  f - 1 >= 0
    if {d: c for d, c in coeffs.items() if c} == {m: 1, n: -1}:  # m - n + k >= 0
        return k
    return None


_CMPI = {5: (1, False), 4: (1, True), 3: (-1, False), 2: (-1, True),  # sge sgt sle slt
         9: (1, False), 8: (1, True), 7: (-1, False), 6: (-1, True)}  # uge ugt ule ult
_CMPF = {3: (1, False), 2: (1, True), 5: (-1, False), 4: (-1, True),  # oge ogt ole olt
         10: (1, False), 9: (1, True), 12: (-1, False), 11: (-1, True)}  # uge ugt ule ult


def _predicate(t: Tree, trees) -> _Form | None:
    """``t`` (an i1 or i8 boolean) as a linear predicate over loop indices, or None."""
    if t[0] != "op":
        return None
    name, attrs, kids = t[1], dict(t[2]), t[3:]
    if name == "arith.extui":
        return _predicate(kids[0], trees)
    if name == "arith.xori":
        for c, other in ((kids[0], kids[1]), (kids[1], kids[0])):
            if c[0] == "const" and _int(trees.consts[c[1]]) in (1, -1):
                form = _predicate(other, trees)
                return _negate(form) if form is not None else None
        return None
    if name not in ("arith.cmpi", "arith.cmpf"):
        return None
    pred = int(attrs["predicate"].split(":")[0])
    if name == "arith.cmpi" and pred == 1:  # ne: an i8 boolean compared with 0
        for c, other in ((kids[1], kids[0]), (kids[0], kids[1])):
            if c[0] == "const" and _int(trees.consts[c[1]]) == 0:
                return _predicate(other, trees)
        return None
    sign_strict = (_CMPI if name == "arith.cmpi" else _CMPF).get(pred)
    a, b = _linear(kids[0], trees), _linear(kids[1], trees)
    if sign_strict is None or a is None or b is None:
        return None
    sign, strict = sign_strict
    coeffs = {d: sign * (a[0].get(d, 0) - b[0].get(d, 0)) for d in {*a[0], *b[0]}}
    return coeffs, sign * (a[1] - b[1]), strict


def _int(attr: ir.Attribute) -> int | None:
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    f = float_value(attr)
    return int(f) if f is not None and math.isfinite(f) and f == int(f) else None


def _linear(t: Tree, trees) -> tuple[dict[int, int], int] | None:
    """An integer-valued tree as ``sum(c * dim) + k``, or None."""
    if t[0] == "const":
        k = _int(trees.consts[t[1]])
        return ({}, k) if k is not None else None
    if t[0] == "index":
        return _affine_linear(trees.indices[t[1]])
    if t[0] != "op":
        return None
    name, kids = t[1], t[3:]
    if name in INDEX_CASTS:
        return _linear(kids[0], trees)
    parts = [_linear(c, trees) for c in kids]
    if any(p is None for p in parts) or len(parts) != 2:
        return None
    (ca, ka), (cb, kb) = parts
    if name in ("arith.addi", "arith.addf", "arith.subi", "arith.subf"):
        s = -1 if name in ("arith.subi", "arith.subf") else 1
        return {d: ca.get(d, 0) + s * cb.get(d, 0) for d in {*ca, *cb}}, ka + s * kb
    if name in ("arith.muli", "arith.mulf"):
        if not ca:
            return {d: ka * c for d, c in cb.items()}, ka * kb
        if not cb:
            return {d: kb * c for d, c in ca.items()}, ka * kb
    return None


def _affine_linear(e: ir.AffineExpr) -> tuple[dict[int, int], int] | None:
    e = e.maybe_downcast()
    if isinstance(e, ir.AffineDimExpr):
        return {e.position: 1}, 0
    if isinstance(e, ir.AffineConstantExpr):
        return {}, e.value
    if isinstance(e, ir.AffineAddExpr):
        a, b = _affine_linear(e.lhs), _affine_linear(e.rhs)
        if a is None or b is None:
            return None
        return {d: a[0].get(d, 0) + b[0].get(d, 0) for d in {*a[0], *b[0]}}, a[1] + b[1]
    if isinstance(e, ir.AffineMulExpr):
        a, b = _affine_linear(e.lhs), _affine_linear(e.rhs)
        if a is None or b is None or (a[0] and b[0]):
            return None
        if not a[0]:
            a, b = b, a
        return {d: c * b[1] for d, c in a[0].items()}, a[1] * b[1]
    return None


__all__ = ["CASTS", "INDEX_CASTS", "causal_offset", "causal_selects", "float_value"]
