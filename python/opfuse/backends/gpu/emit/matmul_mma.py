"""Tensor-core matmul kernels: ``mma.sync`` warps fed by a ``cp.async`` pipeline.

The block computes a ``bm x bn`` tile of C (:mod:`opfuse.backends.gpu.build.matmul_tiles` picks the tile per
problem size: target data), ``grid.z`` runs over the batch. Each of its warps owns a
``bm/warps_m x bn/warps_n`` piece as 16x8 accumulator tiles (:class:`opfuse.backends.gpu.build.mma.Warp`).

Main loop, over K in slabs of ``bk`` with ``S`` stages of shared memory (2 to 4):

    prologue: stage slabs 0 .. S-2 (cp.async), one commit per slab
    for kt in 0 .. KT-1:
        cp.async.wait_group S-2     # slab kt has landed (this thread's copies)
        barrier                     # ... everyone's; and everyone is done with slab kt-1
        stage slab kt+S-1 into the buffer slab kt-1 used; commit
        ldmatrix + mma over slab kt (bk/16 steps; tf32: bk/8)

One barrier per K step: the barrier that publishes slab ``kt`` also proves that slab
``kt-1``'s buffer is free, which is the one refilled next. Commits are unconditional
(empty groups past the last slab) so the wait count is the same at every step.

Staging: each operand's slab is stored in shared memory the way its bytes run in global
memory (the evaluator's address probe): along K (``[rows][bk]``, read by ``ldmatrix``) or
along M/N (``[bk][cols]``, read by ``ldmatrix.trans``), rows padded so ``ldmatrix`` is free
of bank conflicts (:func:`opfuse.backends.gpu.build.mma.padded_ld`). An operand that is a view of a kernel
parameter (transposes, reshapes, head splits: :meth:`.Evaluator.source`) is copied with
``cp.async`` in 16-byte chunks (8 or 4 bytes where the contiguous extent is not a multiple
of 8 elements; zero-filled past M, N and K by the copy's source size); any other operand
(an elementwise prologue, an extent no copy size divides) is computed by the evaluator
and stored with vector stores, at the same point of the pipeline.

Epilogue: after the loop each lane holds accumulator pairs ``D[row, col..col+1]``; the
group's outputs (bias, activation, residual, a transposed store) are evaluated from them
two columns at a time (one column when N is odd) and stored, rows past M and columns past
N masked. Tails need no other code: zero-filled slabs add nothing to the accumulators.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, gpu, memref, vector

from ..build import async_copy, mma
from ....cost import gpu_time as estimate
from ..build.evaluate import Evaluator, Val, compose, maps_of
from ..build.group import Group, NotChosen, require
from ..build.kernel import KernelBuilder, Shared, delinearize, linearize
from ..build.lanes import Kind, analyze
from .matmul import Contraction, store_outputs, store_side_outputs
from ..build.matmul_tiles import MMA_SYNC, Tiles, choose, configure

WARP = 32
#: Bytes per copy, largest first (cp.async moves 16, 8 or 4 bytes).
COPY_BYTES = (16, 8, 4)


@dataclass
class _Operand:
    """One operand's slabs in shared memory and how they are filled.

    Attributes:
        j: 0 (A) or 1 (B).
        extent: the tile's extent along the operand's other loop (bm for A, bn for B).
        size: that loop's size (M or N).
        k_major: shared rows run along K (``[extent][ld]``), else along the other loop.
        ld: elements per shared row; ``stage``: elements of one slab.
        smem: the workgroup buffer (``stages`` slabs).
        base: the tile's first index along the other loop.
    """

    j: int
    extent: int
    size: int
    k_major: bool
    ld: int
    stage: int
    smem: ir.Value | None = None
    base: ir.AffineExpr | None = None
    direct: bool | None = None  # staged with cp.async (known once staged)


def emit_mma(group: Group, module: ir.Module, name: str, cls: type | None = None) -> KernelBuilder:
    """The kernel of an output group; ``cls``: the kernel body (:class:`_Kernel`, the
    ``mma.sync`` one, or a subclass with its own tiles, slab layout and main loop:
    :mod:`.matmul_wgmma`)."""
    cls = cls or _Kernel
    opts = group.options
    if opts.matmul_mode(name) == "simt":
        raise NotChosen("matmul=simt")
    c = Contraction.of(group)
    kind = mma.kind_for(c.a_type, c.b_type, allow_tf32=opts.allow_tf32)
    if kind is None:
        if str(c.a_type) == "f32" and str(c.b_type) == "f32":
            raise NotChosen("f32 operands (TF32 not allowed)")
        require(False, f"no tensor-core kind for {c.a_type} x {c.b_type} operands")
    require(str(c.c_type) == "f32", f"a {c.c_type} accumulator (tensor cores sum in f32)")
    require(c.payload_is_mul_add(), "a contraction payload that is not acc + a * b")
    M, N, K = c.M, c.N, c.K
    a_k, b_k = (_runs_along_k(group, c, j) for j in (0, 1))
    t = choose(M, N, K, c.n_batch, kind, opts.target, a_k, b_k, cls.RULES)
    grid = (-(-N // t.bn), -(-M // t.bm), c.n_batch)
    require(grid[1] <= 65535 and grid[2] <= 65535, "too many tiles")
    ops = [cls.operand(j, extent, size, k_major, t, kind)
           for j, (extent, size, k_major) in enumerate(((t.bm, M, a_k), (t.bn, N, b_k)))]
    shared = [Shared(t.stages * o.stage, kind.element) for o in ops]
    kb = KernelBuilder(module, name, group.params, grid, (t.threads, 1, 1), shared)
    for o, smem in zip(ops, kb.shared):
        o.smem = smem
    cls(kb, group, c, kind, t, ops).build()
    store_side_outputs(kb, group, c.sides)
    kb.vector_lanes = 2 if N % 2 == 0 else 1
    kb.meta = {
        **kb.meta,  # what the epilogue recorded (a column sum's zeroed result)
        **cls.META,
        "mma": kind.name,
        "tile": [t.bm, t.bn, t.bk],
        "warps": [t.warps_m, t.warps_n],
        "stages": t.stages,
        "problem": [c.n_batch, M, N, K],
        "operands": str(c.a_type),
        "staging": ["cp.async" if d else "loads" for d in (ops[0].direct, ops[1].direct)],
    }
    return kb


def emit_ranges(group: Group, module: ir.Module, name: str, ranges: list[list[Contraction]],
                parts: list[Group], dispatch, cls: type | None = None) -> KernelBuilder:
    """A horizontal kernel (:mod:`.horizontal`): ``dispatch(kb, tiles, build)`` runs, per
    range of blocks, this emitter's pipeline for each of the range's contractions (one
    after the other when an epilogue reads two) and the epilogue of its part of the group.
    One tile shape for all (chosen for the whole N); shared memory sized for the largest
    slab layout. ``cls``: the kernel body (as for :func:`emit_mma`)."""
    cls = cls or _Kernel
    opts = group.options
    cs = [c for r in ranges for c in r]
    kinds = {str(c.a_type) + "x" + str(c.b_type) for c in cs}
    require(len(kinds) == 1, "siblings with different operand types")
    first = cs[0]
    kind = mma.kind_for(first.a_type, first.b_type, allow_tf32=opts.allow_tf32)
    if kind is None:
        if str(first.a_type) == "f32" and str(first.b_type) == "f32":
            raise NotChosen("f32 operands (TF32 not allowed)")
        require(False, f"no tensor-core kind for {first.a_type} x {first.b_type} operands")
    for c in cs:
        require(str(c.c_type) == "f32", f"a {c.c_type} accumulator (tensor cores sum in f32)")
        require(c.payload_is_mul_add(), "a contraction payload that is not acc + a * b")
    from .horizontal import Blocks

    M, K = first.M, first.K
    b_ks = [[_runs_along_k(part, c, 1) for c in r] for r, part in zip(ranges, parts)]
    a_ks = [[_runs_along_k(part, c, 0) for c in r] for r, part in zip(ranges, parts)]
    a_k = a_ks[0][0]
    n_total = sum(r[0].N for r in ranges)
    t = choose(M, n_total, K, first.n_batch, kind, opts.target, all(a for r in a_ks for a in r),
               all(b for r in b_ks for b in r), cls.RULES)
    if any(len(r) > 1 for r in ranges):
        # a pair keeps two sets of accumulators: at most 64 x 64 per block
        made = configure(*cls.PAIR_TILE, K, kind, a_k, b_ks[0][0],
                         estimate.device(opts.target).smem_per_block, cls.RULES)
        require(made is not None, "no tile for paired siblings fits in shared memory")
        t = made[0] if t.bm * t.bn > cls.PAIR_TILE[0] * cls.PAIR_TILE[1] else t
    blocks = Blocks.of(ranges, t.bm, t.bn)
    grid = blocks.grid(first.n_batch)

    def operands(c: Contraction, a_k: bool, b_k: bool) -> list[_Operand]:
        return [cls.operand(j, extent, size, k_major, t, kind)
                for j, (extent, size, k_major) in enumerate(((t.bm, c.M, a_k), (t.bn, c.N, b_k)))]

    layouts = [operands(c, a, b) for r, as_, bs in zip(ranges, a_ks, b_ks)
               for c, a, b in zip(r, as_, bs)]
    shared = [Shared(t.stages * max(o[j].stage for o in layouts), kind.element) for j in (0, 1)]
    kb = KernelBuilder(module, name, group.params, grid, (t.threads, 1, 1), shared)
    staging = []

    def build(i: int, bx) -> None:
        kernels = []
        for c, a_k, b_k in zip(ranges[i], a_ks[i], b_ks[i]):
            ops = operands(c, a_k, b_k)
            for o, smem in zip(ops, kb.shared):
                o.smem = smem
            kernels.append(cls(kb, parts[i], c, kind, t, ops, block=blocks.block(kb, i, bx)))
        finals = []
        for n, k in enumerate(kernels):
            if n:  # every warp is done with the slabs before the next sibling restages them
                with kb.emitting():
                    gpu.barrier()
            finals.append(k.mainloop())
            staging.append(["cp.async" if d else "loads" for d in (k.ops[0].direct, k.ops[1].direct)])
        kernels[0].epilogue(finals[0], list(zip(kernels[1:], finals[1:])))

    dispatch(kb, blocks.tiles, build)
    kb.vector_lanes = 2 if all(c.N % 2 == 0 for c in cs) else 1
    kb.meta = {
        **kb.meta,  # what the epilogue recorded (a column sum's zeroed result)
        **cls.META,
        "mma": kind.name,
        "tile": [t.bm, t.bn, t.bk],
        "warps": [t.warps_m, t.warps_n],
        "stages": t.stages,
        "problem": [first.n_batch, M, n_total, K],
        "ranges": [r[0].N for r in ranges],
        "products": [len(r) for r in ranges],  # contractions per range (SwiGLU's pair: 2)
        "operands": str(first.a_type),
        "staging": staging[0],
    }
    if blocks.flat:
        kb.meta["problems"] = [[c.M, c.N, c.K] for c in cs]
    return kb


class _Kernel:
    """The kernel body, built in :meth:`build`. Subclasses (another instruction) replace
    :data:`RULES`, :meth:`operand`, :meth:`_dst`, :meth:`_row_col` and :meth:`mainloop`."""

    #: Tile candidates and the estimate's rate (:mod:`opfuse.backends.gpu.build.matmul_tiles`).
    RULES = MMA_SYNC
    #: The tile of a range that runs two products (two sets of accumulators).
    PAIR_TILE = (64, 64, 2, 2)
    #: What the kernel adds to its KernelSpec's meta.
    META: dict = {}

    @classmethod
    def operand(cls, j: int, extent: int, size: int, k_major: bool, t: Tiles, kind) -> _Operand:
        """Operand ``j``'s slab: rows padded so ldmatrix is free of bank conflicts."""
        ld = mma.shared_ld(t.bk if k_major else extent, kind, k_major)
        return _Operand(j, extent, size, k_major, ld, (extent if k_major else t.bk) * ld)

    def __init__(self, kb, group, c: Contraction, kind: mma.MmaKind, t: Tiles, ops, block=None):
        self.kb, self.group, self.c, self.kind, self.t, self.ops = kb, group, c, kind, t, ops
        self.leaves = group.leaves(kb.params)
        # the tile's block index: the block id, or the horizontal kernel's within its range
        bx, by, bz = block or [kb.add_dim(v) for v in kb.block_id]
        self.tid = kb.add_dim(kb.thread_id[0])
        self.batch = delinearize(bz, c.batch_shape) if c.loops.batch else []
        ops[0].base, ops[1].base = by * t.bm, bx * t.bn
        warp = ir.AffineExpr.get_floor_div(self.tid, WARP)
        self.wm = ir.AffineExpr.get_floor_div(warp, t.warps_n)
        self.wn = ir.AffineExpr.get_mod(warp, t.warps_n)
        self.warp = mma.Warp(kb, kind, ir.AffineExpr.get_mod(self.tid, WARP))
        self.zero = ir.AffineConstantExpr.get(0, kb.ctx)

    # ----- the pipeline ----------------------------------------------------------------
    def build(self) -> None:
        self.epilogue(self.mainloop())

    def epilogue(self, finals: list, others: list = ()) -> None:
        """Store the group's outputs from ``finals``; ``others`` pairs further kernels of
        this tile (the horizontal kernel's siblings that one epilogue reads) with theirs."""
        self._epilogue(finals, self.t.warp_m // 16, self.t.warp_n // 8, others)

    def mainloop(self) -> list:
        """The pipeline over K; returns the accumulators (in accumulator order)."""
        kb, t, c = self.kb, self.t, self.c
        KT = -(-c.K // t.bk)
        S = t.stages
        for s in range(S - 1):
            if s < KT:
                for o in self.ops:
                    self._stage(o, s * t.bk, s * o.stage)
            async_copy.commit(kb)
        mi, ni = t.warp_m // 16, t.warp_n // 8
        inits = self._initial_accumulators(mi, ni)

        def body(iv, accs):
            kt = kb.add_dim(iv)
            async_copy.wait(kb, S - 2)
            with kb.emitting():
                gpu.barrier()
            if KT > S - 1:
                nxt = kt + (S - 1)
                slot = ir.AffineExpr.get_mod(nxt, S)
                with kb.if_(kb.cmp_lt(kb.apply(nxt), kb.index(KT))):
                    for o in self.ops:
                        self._stage(o, nxt * t.bk, slot * o.stage)
            async_copy.commit(kb)
            return self._compute(ir.AffineExpr.get_mod(kt, S), accs, mi, ni)

        finals = kb.for_(kb.index(0), kb.index(KT), kb.index(1), inits, body)
        async_copy.wait(kb, 0)  # nothing is left in flight at exit
        return finals

    def _compute(self, slot: ir.AffineExpr, accs: list, mi: int, ni: int) -> list:
        """The MMAs of one slab: per k-step, each warp's A fragments (16 rows each), B
        fragments (two 8-column tiles per ldmatrix), then every (A, B) pair."""
        t, kind, w = self.t, self.kind, self.warp
        a_op, b_op = self.ops
        tile_a = mma.SharedTile(a_op.smem, a_op.ld, a_op.k_major, slot * a_op.stage)
        tile_b = mma.SharedTile(b_op.smem, b_op.ld, b_op.k_major, slot * b_op.stage)
        accs = list(accs)
        for kk in range(0, t.bk, kind.k):
            a = [w.load_a(tile_a, self.wm * t.warp_m + 16 * i, kk) for i in range(mi)]
            b = []
            for jj in range(0, ni, 2):
                b += w.load_b(tile_b, self.wn * t.warp_n + 8 * jj, kk, tiles=min(2, ni - jj))
            for i in range(mi):
                for j in range(ni):
                    at = 4 * (i * ni + j)
                    accs[at : at + 4] = w.mma(a[i], b[j], tuple(accs[at : at + 4]))
        return accs

    # ----- staging ----------------------------------------------------------------------
    def _stage(self, o: _Operand, k0, slot_base) -> None:
        """Every thread's share of operand ``o``'s slab at K offset ``k0`` into the slab
        buffer at element ``slot_base``: cp.async where the operand is a parameter view
        with a copy size that divides its contiguous extent, else evaluator loads and
        shared stores."""
        kb, t, c = self.kb, self.t, self.c
        inner = t.bk if o.k_major else o.extent  # the slab's extent along shared rows
        whole = c.K if o.k_major else o.size  # the full extent along that direction
        chunk, direct = self._chunk(o, inner, whole)
        o.direct = direct
        per_row = inner // chunk
        slots = o.extent * t.bk // chunk
        for first in range(0, slots, t.threads):
            with kb.at(kb.ip):
                s = self.tid + first if first else self.tid
                guard = None
                if first + t.threads > slots:
                    guard = kb.cmp_lt(kb.apply(s), kb.index(slots))
                with kb.if_(guard) if guard is not None else contextlib.nullcontext():
                    row, col = self._row_col(s, per_row)
                    col = col * chunk
                    i, k = (row, col) if o.k_major else (col, row)
                    dst = kb.apply(slot_base + self._dst(o, i, k))
                    gi, gk = kb.apply(o.base + i), kb.apply(k0 + k)
                    ok = self._in_range(o, gi, gk)
                    gi = self._clamp(gi, o.size, chunk if not o.k_major else 1, o.size % o.extent)
                    gk = self._clamp(gk, c.K, chunk if o.k_major else 1, c.K % t.bk)
                    di, dk = kb.add_dim(gi), kb.add_dim(gk)
                    vdim = dk if o.k_major else di
                    if direct:
                        self._copy(o, di, dk, vdim, dst, chunk, ok)
                    else:
                        self._load_store(o, di, dk, vdim, dst, chunk, ok)

    def _row_col(self, s, per_row: int) -> tuple:
        """The shared row and the copy (along the row) thread slot ``s`` fills: row-major,
        so consecutive threads read consecutive chunks of global memory."""
        return ir.AffineExpr.get_floor_div(s, per_row), ir.AffineExpr.get_mod(s, per_row)

    def _dst(self, o: _Operand, i, k):
        """Element (``i`` along M/N, ``k`` along K) of operand ``o``'s slab: its offset in
        the slab."""
        return i * o.ld + k if o.k_major else k * o.ld + i

    def _index(self, o: _Operand, di, dk) -> tuple:
        c = self.c
        m, n = (di, self.zero) if o.j == 0 else (self.zero, di)
        return c.operand_index(o.j, c.point(self.batch, m, n, dk, self.kb.ctx), self.kb)

    def _chunk(self, o: _Operand, inner: int, whole: int) -> tuple[int, bool]:
        """(elements per copy, cp.async?) for operand ``o``."""
        kb, e = self.kb, self.kind.element_bytes
        probe = Evaluator(kb, self.group.func, self.leaves)
        with kb.at(kb.ip):
            di, dk = kb.add_dim(kb.index(0)), kb.add_dim(kb.index(0))
            found = probe.source(self.c.op.operands[o.j], self._index(o, di, dk))
            vdim = (dk if o.k_major else di).position
            for nbytes in COPY_BYTES:
                n = nbytes // e
                if n == 0 or inner % n or whole % n or found is None:
                    continue
                la = analyze(linearize(found[1], found[0].shape), frozenset([vdim]), n)
                if la.kind == Kind.CONTIG and la.aligned:
                    return n, True
        lanes = 16 // e
        while lanes > 1 and (inner % lanes or whole % lanes):
            lanes //= 2
        return lanes, False

    def _in_range(self, o: _Operand, gi: ir.Value, gk: ir.Value) -> ir.Value | None:
        kb = self.kb
        ok = None
        if o.size % o.extent:
            ok = kb.cmp_lt(gi, kb.index(o.size))
        if self.c.K % self.t.bk:
            ok = kb.and_(ok, kb.cmp_lt(gk, kb.index(self.c.K)))
        return ok

    def _clamp(self, v: ir.Value, size: int, width: int, tail: int) -> ir.Value:
        """``v`` clamped to the last in-bounds start of a ``width``-wide access (only where
        the tile can pass the end)."""
        return self.kb.min_index(v, self.kb.index(size - width)) if tail else v

    def _copy(self, o: _Operand, di, dk, vdim, dst: ir.Value, chunk: int, ok) -> None:
        kb = self.kb
        probe = Evaluator(kb, self.group.func, self.leaves)
        leaf, idx = probe.source(self.c.op.operands[o.j], self._index(o, di, dk))
        src = kb.apply(linearize(idx, leaf.shape))
        async_copy.copy_if(kb, o.smem, dst, leaf.mem, src, chunk, ok)

    def _load_store(self, o: _Operand, di, dk, vdim, dst: ir.Value, chunk: int, ok) -> None:
        kb = self.kb
        ev = Evaluator(kb, self.group.func, self.leaves, lanes=chunk, vdim=vdim.position)
        x = ev.as_vector(ev.value(self.c.op.operands[o.j], self._index(o, di, dk)))
        if ok is not None:
            zero = kb.const(x.type, 0)
            with kb.emitting():
                x = arith.select(ok, x, zero)
        with kb.emitting():
            if chunk == 1:
                memref.store(x, o.smem, [dst])
            else:
                align = chunk * self.kind.element_bytes
                vector.store(x, o.smem, [dst], alignment=align)

    # ----- accumulators and epilogue ----------------------------------------------------
    def _c_point(self, row, col) -> tuple:
        c = self.c
        return c.operand_index(2, c.point(self.batch, row, col, self.zero, self.kb.ctx), self.kb)

    def _points(self, i: int, j: int) -> list[tuple[ir.Value, ir.Value, ir.Value | None, list]]:
        """Where this lane's accumulators of tile (i, j) of its warp go: per store, (row,
        first column, mask, accumulator positions 0..3). Two columns per store when N is
        even (a pair c0 c1 or c2 c3), else one. Indices are clamped in bounds; the mask
        (None: always in bounds) says whether to store."""
        kb, t, c = self.kb, self.t, self.c
        row0 = self.ops[0].base + self.wm * t.warp_m + 16 * i
        col0 = self.ops[1].base + self.wn * t.warp_n + 8 * j
        lanes = self._pair_lanes()
        out = []
        for h, ((row, col), _) in enumerate(self.warp.pairs((None,) * 4, row0, col0)):
            r = kb.apply(row)
            row_ok = None
            if c.M % t.bm:
                row_ok = kb.cmp_lt(r, kb.index(c.M))
                r = kb.min_index(r, kb.index(c.M - 1))
            for e in range(0, 2, lanes):
                cl = kb.apply(col + e if e else col)
                ok = row_ok
                if c.N % t.bn:
                    ok = kb.and_(ok, kb.cmp_lt(cl, kb.index(c.N)))
                    cl = kb.min_index(cl, kb.index(c.N - lanes))
                out.append((r, cl, ok, [2 * h + e + x for x in range(lanes)]))
        return out

    def _pair_lanes(self) -> int:
        return 2 if self.c.N % 2 == 0 else 1

    def _evaluator(self, dc: ir.AffineExpr) -> Evaluator:
        lanes = self._pair_lanes()
        return Evaluator(self.kb, self.group.func, self.leaves, lanes=lanes, vdim=dc.position)

    def _initial_accumulators(self, mi: int, ni: int) -> list:
        """C's initial values (the outs operand: a zero fill, or a tensor) at each lane's
        accumulator elements, in accumulator order."""
        kb, c = self.kb, self.c
        out: list = []
        for i in range(mi):
            for j in range(ni):
                tile = [None] * 4
                with kb.at(kb.ip):
                    for r, cl, _, elems in self._points(i, j):
                        dr, dc = kb.add_dim(r), kb.add_dim(cl)
                        ev = self._evaluator(dc)
                        v = ev.value(c.op.operands[2], self._c_point(dr, dc))
                        for pos, x in zip(elems, _scalars(kb, ev, v, len(elems))):
                            tile[pos] = x
                out += tile
        return out

    def _epilogue(self, finals: list, mi: int, ni: int, others=()) -> None:
        kb, c = self.kb, self.c
        vt = ir.VectorType.get([2], ir.F32Type.get(kb.ctx), loc=ir.Location.unknown(kb.ctx))
        for i in range(mi):
            for j in range(ni):
                at = slice(4 * (i * ni + j), 4 * (i * ni + j) + 4)
                with kb.at(kb.ip):
                    for r, cl, ok, elems in self._points(i, j):
                        dr, dc = kb.add_dim(r), kb.add_dim(cl)
                        ev = self._evaluator(dc)
                        for k, accs in ((self, finals), *others):
                            acc = accs[at]
                            if len(elems) == 2:
                                with kb.emitting():
                                    pair = vector.from_elements(vt, [acc[e] for e in elems])
                                v = Val(pair, False)
                            else:
                                v = Val(acc[elems[0]], True)
                            ev.preset(k.c.op.results[0], k._c_point(dr, dc), v)
                        store_outputs(kb, ev, self.group, c, self._c_point(dr, dc), ok)


def _scalars(kb: KernelBuilder, ev: Evaluator, v: Val, lanes: int) -> list:
    """``v`` (a value at ``lanes`` columns) as that many f32 scalars."""
    if lanes == 1:
        return [v.ssa]
    x = ev.as_vector(v)
    with kb.emitting():
        return [vector.extract(x, [], [e]) for e in range(lanes)]


def _runs_along_k(group: Group, c: Contraction, j: int) -> bool:
    """Whether operand ``j``'s consecutive addresses run along K rather than along its
    M/N loop (the evaluator's address probe, in a scratch kernel)."""
    scratch = ir.Module.create(ir.Location.unknown(c.op.context))
    kb = KernelBuilder(scratch, "probe", group.params, (1, 1, 1), (1, 1, 1))
    n_batch = len(c.loops.batch)
    dims = [ir.AffineDimExpr.get(i, kb.ctx) for i in range(2 + n_batch)]
    other, k, batch = dims[0], dims[1], dims[2:]
    zero = ir.AffineConstantExpr.get(0, kb.ctx)
    m, n = (other, zero) if j == 0 else (zero, other)
    idx = compose(maps_of(c.op)[j], c.point(batch, m, n, k, kb.ctx), len(dims), kb.ctx)
    probe = Evaluator(kb, group.func, group.leaves(kb.params))
    addrs = probe.addresses(c.op.operands[j], idx, len(dims)) or []

    def contiguous(d: int) -> int:
        return sum(analyze(a, frozenset([d]), 8).kind == Kind.CONTIG for a in addrs)

    return contiguous(1) > contiguous(0)


__all__ = ["emit_mma", "emit_ranges"]
