"""Attention kernels on tensor cores ("attention" groups, f16 and bf16): FlashAttention-2
forward with both products on ``mma.sync.m16n8k16`` (:mod:`opfuse.backends.gpu.build.mma`).

A block of four warps owns ``BLOCK_M = 64`` query rows of one (batch, head) (``grid.x``
over query blocks, ``grid.y`` over batch x heads); warp ``w`` owns rows ``16w .. 16w+15``
and every key of a tile, so a row's softmax never leaves its warp:

1. Q's rows are copied to shared memory (``cp.async``), each warp loads its 16 rows as A
   fragments (``ldmatrix``) once and keeps them in registers.
2. Per key tile of ``BLOCK_N`` keys, K and V are staged with ``cp.async`` in two buffers
   each (double buffered: the copy of tile ``j+1`` runs while tile ``j`` is computed):
   S = Q·Kᵀ on tensor cores (K's rows run along the head dim: plain ``ldmatrix``), each
   lane holding ``BLOCK_N / 8`` accumulator tiles, elements ``c0 c1`` of row
   ``lane / 4`` and ``c2 c3`` of row ``lane / 4 + 8`` (PTX ISA 9.7.14.5.8).
3. The graph's own pointwise ops turn each S element into a score X (the evaluator with S
   given, as in :mod:`.attention`); keys past the end are ``-inf``. Online softmax per
   row: the tile's max over the lane's elements, then over the four lanes of a quad
   (``shuffle xor`` 1, 2: they hold the row's other columns); ``alpha = exp(m_old -
   m_new)``; ``p = exp(x - m)``; each lane keeps its own partial row sum (the quad's sums
   are added once, at the end, as FlashAttention-2 does) and scales its O accumulators.
4. P never goes to shared memory: two S accumulator tiles (16 keys) *are* the layout of
   one 16x16 A fragment (:meth:`opfuse.backends.gpu.build.mma.Warp.a_from_acc`: rounded to f16/bf16 in
   registers), multiplied by V fragments read with ``ldmatrix.trans`` (V's rows run
   along the value columns).
5. After the last tile, ``O = acc / l`` (0 where ``l = 0``: a fully masked row, as
   PyTorch's SDPA gives), written through the group's outputs two columns at a time.

Pipeline, with one commit per copy so the wait counts are the same every tile::

    prologue: copy Q (into the V buffers), K(0); wait Q; barrier; Q -> registers; barrier;
              copy V(0)
    for tile j:
        wait_group 1; barrier     # K(j) landed for everyone; everyone is past PV(j-1)
        copy K(j+1) into the K buffer S(j-1) used
        S = Q Kᵀ, scores, online softmax
        wait_group 1; barrier     # V(j) landed; everyone is past S(j)
        copy V(j+1) into the V buffer PV(j-1) used
        O += P V

Causal masks (keys ``n > m + c`` masked) end the loop at the block's last useful key
tile, as the SIMT kernel does, and a key tile wholly below the diagonal for every row of
the block evaluates the scores without the causal mask (``scf.if`` on the tile: its
selects are bypassed, nothing of the mask is computed), as FlashAttention-2 does. Tails: rows past the end are zero-filled by the copies and
masked at the store, keys past the end zero-filled (V) and ``-inf`` (scores), head dims
padded with zeros to a multiple of 16. Operands must be views of kernel parameters whose
head-dim elements are contiguous (cp.async copies 16, 8 or 4 bytes); otherwise, and for
f32 (SIMT stays the f32 kernel: there is no TF32 path for P·V), the SIMT kernel of
:mod:`.attention` is used. Chosen with the matmul knob: ``matmul=simt`` (or
``<kernel>=simt``, ``$OPFUSE_MATMUL``) selects the SIMT kernel for f16/bf16 too.
"""

from __future__ import annotations

import contextlib
import math

from mlir import ir
from mlir.dialects import arith, gpu, memref, vector

from ..build import async_copy, mma
from ..build.attention_plan import (
    AttentionEvaluator,
    Plan,
    at,
    below_diagonal,
    binary,
    clamped,
    elem_type,
    exp,
    fma,
    from_f32,
    kernel_meta,
    key_bound,
    plan,
    reciprocal_or_zero,
    rescale,
    scores_by_tile,
    select,
    to_f32,
)
from ..build.evaluate import Val
from ..build.group import Group, NotChosen, require
from ..build.kernel import KernelBuilder, Shared, Unsupported, delinearize, linearize, numel
from ..build.lanes import Kind, analyze

WARP = 32
WARPS = 4
THREADS = WARP * WARPS
#: Query rows per block (16 per warp: one m16 tile each).
BLOCK_M = 16 * WARPS
#: Static shared memory a block may use without opting in (sm_80 and sm_90).
SMEM_BYTES = 48 * 1024
#: Per target, by the largest (padded) head dim: keys per tile and the registers per
#: thread ptxas may use (``.maxnreg``). The tile is the largest whose double-buffered K and
#: V fit the static shared memory; the register budget keeps 3 blocks (12 warps) per SM up
#: to head dim 64 and lets the 32-key tiles have what they need (2 blocks): without one
#: ptxas aims at 4 blocks of 128 threads and spills S or O accumulators to get there.
#: Checked by ptxas (CUDA 13.0, sm_80 and sm_90): 0 spills (test_attention_mma.py).
#: Larger head dims (Q's 64 rows alone pass 32 KiB at 256) are the SIMT kernel's.
TILES = {
    "sm_80": ((64, 64, 168), (128, 32, 255)),
    "sm_90": ((64, 64, 168), (128, 32, 255)),
}
#: Bytes per cp.async, largest first.
COPY_BYTES = (16, 8, 4)


def tile(target: str, head: int) -> tuple[int, int]:
    """(keys per tile, register budget) for a (padded) head dim ``head`` on ``target``."""
    for limit, bn, regs in TILES.get(target, TILES["sm_90"]):
        if head <= limit:
            return bn, regs
    raise Unsupported(f"head dim {head} above the tensor-core tiles (at most 128)")


def _pad16(d: int) -> int:
    return -(-d // 16) * 16


def emit_attention_mma(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    opts = group.options
    if opts.matmul_mode(name) == "simt":
        raise NotChosen("matmul=simt")
    p = plan(group)
    att = p.att
    q_t, k_t, v_t = (elem_type(x) for x in (att.q, att.k, att.v))
    kind = mma.kind_for(q_t, k_t, allow_tf32=False)
    if kind is None or str(v_t) != kind.element:
        raise NotChosen(f"{q_t} x {k_t} x {v_t} operands (tensor cores: f16, bf16)")
    p_t = elem_type(att.pv.op.operands[0])
    require(str(p_t) == kind.element, f"P in {p_t} before P·V (the MMA kernel rounds P to {kind.element})")
    D, Dv, N, M = att.head_dim, att.value_dim, att.keys, att.queries
    d_pad, dv_pad = _pad16(D), _pad16(Dv)
    bn, regs = tile(opts.target, max(d_pad, dv_pad))
    ldq = mma.padded_ld(d_pad, 2)
    ldv = mma.padded_ld(dv_pad, 2)
    k_size, v_size = bn * ldq, bn * ldv
    total = 2 * k_size + max(2 * v_size, BLOCK_M * ldq)
    require(2 * total <= SMEM_BYTES, f"head dims {D}, {Dv}: K/V tiles exceed shared memory")
    G = numel(att.batch)
    grid = (-(-M // BLOCK_M), G, 1)
    require(grid[0] <= 2**31 - 1 and grid[1] <= 65535, "too many blocks")
    kb = KernelBuilder(module, name, group.params, grid, (THREADS, 1, 1), [Shared(total, kind.element)])
    k = _Kernel(kb, group, p, kind, bn, d_pad, dv_pad, ldq, ldv, k_size, v_size)
    chunks = [k.chunk(x, exprs, role, size) for x, exprs, role, size in
              ((att.q, att.q_idx, "head", D), (att.k, att.k_idx, "head", D), (att.v, att.v_idx, "n", Dv))]
    # Q or K computed by a prologue (rotary embedding), or a view cp.async cannot copy, is
    # evaluated into shared memory instead (chunk 0); V must be a copyable view
    require(chunks[2], "V not a parameter view with contiguous value columns")
    k.q_chunk, k.k_chunk, k.v_chunk = chunks
    k.emit()
    kb.vector_lanes = 2 if Dv % 2 == 0 else 1
    kb.max_registers = regs
    kb.meta = kernel_meta(att, (BLOCK_M, bn), (d_pad, dv_pad), kind.name)
    return kb


class _Kernel:
    """The state of one tensor-core attention kernel being built (module docstring)."""

    def __init__(self, kb, group, p: Plan, kind, bn, d_pad, dv_pad, ldq, ldv, k_size, v_size):
        self.kb, self.group, self.p, self.att, self.kind = kb, group, p, p.att, kind
        self.bn, self.d_pad, self.dv_pad, self.ldq, self.ldv = bn, d_pad, dv_pad, ldq, ldv
        self.k_size, self.v_size = k_size, v_size
        self.v_base = 2 * k_size  # V's two buffers (and Q, before the loop) follow K's
        att = self.att
        self.D, self.Dv, self.N, self.M = att.head_dim, att.value_dim, att.keys, att.queries
        (self.smem,) = kb.shared
        self.f32 = ir.F32Type.get(kb.ctx)
        self.i32 = ir.IntegerType.get_signless(32, kb.ctx)
        self.neg_inf = kb.const(self.f32, -math.inf)
        self.zero = kb.const(self.f32, 0.0)
        self.leaves = group.leaves(kb.params)
        self.ev = AttentionEvaluator(kb, group.func, self.leaves)
        bx, by = kb.add_dim(kb.block_id[0]), kb.add_dim(kb.block_id[1])
        self.tid = kb.add_dim(kb.thread_id[0])
        self.batch = delinearize(by, list(att.batch)) if att.batch else []
        self.m0 = bx * BLOCK_M
        lane = ir.AffineExpr.get_mod(self.tid, WARP)
        self.warp = mma.Warp(kb, kind, lane)
        self.row0 = ir.AffineExpr.get_floor_div(self.tid, WARP) * 16  # the warp's first row
        coords = self.warp.coords()
        # the lane's two rows (c0 c1: groupID, c2 c3: groupID + 8), clamped, and in range?
        self.rows, self.row_ok = [], []
        for h in (0, 2):
            r, ok = self._clamped(self.m0 + self.row0 + coords[h][0], self.M, BLOCK_M)
            self.rows.append(r)
            self.row_ok.append(ok)
        self.cols = [coords[0][1], coords[1][1]]  # the lane's columns in a 16x8 tile
        self.q_chunk = self.k_chunk = self.v_chunk = 0

    # ----- helpers ----------------------------------------------------------------------
    def _clamped(self, e: ir.AffineExpr, size: int, tile: int):
        return clamped(self.kb, e, size, tile)

    def _at(self, exprs, **roles):
        return at(self.kb, self.att, exprs, roles, self.batch)

    def _op(self, name: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return binary(self.kb, name, a, b)

    def _barrier(self) -> None:
        with self.kb.emitting():
            gpu.barrier()

    def _quad(self, x: ir.Value, combine: str) -> ir.Value:
        """``x`` combined over the four lanes of a quad (the lanes that hold one row)."""
        for off in (1, 2):
            with self.kb.emitting():
                other = gpu.shuffle(x, self.kb.const(self.i32, off), self.kb.const(self.i32, WARP),
                                    gpu.ShuffleMode.XOR)[0]
            x = self._op(combine, x, other)
        return x

    # ----- staging ----------------------------------------------------------------------
    def chunk(self, value: ir.Value, exprs, role: str, size: int) -> int:
        """Elements per cp.async for operand ``value`` (read at ``exprs`` with the head
        dim or value column as ``role``, ``size`` of them): the largest copy whose
        elements are contiguous and aligned in the parameter it is a view of; 0 if none."""
        kb = self.kb
        probe = AttentionEvaluator(kb, self.group.func, self.leaves)
        with kb.at(kb.ip):
            z = kb.add_dim(kb.index(0))
            col = kb.add_dim(kb.index(0))
            roles = {"m": z, "k": z, role: col}
            found = probe.source(value, self._at(exprs, **roles))
            if found is None:
                return 0
            flat = linearize(found[1], found[0].shape)
            for nbytes in COPY_BYTES:
                n = nbytes // 2
                if size % n:
                    continue
                la = analyze(flat, frozenset([col.position]), n)
                if la.kind == Kind.CONTIG and la.aligned:
                    return n
        return 0

    def _stage(self, value, exprs, row_role: str, col_role: str, row0, rows: int, limit: int,
               cols: int, padded: int, chunk: int, base, ld: int) -> None:
        """Every thread's share of the ``rows x padded`` tile of ``value`` whose first row
        (along ``row_role``) is ``row0``: copied with cp.async to ``base + row * ld +
        col``, zero-filled past ``limit`` rows and ``cols`` columns."""
        kb = self.kb
        per_row = padded // chunk
        slots = rows * per_row
        probe = AttentionEvaluator(kb, self.group.func, self.leaves)
        for first in range(0, slots, THREADS):
            with kb.at(kb.ip):
                s = self.tid + first if first else self.tid
                guard = None
                if first + THREADS > slots:
                    guard = kb.cmp_lt(kb.apply(s), kb.index(slots))
                with kb.if_(guard) if guard is not None else contextlib.nullcontext():
                    r = ir.AffineExpr.get_floor_div(s, per_row)
                    c = ir.AffineExpr.get_mod(s, per_row) * chunk
                    dst = kb.apply(base + r * ld + c)
                    row = kb.apply(row0 + r)
                    col = kb.apply(c)
                    ok = None
                    if limit % rows:  # a tile can pass the last row
                        ok = kb.cmp_lt(row, kb.index(limit))
                        row = kb.min_index(row, kb.index(limit - 1))
                    if padded != cols:
                        ok = kb.and_(ok, kb.cmp_lt(col, kb.index(cols)))
                        col = kb.min_index(col, kb.index(cols - chunk))
                    dr, dc = kb.add_dim(row), kb.add_dim(col)
                    leaf, idx = probe.source(value, self._at(exprs, **{row_role: dr, col_role: dc}))
                    src = kb.apply(linearize(idx, leaf.shape))
                    async_copy.copy_if(kb, self.smem, dst, leaf.mem, src, chunk, ok)

    def _evaluate(self, value, exprs, row_role: str, col_role: str, row0, rows: int, limit: int,
                  cols: int, padded: int, base, ld: int) -> None:
        """The ``rows x padded`` tile of ``value`` whose first row is ``row0``, computed by
        the group's own ops from their inputs (a prologue: ``q * cos + rotate_half(q) *
        sin``) and stored to ``base + row * ld + col`` in the operand type, zero past
        ``limit`` rows and ``cols`` columns: the tile :meth:`_stage` would copy, for an
        operand that is no view of a parameter. A loop over each thread's pairs of
        columns (consecutive threads on consecutive pairs: coalesced loads), each element
        evaluated on its own (its loads and temporaries are all the registers it needs),
        a pair stored at once."""
        kb = self.kb
        half = padded // 2  # padded is a multiple of 16
        slots = rows * half
        steps = -(-slots // THREADS)
        el = ir.Type.parse(self.kind.element, kb.ctx)
        zero = kb.const(el, 0.0)
        pair_t = ir.VectorType.get([2], el, loc=ir.Location.unknown(kb.ctx))

        def body(iv, _):
            i = kb.add_dim(iv)
            s = self.tid + i * THREADS
            guard = kb.cmp_lt(kb.apply(s), kb.index(slots)) if slots % THREADS else None
            with kb.if_(guard) if guard is not None else contextlib.nullcontext():
                r = ir.AffineExpr.get_floor_div(s, half)
                c = ir.AffineExpr.get_mod(s, half) * 2
                dst = kb.apply(base + r * ld + c)
                row, row_ok = self._clamped(row0 + r, limit, rows)
                xs = []
                for e in range(2):
                    col = kb.apply(c + e if e else c)
                    ok = row_ok
                    if padded != cols:
                        ok = kb.and_(ok, kb.cmp_lt(col, kb.index(cols)))
                        col = kb.min_index(col, kb.index(cols - 1))
                    ev = AttentionEvaluator(kb, self.group.func, self.leaves)
                    idx = self._at(exprs, **{row_role: row, col_role: kb.add_dim(col)})
                    x = from_f32(kb, to_f32(kb, ev.value(value, idx).ssa), el)
                    xs.append(x if ok is None else select(kb, ok, x, zero))
                with kb.emitting():
                    vector.store(vector.from_elements(pair_t, xs), self.smem, [dst], alignment=4)
            return []

        kb.for_(kb.index(0), kb.index(steps), kb.index(1), [], body)

    def _stage_q(self) -> None:
        att = self.att
        args = (att.q, att.q_idx, "m", "head", self.m0, BLOCK_M, self.M, self.D, self.d_pad)
        base = ir.AffineConstantExpr.get(self.v_base, self.kb.ctx)
        if self.q_chunk:
            self._stage(*args, self.q_chunk, base, self.ldq)
        else:
            self._evaluate(*args, base, self.ldq)

    def _stage_k(self, n0, slot) -> None:
        att = self.att
        args = (att.k, att.k_idx, "k", "head", n0, self.bn, self.N, self.D, self.d_pad)
        if self.k_chunk:
            self._stage(*args, self.k_chunk, slot * self.k_size, self.ldq)
        else:
            self._evaluate(*args, slot * self.k_size, self.ldq)

    def _stage_v(self, n0, slot) -> None:
        att = self.att
        self._stage(att.v, att.v_idx, "k", "n", n0, self.bn, self.N, self.Dv, self.dv_pad,
                    self.v_chunk, self.v_base + slot * self.v_size, self.ldv)

    # ----- the kernel -------------------------------------------------------------------
    def emit(self) -> None:
        kb, ctx = self.kb, self.kb.ctx
        zero = ir.AffineConstantExpr.get(0, ctx)
        self._stage_q()
        async_copy.commit(kb)
        self._stage_k(zero, zero)
        async_copy.commit(kb)
        async_copy.wait(kb, 1)  # Q has landed (K(0) may still be in flight)
        self._barrier()
        tile_q = mma.SharedTile(self.smem, self.ldq, True, ir.AffineConstantExpr.get(self.v_base, ctx))
        self.q_frags = [self.warp.load_a(tile_q, self.row0, 16 * s) for s in range(self.d_pad // 16)]
        self._barrier()  # every warp has its Q fragments: V(0) may overwrite them
        self._stage_v(zero, zero)
        async_copy.commit(kb)
        n_acc = self.dv_pad // 8
        inits = [self.neg_inf] * 2 + [self.zero] * 2 + list(self.warp.zeros()) * n_acc
        self.ub = key_bound(kb, self.att.causal, self.m0, BLOCK_M, self.N)
        finals = kb.for_(kb.index(0), self.ub, kb.index(self.bn), inits, self._tile)
        async_copy.wait(kb, 0)  # nothing left in flight at exit
        self._store(finals[2:4], finals[4:])

    def _tile(self, iv, state):
        kb, bn = self.kb, self.bn
        n0 = kb.add_dim(iv)
        slot = ir.AffineExpr.get_mod(ir.AffineExpr.get_floor_div(n0, bn), 2)
        nxt = ir.AffineExpr.get_mod(ir.AffineExpr.get_floor_div(n0, bn) + 1, 2)
        m_old, l_old, acc = state[0:2], state[2:4], list(state[4:])
        async_copy.wait(kb, 1)  # K(j) has landed (V(j) may still be in flight)
        self._barrier()
        more = kb.cmp_lt(kb.apply(n0 + bn), self.ub)
        with kb.if_(more):
            self._stage_k(n0 + bn, nxt)
        async_copy.commit(kb)
        s = self._scores(n0, slot)
        m_new, l_new, probs = [], [], [[None] * 4 for _ in range(bn // 8)]
        for h in range(2):  # the lane's two rows: elements 2h, 2h+1 of every tile
            xs = [s[t][2 * h + e] for t in range(bn // 8) for e in range(2)]
            mt = xs[0]
            for x in xs[1:]:
                mt = self._op("arith.maximumf", mt, x)
            mt = self._quad(mt, "arith.maximumf")
            mn, m_use, alpha = rescale(kb, m_old[h], mt, self.neg_inf, self.zero)
            lt = None
            for t in range(bn // 8):
                for e in range(2):
                    pv = exp(kb, self._op("arith.subf", s[t][2 * h + e], m_use))
                    probs[t][2 * h + e] = pv
                    lt = pv if lt is None else self._op("arith.addf", lt, pv)
            l_new.append(fma(kb, lt, l_old[h], alpha))  # the lane's partial sum
            m_new.append(mn)
            for d in range(self.dv_pad // 8):
                for e in range(2):
                    i = 4 * d + 2 * h + e
                    acc[i] = self._op("arith.mulf", acc[i], alpha)
        p_frags = [self.warp.a_from_acc(tuple(probs[2 * k]), tuple(probs[2 * k + 1]))
                   for k in range(bn // 16)]
        async_copy.wait(kb, 1)  # V(j) has landed (K(j+1) may still be in flight)
        self._barrier()
        with kb.if_(more):
            self._stage_v(n0 + bn, nxt)
        async_copy.commit(kb)
        acc = self._pv(p_frags, slot, acc)
        return m_new + l_new + acc

    def _scores(self, n0, slot) -> list[list[ir.Value]]:
        """X for the lane's accumulator elements of the tile's ``BLOCK_N / 8`` 16x8 tiles:
        S = Q Kᵀ on tensor cores, then the graph's pointwise ops per element."""
        kb, w, bn = self.kb, self.warp, self.bn
        tile_k = mma.SharedTile(self.smem, self.ldq, True, slot * self.k_size)
        accs = [w.zeros() for _ in range(bn // 8)]
        for s in range(self.d_pad // 16):
            for t in range(0, bn // 8, 2):
                pair = w.load_b(tile_k, 8 * t, 16 * s, tiles=min(2, bn // 8 - t))
                for u, b in enumerate(pair):
                    accs[t + u] = w.mma(self.q_frags[s], b, accs[t + u])

        def scores() -> list[ir.Value]:
            xs = []
            for t in range(bn // 8):
                for i in range(4):
                    key, key_ok = self._clamped(n0 + 8 * t + self.cols[i & 1], self.N, self.bn)
                    xs.append(self._score(accs[t][i], i // 2, key, key_ok))
            return xs

        below = below_diagonal(kb, self.att, self.m0, n0, bn)
        flat = scores_by_tile(kb, self.ev, self.att, below, 4 * (bn // 8), scores)
        return [flat[4 * t: 4 * t + 4] for t in range(bn // 8)]

    def _score(self, s: ir.Value, h: int, key, key_ok) -> ir.Value:
        """X at (row h of the lane, key) in f32: the graph's pointwise ops on S; -inf past
        the keys."""
        att, ev, kb = self.att, self.ev, self.kb
        ev.held = {att.s: Val(from_f32(kb, s, elem_type(att.s)), True)}
        x = ev.value(att.score, self._at(att.score_idx, m=self.rows[h], k=key)).ssa
        ev.held = {}
        x = to_f32(kb, x)
        return x if key_ok is None else select(kb, key_ok, x, self.neg_inf)

    def _pv(self, p_frags, slot, acc: list) -> list:
        """O += P V(j): per 16 keys, V fragments of two 8-column tiles per ldmatrix.trans."""
        w = self.warp
        tile_v = mma.SharedTile(self.smem, self.ldv, False, self.v_base + slot * self.v_size)
        n_acc = self.dv_pad // 8
        for k, pa in enumerate(p_frags):
            for d in range(0, n_acc, 2):
                pair = w.load_b(tile_v, 8 * d, 16 * k, tiles=min(2, n_acc - d))
                for u, b in enumerate(pair):
                    i = 4 * (d + u)
                    acc[i:i + 4] = w.mma(pa, b, tuple(acc[i:i + 4]))
        return acc

    def _store(self, ls, accs) -> None:
        """O = acc / l (0 for rows with no unmasked key) through the group's outputs, the
        lane's pairs of columns (one column when Dv is odd)."""
        kb, ev = self.kb, self.ev
        o_type = elem_type(self.p.o)
        invs = [reciprocal_or_zero(kb, self._quad(l, "arith.addf"), self.zero) for l in ls]
        lanes = 2 if self.Dv % 2 == 0 else 1
        vt = ir.VectorType.get([2], self.f32, loc=ir.Location.unknown(kb.ctx))
        for d in range(self.dv_pad // 8):
            for h in range(2):
                for e in range(0, 2, lanes):
                    with kb.at(kb.ip):
                        col = kb.apply(8 * d + self.cols[0] + e if e else 8 * d + self.cols[0])
                        ok = self.row_ok[h]
                        if self.dv_pad != self.Dv:
                            ok = kb.and_(ok, kb.cmp_lt(col, kb.index(self.Dv)))
                            col = kb.min_index(col, kb.index(self.Dv - lanes))
                        dc = kb.add_dim(col)
                        xs = [self._op("arith.mulf", accs[4 * d + 2 * h + e + x], invs[h])
                              for x in range(lanes)]
                        self._write(xs, self.rows[h], dc, ok, o_type, vt)

    def _write(self, xs, row, col, ok, o_type, vt) -> None:
        kb, p = self.kb, self.p
        ev = AttentionEvaluator(kb, self.group.func, self.leaves, lanes=len(xs), vdim=col.position)
        if len(xs) == 2:
            with kb.emitting():
                o = vector.from_elements(vt, xs)
            o_vt = ir.VectorType.get([2], o_type, loc=ir.Location.unknown(kb.ctx))
            val = Val(o if o_type == self.f32 else _trunc(kb, o, o_vt), False)
        else:
            val = Val(from_f32(kb, xs[0], o_type), True)
        ev.held = {p.o: val}
        for out, o_idx in p.outputs:
            idx = self._at(o_idx, m=row, n=col)
            v = ev.value(out.value, idx)
            leaf = p.group.output_leaf(out, p.group.result_param(kb.params, out.index))
            with kb.if_(ok) if ok is not None else contextlib.nullcontext():
                ev.store(leaf, idx, v)


def _trunc(kb: KernelBuilder, x: ir.Value, t: ir.Type) -> ir.Value:
    with kb.emitting():
        return arith.truncf(t, x)


__all__ = ["BLOCK_M", "TILES", "emit_attention_mma", "tile"]
