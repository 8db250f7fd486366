"""Matmul kernels ("output" groups): what both variants share.

An output group is one contraction (``linalg.matmul`` / ``batch_matmul`` generalized, or
any generic whose payload is ``acc + a * b`` with one M, one N, one K loop and any batch
loops) and its epilogue (bias, activation, residual: elementwise consumers, possibly
stored transposed). Two emitters build it:

* :mod:`~opfuse.backends.gpu.emit.matmul_mma` ("mma"): tensor cores (``mma.sync`` through
  :mod:`~opfuse.backends.gpu.build.mma`), a ``cp.async`` multi-stage pipeline, the epilogue on the
  accumulator fragments. For f16 and bf16 operands, and f32 ones with ``allow_tf32``.
* :mod:`~opfuse.backends.gpu.emit.matmul_simt` ("matmul"): the FFMA kernel, shared-memory tiled;
  the fall-back, and the f32 default.

Which one is the user's choice (``matmul=`` / ``$OPFUSE_MATMUL``, per kernel:
:mod:`~opfuse.backends.options`); by default tensor cores wherever they apply.

This module: :class:`Contraction` (the group's contraction, its loops by role, how each
output sits on C) and :func:`store_outputs` (evaluate and store every output of the group
at one point of C, given the accumulators there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from mlir import ir

from ....errors import OpfuseError  # noqa: F401  (re-exported for the emitters' messages)
from ..build.evaluate import (
    Evaluator,
    Leaf,
    compose,
    generic_domain,
    iterators_of,
    linearize,
    maps_of,
    n_inputs,
)
from ..build.evaluate import op_of
from ..build.evaluate_movement import _depends, pull
from ..build.group import Group, computed_from, require
from ..build.kernel import KernelBuilder, delinearize, numel, shape_of
from .column_sums import ColumnSum, add_at, column_sum, is_column_sum


@dataclass(frozen=True)
class Loops:
    """The contraction's loops by role (positions in its iteration domain)."""

    batch: list[int]
    m: int
    n: int
    k: int
    dom: list[int]


@dataclass
class Contraction:
    """The one contraction of an output group.

    Attributes:
        op: the ``linalg.generic`` (A x B -> C).
        loops: its loops by role.
        M, N, K: the loop sizes; ``batch_shape``: sizes of the batch loops.
        a_type, b_type, c_type: element types of A, B and the accumulator C.
        placements: per output index of the group, where the output sits on C
            (:class:`Placement`: C transposed, or reshaped along M, N or batch dims).
        sums: per output index, a column sum over C's M rows (opfuse-fuse-column-sums:
            a bias gradient of the dY this matmul computes), added atomically by
            :func:`store_outputs`.
    """

    op: ir.Operation
    loops: Loops
    M: int
    N: int
    K: int
    batch_shape: list[int]
    a_type: ir.Type
    b_type: ir.Type
    c_type: ir.Type
    placements: dict[int, "Placement"]
    sums: dict[int, ColumnSum] = field(default_factory=dict)
    sides: list = field(default_factory=list)

    @property
    def c_shape(self) -> list[int]:
        return list(shape_of(self.op.results[0].type))

    @property
    def n_batch(self) -> int:
        return numel(self.batch_shape)

    @classmethod
    def of(cls, group: Group, siblings: Sequence[ir.Operation] | None = None) -> "Contraction":
        """The group's contraction and where its outputs sit on C. An output that reads
        no contraction is a side output; ``siblings``: the contractions computed in the
        same tile (a horizontal pair's, whose C has this one's shape and layout): an
        output on a sibling's C sits at the same index (the horizontal ranges give
        these, and write no side outputs)."""
        op = _contraction(group)
        loops = _loops(op)
        dom = loops.dom
        c_shape = shape_of(op.results[0].type)
        placements, sums, sides = {}, {}, []
        for o in group.outputs:
            if siblings is None and op not in computed_from(o.value, set(group.ops())):
                sides.append(o)  # written by every thread after the tiles: store_side_outputs
                continue
            owner = op_of(o.value)
            if owner is not None and owner.name == "linalg.generic" and is_column_sum(owner):
                require(not loops.batch and list(c_shape) == [dom[loops.m], dom[loops.n]],
                        "a column sum of a batched or transposed matmul result")
                sums[o.index] = column_sum(owner, dom[loops.m], (dom[loops.n],))
                continue
            place = Placement.of(o.value, op.results[0])
            for other in siblings or ():
                place = place or Placement.of(o.value, other.results[0])
            require(
                place is not None,
                f"an output of shape {o.shape} that is neither a permutation of the "
                f"contraction's {c_shape} nor a reshape of its M, N or batch dims",
            )
            placements[o.index] = place
        return cls(
            op,
            loops,
            dom[loops.m],
            dom[loops.n],
            dom[loops.k],
            [dom[b] for b in loops.batch],
            ir.ShapedType(op.operands[0].type).element_type,
            ir.ShapedType(op.operands[1].type).element_type,
            ir.ShapedType(op.operands[2].type).element_type,
            placements,
            sums,
            sides,
        )

    def point(self, batch: list, m, n, k, ctx: ir.Context) -> list:
        """The contraction's loop point for batch indices ``batch`` and ``m``, ``n``, ``k``
        (affine expressions)."""
        zero = ir.AffineConstantExpr.get(0, ctx)
        p: list = [zero] * len(self.loops.dom)
        for b, e in zip(self.loops.batch, batch):
            p[b] = e
        p[self.loops.m], p[self.loops.n], p[self.loops.k] = m, n, k
        return p

    def operand_index(self, j: int, point: list, kb: KernelBuilder) -> tuple:
        """Index of operand ``j`` (0: A, 1: B, 2: C) read at loop point ``point``."""
        return compose(maps_of(self.op)[j], point, len(kb.dims), kb.ctx)

    def payload_is_mul_add(self) -> bool:
        """The payload is ``acc + ext(a) * ext(b)`` (``ext``: nothing or ``arith.extf``):
        the product tensor cores compute (exact products, f32 sums)."""
        block = self.op.regions[0].blocks[0]
        a_arg, b_arg, out = block.arguments
        ops = [o.operation for o in block.operations]
        ext = {}
        for o in ops[:-1]:
            if o.name == "arith.extf" and o.operands[0] in (a_arg, b_arg):
                ext[o.results[0]] = o.operands[0]
            elif o.name not in ("arith.mulf", "arith.addf"):
                return False
        muls = [o for o in ops if o.name == "arith.mulf"]
        adds = [o for o in ops if o.name == "arith.addf"]
        if len(muls) != 1 or len(adds) != 1 or ops[-1].operands[0] != adds[0].results[0]:
            return False
        factors = {ext.get(v, v) for v in muls[0].operands}
        terms = set(adds[0].operands)
        return factors == {a_arg, b_arg} and terms == {out, muls[0].results[0]}


def store_outputs(
    kb: KernelBuilder,
    ev: Evaluator,
    group: Group,
    c: Contraction,
    c_idx: tuple,
    pred: ir.Value | None,
) -> None:
    """Evaluate every output of ``group`` at C's index ``c_idx`` (the accumulators there
    are preset in ``ev``) and store it, under ``pred`` (None: always); a column sum's
    element is added into it (:func:`_add_to_sum`)."""
    for o in group.outputs:
        if o.index in c.sums:
            _add_to_sum(kb, ev, group, c, c.sums[o.index], o, c_idx, pred)
            continue
        if o.index not in c.placements:
            continue  # a side output: store_side_outputs
        leaf = group.output_leaf(o, group.result_param(kb.params, o.index))
        place = c.placements[o.index]
        at = place.index(c_idx, c.c_shape, kb.ctx)  # the output's index of this point
        if not place.permutation:
            _alias_accumulators(kb, ev, group, o.value, at, c_idx)
        val = ev.value(o.value, at)
        if place.row_major:  # C's layout: store at C's index (no div/mod in the address)
            leaf, at = Leaf(leaf.mem, tuple(c.c_shape), leaf.element_type), tuple(c_idx)
        if pred is None:
            ev.store(leaf, at, val)
        else:
            with kb.if_(pred):
                ev.store(leaf, at, val)


def store_side_outputs(kb: KernelBuilder, group: Group, sides: list) -> None:
    """The outputs that read no contraction (a view of an operand that the group also
    computes: the transposed Q and K a training forward saves for its backward), written
    after the tiles: every thread of the launch takes a strided share of their elements,
    evaluated from the kernel's inputs (they need nothing the tiles computed). Called by
    the emitters at the launch's top level."""
    if not sides:
        return
    ev = Evaluator(kb, group.func, group.leaves(kb.params), sequential=True)
    (gx, gy, gz), (bx, by, bz) = kb.grid, kb.block
    b = [kb.add_dim(v) for v in kb.block_id]
    t = [kb.add_dim(v) for v in kb.thread_id]
    threads = bx * by * bz
    start = kb.apply((b[0] + gx * (b[1] + gy * b[2])) * threads + t[0] + bx * (t[1] + by * t[2]))
    stride = kb.index(gx * gy * gz * threads)
    for o in sides:
        leaf = group.output_leaf(o, group.result_param(kb.params, o.index))

        def body(iv, _, o=o, leaf=leaf):
            idx = delinearize(kb.add_dim(iv), o.shape) if o.shape else []
            ev.store(leaf, tuple(idx), ev.value(o.value, idx))
            return []

        kb.for_(start, kb.index(numel(o.shape)), stride, [], body)


def _add_to_sum(kb: KernelBuilder, ev: Evaluator, group: Group, c: Contraction,
                cs: ColumnSum, out, c_idx: tuple, pred: ir.Value | None) -> None:
    """Add the element of column sum ``cs`` at C's point ``c_idx = (m, n)`` into output
    ``out`` (zeroed by the runtime before the launch: ``KernelSpec.zeroed``)."""
    m, n = c_idx
    point = tuple(delinearize(m, cs.rows)) + (n,)
    for j in range(n_inputs(cs.op)):  # what the sum reads at the point, seen from C
        at = compose(maps_of(cs.op)[j], list(point), len(kb.dims), kb.ctx)
        _alias_accumulators(kb, ev, group, cs.op.operands[j], at, c_idx)
    add_at(kb, ev, group, cs, out, point, cs.at(point), pred)
    # per output: a grouped kernel's ranges each add their own sums
    adds = kb.meta.setdefault("sum_adds", {})
    adds.update({str(o): c.M * c.N for o in c.sums})
    kb.meta["zeroed"] = sorted(int(o) for o in adds)
    kb.meta["atomics"] = sum(adds.values())


def _alias_accumulators(kb: KernelBuilder, ev: Evaluator, group: Group, v: ir.Value,
                        at: tuple, c_idx: tuple) -> None:
    """Make the accumulators preset at C's index ``c_idx`` visible where evaluating
    output ``v`` at ``at`` will look for them. Through a reshape that index is
    ``linearize(delinearize(row))``, which MLIR does not simplify back to ``row``: each
    contraction result preset at ``c_idx`` is preset again, with the same value, at the
    index the evaluator pulls from ``at`` (a SwiGLU epilogue reads two)."""
    for op in group.ops():
        if op.name != "linalg.generic" or "reduction" not in iterators_of(op):
            continue
        r = op.results[0]
        val = kb.memo_get(("v", r, ev.canonical(r, c_idx)))
        if val is None:
            continue
        pulled = pull(v, r, at, len(kb.dims), kb.ctx)
        if pulled is not None:
            ev.preset(r, pulled, val)


def _contraction(group: Group) -> ir.Operation:
    reds = [
        op for op in group.ops() if op.name == "linalg.generic" and "reduction" in iterators_of(op)
        and not is_column_sum(op)  # a column sum of the result: Contraction.sums
    ]
    require(len(reds) == 1, "not exactly one contraction")
    op = reds[0]
    require(n_inputs(op) == 2 and len(op.results) == 1, "a contraction that is not A x B -> C")
    block = op.regions[0].blocks[0]
    out_arg = block.arguments[2]
    yielded = [o.operation for o in block.operations][-1].operands[0]
    add = yielded.owner
    add = add.operation if hasattr(add, "operation") else add
    require(
        not isinstance(add, ir.Block)
        and add.name in ("arith.addf", "arith.addi")
        and out_arg in list(add.operands),
        "a contraction payload that is not acc + a*b",
    )
    require(
        not any(o.operation.name == "linalg.index" for o in block.operations),
        "a contraction payload that reads its loop indices",
    )
    return op


def _loops(op: ir.Operation) -> Loops:
    its = iterators_of(op)
    uses = []
    for m in maps_of(op):
        dims = [r.maybe_downcast() for r in m.results]
        require(all(isinstance(d, ir.AffineDimExpr) for d in dims), "non-projected indexing")
        uses.append({d.position for d in dims})
    a_dims, b_dims, c_dims = uses
    batch, m_dims, n_dims, k_dims = [], [], [], []
    for loop, it in enumerate(its):
        where = (loop in a_dims, loop in b_dims, loop in c_dims)
        if where == (True, True, True) and it == "parallel":
            batch.append(loop)
        elif where == (True, False, True) and it == "parallel":
            m_dims.append(loop)
        elif where == (False, True, True) and it == "parallel":
            n_dims.append(loop)
        elif where == (True, True, False) and it == "reduction":
            k_dims.append(loop)
        else:
            require(False, "a contraction loop of unknown role")
    require(
        len(m_dims) == 1 and len(n_dims) == 1 and len(k_dims) == 1,
        "a contraction without exactly one M, N and K loop",
    )
    return Loops(batch, m_dims[0], n_dims[0], k_dims[0], generic_domain(op))


@dataclass(frozen=True)
class Block:
    """Dims of an output and dims of C that hold the same elements in the same row-major
    order: one of each (a permutation), several output dims and one of C (C's dim split,
    e.g. M = B*S into B, S, listed major to minor), or one output dim and several of C
    (merged)."""

    out_dims: tuple[int, ...]
    c_dims: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where one output of an output group sits on C: its dims in blocks of C's dims.

    Attributes:
        blocks: the output's dims of size > 1 by block (a size-1 dim's index is 0).
        shape: the output's shape.
        permutation: every block is one dim to one dim (C, or C transposed: the index is
            C's index permuted, so the evaluator finds the accumulators as they are).
        row_major: the output has C's layout (blocks in C's dim order, splits and merges
            in order): it can be stored at C's index.
    """

    blocks: tuple[Block, ...]
    shape: tuple[int, ...]
    permutation: bool
    row_major: bool

    @classmethod
    def of(cls, v: ir.Value, c: ir.Value) -> "Placement | None":
        """``v``'s placement, when ``v`` is C seen through elementwise ops, transposes and
        reshapes that split or merge C's dims; None otherwise. Followed through the
        first operand that reaches C: if another path reads C elsewhere, the evaluator
        misses the accumulators and the emitter gives up (Unsupported), so a wrong guess
        cannot produce a wrong kernel."""
        shape, c_shape = tuple(shape_of(v.type)), tuple(shape_of(c.type))
        perm = _permutation(v, c, len(c_shape))
        if perm is not None:
            blocks = tuple(Block((i,), (k,)) for i, k in enumerate(perm))
            return cls(blocks, shape, True, perm == list(range(len(c_shape))))
        blocks = _reshape_blocks(v, c, shape, c_shape)
        if blocks is None:
            return None
        order = [b.c_dims for b in blocks]
        flat_c = [j for b in order for j in b]
        flat_o = [i for b in blocks for i in b.out_dims]
        row_major = flat_c == sorted(flat_c) and flat_o == sorted(flat_o)
        return cls(blocks, shape, False, row_major)

    def index(self, c_idx: tuple, c_shape: list[int], ctx: ir.Context) -> tuple:
        """The output's index at C's index ``c_idx``."""
        at = [ir.AffineConstantExpr.get(0, ctx)] * len(self.shape)
        for b in self.blocks:
            flat = linearize([c_idx[j] for j in b.c_dims], [c_shape[j] for j in b.c_dims])
            for i, e in zip(b.out_dims, delinearize(flat, [self.shape[i] for i in b.out_dims])):
                at[i] = e
        return tuple(at)


def _permutation(v: ir.Value, c: ir.Value, rank: int) -> list[int] | None:
    """For output ``v`` of the group: which dim of C each of ``v``'s dims is, when ``v`` is
    C seen through elementwise ops and transposes (``v[i0, i1] = f(C[i1, i0])`` gives
    ``[1, 0]``); None otherwise."""
    ctx = c.context
    dims = [ir.AffineDimExpr.get(i, ctx) for i in range(len(shape_of(v.type)))]
    # (unit dims kept as they are: the kernels index C's size-1 dims with their own dims)
    pulled = pull(v, c, tuple(dims), len(dims), ctx, unit_dims_at_zero=False)
    if pulled is None or len(pulled) != rank or len(dims) != rank:
        return None
    where = {}
    for k, e in enumerate(pulled):
        e = e.maybe_downcast()
        if not isinstance(e, ir.AffineDimExpr) or e.position in where:
            return None
        where[e.position] = k
    return [where[d] for d in range(rank)]


def _reshape_blocks(v: ir.Value, c: ir.Value, shape: tuple, c_shape: tuple
                    ) -> tuple[Block, ...] | None:
    """``v``'s dims and C's (size-1 dims left out) in blocks, when reading ``v`` at ``q``
    reads C at an index whose every dim is either a row-major linear form of some of
    ``q``'s dims (a split: ``C[q0*S + q1, q2]``) or one dim's row-major digit (a merge:
    ``C[q0 floordiv F, q0 mod F]``); None otherwise."""
    ctx = c.context
    n = len(shape)
    q = [ir.AffineDimExpr.get(i, ctx) for i in range(n)]
    pulled = pull(v, c, tuple(q), n, ctx)
    if pulled is None or len(pulled) != len(c_shape):
        return None
    deps = {}
    for j, e in enumerate(pulled):
        if c_shape[j] == 1:
            continue
        deps[j] = [i for i in range(n) if shape[i] != 1 and _depends(e, i, n, ctx)]
        if not deps[j]:
            return None
    blocks: list[Block] = []
    claimed: set[int] = set()
    for j in sorted(deps):
        if j in (c for b in blocks for c in b.c_dims):
            continue
        outs = deps[j]
        if len(outs) == 1:  # one output dim: it may be made of several C dims (a merge)
            js = [k for k in sorted(deps) if deps[k] == outs]
            sizes = [c_shape[k] for k in js]
            if numel(sizes) != shape[outs[0]]:
                return None
            if len(js) > 1 and tuple(delinearize(q[outs[0]], sizes)) != tuple(
                    pulled[k] for k in js):
                return None
            if len(js) == 1 and pulled[j] != q[outs[0]]:
                return None
            block = Block(tuple(outs), tuple(js))
        else:  # several output dims of one C dim (a split), in stride order
            strides = _strides(pulled[j], outs, n, ctx)
            if strides is None:
                return None
            outs = sorted(outs, key=lambda i: -strides[i])
            sizes = [shape[i] for i in outs]
            if numel(sizes) != c_shape[j] or [strides[i] for i in outs] != [
                    numel(sizes[k + 1:]) for k in range(len(sizes))]:
                return None
            block = Block(tuple(outs), (j,))
        if claimed & set(block.out_dims):
            return None
        claimed |= set(block.out_dims)
        blocks.append(block)
    if claimed != {i for i in range(n) if shape[i] != 1}:
        return None
    return tuple(blocks)


def _strides(e: ir.AffineExpr, dims: list[int], n: int, ctx) -> dict[int, int] | None:
    """The coefficient of each of ``dims`` in ``e`` when ``e`` is exactly their linear
    combination (no constant, no other dim, no floordiv/mod); None otherwise."""
    if not _linear(e):
        return None

    def at(values: dict[int, int]) -> int | None:
        subst = [ir.AffineConstantExpr.get(values.get(k, 0), ctx) for k in range(n)]
        r = e.compose(ir.AffineMap.get(n, 0, subst, ctx)).maybe_downcast()
        return r.value if isinstance(r, ir.AffineConstantExpr) else None

    if at({}) != 0:
        return None
    return {i: at({i: 1}) for i in dims}


def _linear(e: ir.AffineExpr) -> bool:
    e = e.maybe_downcast()
    if isinstance(e, (ir.AffineDimExpr, ir.AffineConstantExpr)):
        return True
    if isinstance(e, ir.AffineAddExpr):
        return _linear(e.lhs) and _linear(e.rhs)
    if isinstance(e, ir.AffineMulExpr):
        return _linear(e.lhs) and isinstance(e.rhs.maybe_downcast(), ir.AffineConstantExpr)
    return False


def emit_matmul(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    """The SIMT (FFMA) kernel (see :mod:`~opfuse.backends.gpu.emit.matmul_simt`)."""
    from .matmul_simt import emit_simt

    return emit_simt(group, module, name)


def emit_mma(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    """The tensor-core kernel (see :mod:`~opfuse.backends.gpu.emit.matmul_mma`); raises a quiet
    Unsupported (no note) where the SIMT kernel is the choice: f32 operands without TF32,
    or ``matmul=simt`` for this kernel."""
    from .matmul_mma import emit_mma as emit

    return emit(group, module, name)


__all__ = ["Block", "Contraction", "Loops", "Placement", "emit_matmul", "emit_mma", "store_outputs"]
