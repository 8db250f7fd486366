"""What the attention kernels (GPU and CPU) share: the recognized attention of a prepared
``attention`` group, index expressions instantiated at a kernel's loop indices, and an
evaluator that takes the kernel's own scores and outputs in place of the two matmuls.

The kernels never evaluate the group's softmax ops: they compute S = Q·Kᵀ themselves, ask
the evaluator for the scores ``X`` at one (query, key) point with S given (so scales and
masks are the graph's own ops, in its own element types), run the online softmax and the
P·V accumulation in f32, and give the normalized O back to the evaluator to write the
group's outputs (reshapes, casts: whatever the group computes from P·V pointwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, scf

from ....analysis.attention import Attention, generic_twin, match, reductions_read
from ....analysis.indexing import Index, compose, shape_of, substitute
from .evaluate import Evaluator, Val
from .group import Group, Output, require
from .kernel import KernelBuilder


@dataclass
class Plan:
    """A prepared attention group's recognized attention and its outputs' placement.

    Attributes:
        att: the recognized attention (index expressions over attention dims).
        outputs: each group output with the index (over attention dims; the key and head
            dims unused) at which it reads P·V's result.
    """

    group: Group
    att: Attention
    outputs: list[tuple[Output, Index]]

    @property
    def o(self) -> ir.Value:
        return self.att.pv.op.results[0]


def plan(group: Group) -> Plan:
    """Recognize the attention of ``group`` (a prepared ``attention`` function).

    Raises:
        Unsupported: the group is not exactly one attention whose outputs are computed
            pointwise from P·V's result.
    """
    found = []
    for op in group.ops():
        if op.name == "linalg.generic":
            m = match(op, generic_twin)
            if m is not None and not isinstance(m, str):
                found.append(m)
    require(len(found) == 1, f"{len(found)} attention patterns in an attention group")
    att = found[0]
    ctx = group.func.context
    with ctx:
        dims = [ir.AffineDimExpr.get(i) for i in range(att.n_dims)]
    o_idx = compose(att.pv.maps[2], dims[:-1], att.n_dims, ctx)
    o = att.pv.op.results[0]
    o_shape = shape_of(o.type)
    outputs = []
    for out in group.outputs:
        out_shape = tuple(out.shape)

        def reads_pv_at(out_idx: Index | None) -> bool:
            # read at out_idx, the output must read P·V at its own index and nothing else
            if out_idx is None:
                return False
            reads = reductions_read(out.value, out_idx, generic_twin, att.n_dims)
            return bool(reads) and all(v == o and _same(i, o_idx, o_shape) for v, i in reads)

        out_idx = _unit_reshaped(o_idx, o_shape, out_shape, ctx)
        if not reads_pv_at(out_idx):
            # (checked by construction: affine exprs do not simplify b * 8 + h with
            # b = m floordiv 8 and h = m mod 8 back to m, so reads_pv_at cannot tell)
            out_idx = _inverted(out, o, o_idx, o_shape, ctx)
            require(out_idx is not None,
                    "an attention output that is not P·V's result read pointwise, "
                    "with its dims reordered, split or merged")
        outputs.append((out, out_idx))
    return Plan(group, att, outputs)


def _inverted(out: Output, o: ir.Value, o_idx: Index, o_shape: tuple, ctx) -> Index | None:
    """Where ``out`` holds P·V's element at ``o_idx`` when it is P·V's result with its
    dims reordered, split or merged (the heads merged back, ``O.transpose(1, 2)`` on a
    batch x heads P·V, which every multi-head attention does before its output
    projection): read ``out`` at its own dims, each P·V index must be a mixed-radix
    number of output dims (``b * H + h``), every output dim in exactly one of them; the
    output's dims are then ``o_idx``'s digits. None for any other output."""
    rank = len(out.shape)
    own = tuple(ir.AffineDimExpr.get(j, ctx) for j in range(rank))
    reads = reductions_read(out.value, own, generic_twin, rank)
    if not reads or any(v != o or list(map(str, i)) != list(map(str, reads[0][1]))
                        for v, i in reads):
        return None
    pv_idx = reads[0][1]
    zero = ir.AffineConstantExpr.get(0, ctx)
    digits: list = [zero] * rank
    seen = set()
    for e, pos, size in zip(pv_idx, o_idx, o_shape):
        terms = _linear_terms(e.maybe_downcast())
        if terms is None:
            return None
        radix = 1
        for j, coeff in sorted(terms.items(), key=lambda t: t[1]):
            if coeff != radix or j in seen:
                return None
            seen.add(j)
            digit = pos if radix == 1 else ir.AffineExpr.get_floor_div(pos, radix)
            radix *= out.shape[j]
            digits[j] = digit if radix >= size else ir.AffineExpr.get_mod(digit, out.shape[j])
        if radix != size and size != 1:
            return None
    if any(out.shape[j] != 1 for j in range(rank) if j not in seen):
        return None
    return tuple(d.maybe_downcast() for d in digits)


def _linear_terms(e: ir.AffineExpr) -> dict[int, int] | None:
    """``e`` as ``{dim: coefficient}`` when it is a sum of dims times positive constants
    (``d0 * 8 + d2``); None for anything else (constants, floordiv, mod)."""
    if isinstance(e, ir.AffineDimExpr):
        return {e.position: 1}
    if isinstance(e, ir.AffineAddExpr):
        a, b = _linear_terms(e.lhs.maybe_downcast()), _linear_terms(e.rhs.maybe_downcast())
        if a is None or b is None or set(a) & set(b):
            return None
        return {**a, **b}
    if isinstance(e, ir.AffineMulExpr):
        lhs, rhs = e.lhs.maybe_downcast(), e.rhs.maybe_downcast()
        if isinstance(lhs, ir.AffineConstantExpr):
            lhs, rhs = rhs, lhs
        inner = _linear_terms(lhs)
        if inner is None or not isinstance(rhs, ir.AffineConstantExpr) or rhs.value <= 0:
            return None
        return {j: c * rhs.value for j, c in inner.items()}
    return None


def _unit_reshaped(idx: Index, shape: tuple, out_shape: tuple, ctx) -> Index | None:
    """``idx`` (into ``shape``) for a tensor of ``out_shape`` that holds the same elements
    with size-1 dims added or dropped (the unit-dim fold's collapse/expand around P·V);
    None for any other shape."""
    if out_shape == shape:
        return idx
    kept = [e for e, d in zip(idx, shape) if d != 1]
    if [d for d in shape if d != 1] != [d for d in out_shape if d != 1]:
        return None
    zero = ir.AffineConstantExpr.get(0, ctx)
    it = iter(kept)
    return tuple(zero if d == 1 else next(it) for d in out_shape)


def _same(a: Index, b: Index, shape: tuple) -> bool:
    """The same element of a tensor of ``shape`` (any index of a size-1 dim is 0)."""
    return all(d == 1 or str(x) == str(y) for x, y, d in zip(a, b, shape)) and len(a) == len(b)


def clamped(kb: KernelBuilder, e: ir.AffineExpr, size: int, tile: int):
    """``e`` clamped to ``size - 1`` (a dim) and whether it was in range (None when every
    tile of ``tile`` is full)."""
    v = kb.apply(e)
    if size % tile == 0:
        return kb.add_dim(v), None
    ok = kb.cmp_lt(v, kb.index(size))
    return kb.add_dim(kb.min_index(v, kb.index(size - 1))), ok


def key_bound(kb: KernelBuilder, causal: int | None, m0: ir.AffineExpr, bm: int,
              keys: int) -> ir.Value:
    """The end of a block's key loop: ``keys``, or with a causal mask (keys ``n > m + c``
    masked) one past the last key a row of the block (rows ``m0 .. m0 + bm - 1``) attends
    to, ``max(0, m0 + bm + c)``, at most ``keys``."""
    c = causal
    if c is None:
        return kb.index(keys)
    if bm + c >= 0:
        end = kb.apply(m0 + (bm + c))
    else:  # a mask far below the diagonal: max(m0 + bm, -c) + c, never negative
        with kb.emitting():
            end = arith.subi(arith.maxsi(kb.apply(m0 + bm), kb.index(-c)), kb.index(-c))
    return kb.min_index(end, kb.index(keys))


def kernel_meta(att: Attention, tile: tuple[int, int], padded: tuple[int, int],
                mma_kind: str | None) -> dict:
    """What an attention kernel records for the estimate (``KernelSpec.meta``; see
    :func:`opfuse.cost.gpu_time.attention_kernel`): its tile ``[block_m, block_n]``,
    the problem ``[batch x heads, M, N, D, Dv]``, the head dims as padded in shared
    memory, the causal offset, the operand type and the MMA kind (None: FFMA)."""
    batch = 1
    for d in att.batch:
        batch *= d
    return {
        "attention": True,
        "mma": mma_kind,
        "tile": list(tile),
        "problem": [batch, att.queries, att.keys, att.head_dim, att.value_dim],
        "padded": list(padded),
        "causal": att.causal,
        "operands": str(elem_type(att.q)),
    }


class AttentionEvaluator(Evaluator):
    """An evaluator that returns :attr:`held` values for S and O (the kernel's own, for
    the point being evaluated) instead of computing the matmuls, and, while
    :attr:`bypass` is set (a key tile below the diagonal), each causal select as the
    operand it keeps there, so the causal mask is not evaluated at all."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held: dict[ir.Value, Val] = {}
        self.bypass: dict[ir.Operation, int] = {}

    def value(self, v: ir.Value, idx) -> Val:
        held = self.held.get(v)
        if held is not None:
            return held
        return super().value(v, idx)

    def bypassed(self, op: ir.Operation) -> int | None:
        return self.bypass.get(op)


def below_diagonal(kb: KernelBuilder, att: Attention, m0: ir.AffineExpr, n0: ir.AffineExpr,
                   bn: int) -> ir.Value | None:
    """Whether the key tile ``n0 .. n0 + bn - 1`` is wholly at or below the causal
    diagonal for every row from ``m0`` on (``n0 + bn - 1 <= m0 + c``: no key of it is
    masked for any row of the block); None when there is no causal select to skip."""
    if att.causal is None or not att.causal_selects:
        return None
    return kb.cmp_lt(kb.apply(n0 + (bn - 1 - att.causal)), kb.apply(m0 + 1))


def scores_by_tile(kb: KernelBuilder, ev: AttentionEvaluator, att: Attention, below, n: int,
                   scores) -> list[ir.Value]:
    """``scores()``: the tile's ``n`` f32 scores (a flat list). When ``below`` is a
    condition, ``scf.if below`` evaluates them with the causal selects bypassed (the mask
    costs nothing on tiles below the diagonal, as in FlashAttention-2) and the else branch
    with the whole mask."""
    if below is None:
        return scores()
    with kb.emitting():
        branch = scf.IfOp(below, [ir.F32Type.get(kb.ctx)] * n, has_else=True)
    with kb.at(ir.InsertionPoint(branch.then_block)):
        ev.bypass = att.causal_selects
        try:
            scf.YieldOp(scores())
        finally:
            ev.bypass = {}
    with kb.at(ir.InsertionPoint(branch.else_block)):
        scf.YieldOp(scores())
    return list(branch.results)


def at(kb: KernelBuilder, att: Attention, exprs: Index, roles: dict[str, ir.AffineExpr],
       batch: list[ir.AffineExpr]) -> Index:
    """``exprs`` (over attention dims) at kernel indices: ``roles`` gives ``m``, ``n``
    (value column), ``k`` (key) and ``head`` (head dim) as expressions over ``kb.dims``;
    ``batch`` the batch loops of P·V in order. Missing roles are 0."""
    zero = ir.AffineConstantExpr.get(0, kb.ctx)
    subst = [zero] * att.n_dims
    for pos, e in zip(att.pv.batch, batch):
        subst[pos] = e
    for role, pos in (("m", att.pv.m), ("n", att.pv.n), ("k", att.pv.k), ("head", att.head)):
        if role in roles:
            subst[pos] = roles[role]
    return substitute(exprs, subst, len(kb.dims), kb.ctx)


def to_f32(kb: KernelBuilder, x: ir.Value) -> ir.Value:
    """``x`` widened to f32 (f16/bf16), or ``x`` itself."""
    f32 = ir.F32Type.get(kb.ctx)
    if x.type == f32:
        return x
    with kb.emitting():
        return arith.extf(f32, x)


def from_f32(kb: KernelBuilder, x: ir.Value, t: ir.Type) -> ir.Value:
    """f32 ``x`` rounded to ``t`` (f16/bf16), or ``x`` itself."""
    if x.type == t:
        return x
    with kb.emitting():
        return arith.truncf(t, x)


def elem_type(v: ir.Value) -> ir.Type:
    return ir.ShapedType(v.type).element_type


# ----- scalar (or vector) arithmetic of the online softmax, shared by both kernels -------


def binary(kb: KernelBuilder, name: str, a: ir.Value, b: ir.Value, contract: bool = False) -> ir.Value:
    """``name`` (an arith op) on ``a`` and ``b``; ``contract`` lets LLVM form FMAs."""
    attrs = {}
    if contract:
        attrs["fastmath"] = ir.Attribute.parse("#arith.fastmath<contract>", kb.ctx)
    return kb.create(name, [a.type], [a, b], attrs).results[0]


def fma(kb: KernelBuilder, acc: ir.Value, a: ir.Value, b: ir.Value, contract: bool = True) -> ir.Value:
    """``acc + a * b`` (contracted into one FMA unless ``contract`` is off: the CPU code
    rounds the product, so the JIT and a bundle's generic x86-64 library agree bit for bit)."""
    return binary(kb, "arith.addf", acc, binary(kb, "arith.mulf", a, b, contract), contract)


def select(kb: KernelBuilder, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    with kb.emitting():
        return arith.select(cond, a, b)


def exp(kb: KernelBuilder, x: ir.Value) -> ir.Value:
    return kb.create("math.exp", [x.type], [x]).results[0]


def rescale(kb: KernelBuilder, m_old: ir.Value, m_tile: ir.Value, neg_inf: ir.Value,
            zero: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The online softmax's step for one row: ``(m_new, m_use, alpha)`` with ``m_new``
    the running max after this tile, ``m_use`` the max the exponentials subtract (0 while
    every score of the row is -inf, so nothing becomes NaN) and ``alpha = exp(m_old -
    m_use)``, the factor the sum and the accumulators are rescaled by."""
    m_new = binary(kb, "arith.maximumf", m_old, m_tile)
    with kb.emitting():
        dead = arith.cmpf(arith.CmpFPredicate.OEQ, m_new, neg_inf)
    m_use = select(kb, dead, zero, m_new)
    return m_new, m_use, exp(kb, binary(kb, "arith.subf", m_old, m_use))


def reciprocal_or_zero(kb: KernelBuilder, l: ir.Value, zero: ir.Value) -> ir.Value:
    """``1 / l``, or 0 when ``l`` is 0 (a row whose keys are all masked: O is 0, as in
    PyTorch's SDPA)."""
    with kb.emitting():
        live = arith.cmpf(arith.CmpFPredicate.OGT, l, zero)
    return select(kb, live, binary(kb, "arith.divf", kb.const(l.type, 1.0), l), zero)
