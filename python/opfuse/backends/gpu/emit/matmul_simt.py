"""SIMT matmul kernels: a shared-memory tiled FFMA contraction with the epilogue in
registers (the fall-back of :mod:`~opfuse.backends.gpu.emit.matmul`, and the f32 default).

The group's contraction (:class:`~opfuse.backends.gpu.emit.matmul.Contraction`) gets a
``16 x 16`` thread block covering a ``16·TM x 16·TN`` tile of C; each thread accumulates a
``TM x TN`` tile in registers (``TM = 4`` rows, or 8: see ``TILE_M_CHOICES``; ``TN = 4``
columns as one vector when N allows it) and ``grid.z`` runs over the batch.

The K loop walks slabs of ``BK = 16``: the block stages the A slab (``16·TM x BK``) and
the B slab (``BK x 16·TN``) in shared memory, synchronizes, runs ``BK`` rank-1 updates
from shared memory, and synchronizes again so the next slab's stores wait for this slab's
reads. Staging reads the operands through the evaluator, so producers fused into the group
(transposes, head splits, reshapes, elementwise prologues) are computed once per element
and block, not once per thread that uses it. Staging loads follow the operand's layout:
the evaluator's address probe tells whether the operand's bytes run along K or along M/N,
and consecutive threads take consecutive addresses along that loop, as 16-byte vectors
where the sizes allow (``X @ W`` reads W's rows along N; ``Q @ Kᵀ`` reads K's rows along
K instead of gathering columns). Slabs are stored K-major (``[BK][tile + PAD]``), so a
thread reads its TM rows of A and its TN columns of B as vectors at each step.

After the loop the accumulators are the contraction's values at the thread's points, and
every output of the group (bias, GELU, residual: the epilogue) is evaluated from them and
stored once. Tails: partial tiles clamp the rows and columns a thread reads (all loads
stay in bounds) and mask its stores; a partial K slab stages zeros past K.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

from mlir import ir
from mlir.dialects import arith, gpu, memref, vector

from .... import config
from ....errors import OpfuseError
from ..build.evaluate import Evaluator, Val, compose, maps_of
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, Shared, delinearize, element_bytes, vector_width
from ..build.lanes import Kind, analyze
from .matmul import Contraction, store_outputs, store_side_outputs

THREADS = (16, 16)
#: Rows of C per thread (the block tile is 16x that): 4, or 8 through
#: ``$OPFUSE_MATMUL_ROWS`` (a 128-row tile: twice the reuse of every staged B element, more
#: registers). A tuning knob until a GPU measures which wins (tools/gpu/gpu-check runs both).
TILE_M_CHOICES = (4, 8)
TILE_N = 4
SLAB_K = 16
#: Elements added to each shared-memory row: staging stores along K hit two banks per
#: address instead of four, and rows stay 16-byte aligned for the vector reads.
PAD = 4
#: Elements per staging vector (16 bytes of f32); fewer when sizes or layout forbid.
STAGE_LANES = 4


def rows_per_thread() -> int:
    """TILE_M: ``$OPFUSE_MATMUL_ROWS`` if set, else 4."""
    value = config.MATMUL_ROWS.get()
    if value is None:
        return TILE_M_CHOICES[0]
    if not value.strip().isdigit() or int(value) not in TILE_M_CHOICES:
        raise OpfuseError(
            f"OPFUSE_MATMUL_ROWS={value!r}: expected one of {', '.join(map(str, TILE_M_CHOICES))}"
        )
    return int(value)


def emit_simt(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    c = Contraction.of(group)
    shape = TileShape.of([c])
    grid = (-(-c.N // shape.bn), -(-c.M // shape.bm), c.n_batch)
    require(grid[2] <= 65535 and grid[1] <= 65535, "too many tiles")
    kb = KernelBuilder(module, name, group.params, grid, (THREADS[0], THREADS[1], 1),
                       shape.shared([c]))
    tile = SimtTile(kb, group, c, shape, [kb.add_dim(v) for v in kb.block_id])
    tile.store([(c, tile.mainloop(c))])
    store_side_outputs(kb, group, c.sides)
    kb.vector_lanes = shape.lanes
    kb.meta.update(tile=[shape.bm, shape.bn, shape.bk], problem=[c.n_batch, c.M, c.N, c.K],
                   operands=str(c.a_type))  # after what the epilogue recorded
    return kb


@dataclass(frozen=True)
class TileShape:
    """A block's tile: ``tm`` rows and ``lanes`` columns per thread, ``bm x bn`` per block,
    K slabs of ``bk``."""

    tm: int
    lanes: int
    bk: int

    @property
    def bm(self) -> int:
        return THREADS[1] * self.tm

    @property
    def bn(self) -> int:
        return THREADS[0] * self.lanes

    @classmethod
    def of(cls, cs: list[Contraction]) -> "TileShape":
        """The tile for contractions ``cs`` (one, or siblings over one A: the horizontal
        kernel's); vectors of TILE_N columns when every N allows them."""
        lanes = TILE_N if all(c.N % TILE_N == 0 for c in cs) else 1
        return cls(rows_per_thread(), lanes, min(SLAB_K, min(c.K for c in cs)))

    def shared(self, cs: list[Contraction]) -> list[Shared]:
        """The A and B slabs (one pair of buffers, reused by each contraction in turn)."""
        require(len({str(c.a_type) for c in cs}) == 1 and len({str(c.b_type) for c in cs}) == 1,
                "sibling contractions with different operand types")
        return [Shared(self.bk * (self.bm + PAD), str(cs[0].a_type)),
                Shared(self.bk * (self.bn + PAD), str(cs[0].b_type))]


class SimtTile:
    """One block's ``bm x bn`` tile of C: its threads' rows and columns, the K loop of a
    contraction (:meth:`mainloop`, run once per contraction that shares the tile) and the
    epilogue that stores the group's outputs from the accumulators (:meth:`store`).

    ``block`` is the tile's (x, y, z) block index as affine dims: the block id, or (the
    horizontal kernel) the block id less the first block of this tile's N range.
    """

    def __init__(self, kb: KernelBuilder, group: Group, c: Contraction, shape: TileShape,
                 block: list):
        self.kb, self.group, self.c, self.shape = kb, group, c, shape
        tm, lanes = shape.tm, shape.lanes
        bm, bn = shape.bm, shape.bn
        M, N = c.M, c.N
        self.leaves = group.leaves(kb.params)
        self.ev = Evaluator(kb, group.func, self.leaves, lanes=lanes)
        bx, by, bz = block
        self.bx, self.by = bx, by
        tx, ty = kb.add_dim(kb.thread_id[0]), kb.add_dim(kb.thread_id[1])
        self.tx, self.ty = tx, ty
        # columns: one vector of `lanes` per thread, clamped so partial tiles read in bounds
        col = kb.apply(bx * bn + tx * lanes)
        self.col_ok = None
        if N % bn:
            self.col_ok = kb.cmp_lt(col, kb.index(N))
            col = kb.min_index(col, kb.index(N - lanes))
        self.n_expr = kb.add_dim(col)
        if lanes > 1:
            self.ev.vdim = frozenset([self.n_expr.position])
        self.rows, self.row_ok = [], []
        for i in range(tm):
            r = kb.apply(by * bm + ty * tm + i)
            ok = None
            if M % bm:
                ok = kb.cmp_lt(r, kb.index(M))
                r = kb.min_index(r, kb.index(M - 1))
            self.rows.append(kb.add_dim(r))
            self.row_ok.append(ok)
        self.batch = delinearize(bz, c.batch_shape) if c.loops.batch else []
        self.zero = ir.AffineConstantExpr.get(0, kb.ctx)
        self.tid = tx + ty * THREADS[0]

    def c_points(self, c: Contraction) -> list:
        return [c.operand_index(2, c.point(self.batch, r, self.n_expr, self.zero, self.kb.ctx),
                                self.kb) for r in self.rows]

    def mainloop(self, c: Contraction) -> list:
        """The accumulators of ``c`` (M, N, K and batch as the tile's) at the thread's
        points, after the K loop over shared-memory slabs."""
        kb, ev, shape = self.kb, self.ev, self.shape
        op = c.op
        tm, lanes, bm, bn, bk = shape.tm, shape.lanes, shape.bm, shape.bn, shape.bk
        K = c.K
        a_type, b_type = c.a_type, c.b_type
        a_smem, b_smem = kb.shared
        lda, ldb = bm + PAD, bn + PAD
        rows, n_expr, zero, batch = self.rows, self.n_expr, self.zero, self.batch
        tx, ty = self.tx, self.ty

        def point(m_expr, n_e, k_expr) -> list:
            return c.point(batch, m_expr, n_e, k_expr, kb.ctx)

        inits = [ev.value(op.operands[2], p) for p in self.c_points(c)]
        init_ssa = [ev.as_vector(v) for v in inits]
        slabs = [
            _Slab(0, a_smem, lda, bm, c.M, self.by * bm, lambda g, k: point(g, zero, k)),
            _Slab(1, b_smem, ldb, bn, c.N, self.bx * bn, lambda g, k: point(zero, g, k)),
        ]

        def body(iv, accs):
            k0 = kb.add_dim(iv)
            for slab in slabs:
                _stage(kb, self.group, self.leaves, op, slab, self.tid, k0, bk, K)
            with kb.emitting():
                gpu.barrier()
            accs = [Val(a, lanes == 1) for a in accs]
            a_vt = ir.VectorType.get([tm], a_type)
            ev.contract = True
            for kk in range(bk):
                k_expr = k0 + kk if kk else k0
                a_addr = kb.apply(ty * tm + kk * lda)
                b_addr = kb.apply(tx * lanes + kk * ldb)
                with kb.emitting():
                    a_vec = vector.load(
                        a_vt, a_smem, [a_addr], alignment=min(16, element_bytes(a_type) * tm)
                    )
                    a_vals = [vector.extract(a_vec, [], [i]) for i in range(tm)]
                    if lanes > 1:
                        b_vt = ir.VectorType.get([lanes], b_type)
                        b_val = Val(
                            vector.load(b_vt, b_smem, [b_addr],
                                        alignment=element_bytes(b_type) * lanes),
                            False,
                        )
                    else:
                        b_val = Val(memref.load(b_smem, [b_addr]), True)
                for i in range(tm):
                    p = point(rows[i], n_expr, k_expr)
                    ev.preset(op.operands[0], c.operand_index(0, p, kb), Val(a_vals[i], True))
                    ev.preset(op.operands[1], c.operand_index(1, p, kb), b_val)
                    res = ev.payload(op, p, [accs[i]])[0]
                    accs[i] = Val(ev.as_vector(res), lanes == 1)
            ev.contract = False
            with kb.emitting():
                gpu.barrier()
            return [a.ssa for a in accs]

        return kb.for_(kb.index(0), kb.index(K), kb.index(bk), init_ssa, body)

    def store(self, finals: list[tuple[Contraction, list]]) -> None:
        """Every output of the group from the accumulators: ``finals`` pairs each
        contraction the tile ran with its :meth:`mainloop` result (an epilogue may read
        several: SwiGLU's ``silu(x @ W1) * (x @ W3)``)."""
        lanes = self.shape.lanes
        for c, accs in finals:
            for p, acc in zip(self.c_points(c), accs):
                self.ev.preset(c.op.results[0], p, Val(acc, lanes == 1))
        first = finals[0][0]
        for i, p in enumerate(self.c_points(first)):
            store_outputs(self.kb, self.ev, self.group, first, p,
                          self.kb.and_(self.row_ok[i], self.col_ok))


@dataclass(frozen=True)
class _Slab:
    """One operand's slab in shared memory: ``[BK][ld]``, K-major.

    Attributes:
        operand: 0 (A) or 1 (B).
        smem: the workgroup buffer.
        ld: elements per shared row (the tile extent plus PAD).
        extent: tile extent along the operand's other loop (M for A, N for B).
        size: the other loop's full size.
        base: the tile's first index along the other loop (an affine expression).
        point: (other index, k index) -> contraction loop point.
    """

    operand: int
    smem: ir.Value
    ld: int
    extent: int
    size: int
    base: ir.AffineExpr
    point: Callable[[ir.AffineExpr, ir.AffineExpr], list]


def _stage(kb, group, leaves, op, slab: _Slab, tid, k0, bk: int, K: int) -> None:
    """Every thread copies its share of the slab from the operand (through the evaluator)
    into shared memory, consecutive threads along the operand's consecutive addresses."""
    along_k, lanes = _staging_layout(kb, group, leaves, op, slab, bk, K)
    value = op.operands[slab.operand]
    elem = ir.ShapedType(value.type).element_type
    n_threads = THREADS[0] * THREADS[1]
    slots = slab.extent * bk // lanes
    per_row = (bk if along_k else slab.extent) // lanes
    k_tail = K % bk != 0
    for first in range(0, slots, n_threads):
        s = tid + first if first else tid
        with kb.at(kb.ip):  # a scope per pass: its index variables and values stay in it
            guard = None
            if first + n_threads > slots:
                guard = kb.cmp_lt(kb.apply(s), kb.index(slots))
            with kb.if_(guard) if guard is not None else contextlib.nullcontext():
                row = ir.AffineExpr.get_floor_div(s, per_row)
                lane0 = ir.AffineExpr.get_mod(s, per_row) * lanes
                other, kofs = (row, lane0) if along_k else (lane0, row)
                g_other = kb.apply(slab.base + other)
                if slab.size % slab.extent:
                    g_other = kb.min_index(g_other, kb.index(slab.size - (1 if along_k else lanes)))
                g_k = kb.apply(k0 + kofs)
                k_ok = kb.cmp_lt(g_k, kb.index(K)) if k_tail else None
                if k_tail:
                    g_k = kb.min_index(g_k, kb.index(K - (lanes if along_k else 1)))
                o_dim, k_dim = kb.add_dim(g_other), kb.add_dim(g_k)
                vdim = k_dim if along_k else o_dim
                ev = Evaluator(kb, group.func, leaves, lanes=lanes, vdim=vdim.position)
                idx = compose(
                    maps_of(op)[slab.operand], slab.point(o_dim, k_dim), len(kb.dims), kb.ctx
                )
                val = ev.value(value, idx)
                x = ev.as_vector(val)
                if k_ok is not None:
                    zero = kb.const(x.type, 0)
                    with kb.emitting():
                        x = arith.select(k_ok, x, zero)
                base = kb.apply(kofs * slab.ld + other)
                with kb.emitting():
                    if lanes == 1:
                        memref.store(x, slab.smem, [base])
                    elif not along_k:
                        vector.store(x, slab.smem, [base], alignment=element_bytes(elem) * lanes)
                    else:
                        for j in range(lanes):
                            addr = kb.apply((kofs + j) * slab.ld + other)
                            memref.store(vector.extract(x, [], [j]), slab.smem, [addr])


def _staging_layout(kb, group, leaves, op, slab: _Slab, bk: int, K: int) -> tuple[bool, int]:
    """(along K?, lanes): the loop whose consecutive indices are consecutive addresses in
    the operand's buffers (from the evaluator's address probe), and the vector width
    the sizes allow along it (no vector may straddle the end of its loop)."""
    n = len(kb.dims)
    o_probe = ir.AffineDimExpr.get(n, kb.ctx)
    k_probe = ir.AffineDimExpr.get(n + 1, kb.ctx)
    probe = Evaluator(kb, group.func, leaves)
    idx = compose(maps_of(op)[slab.operand], slab.point(o_probe, k_probe), n + 2, kb.ctx)
    addrs = probe.addresses(op.operands[slab.operand], idx, n + 2) or []

    def contiguous(d: int) -> int:
        return sum(analyze(a, frozenset([d]), STAGE_LANES).kind == Kind.CONTIG for a in addrs)

    along_k = contiguous(n + 1) > contiguous(n)
    elem = ir.ShapedType(op.operands[slab.operand].type).element_type
    inner, whole = (bk, K) if along_k else (slab.extent, slab.size)
    return along_k, min(STAGE_LANES, vector_width(elem, math.gcd(inner, whole)))


__all__ = ["SimtTile", "TILE_M_CHOICES", "TileShape", "emit_simt", "rows_per_thread"]
