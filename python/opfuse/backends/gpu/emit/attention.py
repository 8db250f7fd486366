"""Attention kernels ("attention" groups): FlashAttention-2 forward, SIMT products.

A block of ``16 x 8`` threads owns ``BLOCK_M`` query rows of one (batch, head) — ``grid.x``
over query blocks, ``grid.y`` over batch x heads — and walks the keys in tiles of
``BLOCK_N`` (:func:`opfuse.cost.attention_tile`: tile sizes are target data):

1. Q's rows are staged in shared memory once (``[D][BLOCK_M]``, f32).
2. Per key tile: the K tile is staged (``[D][BLOCK_N]``); each thread computes its
   ``TR x TC`` scores S (``TR = BLOCK_M / 8`` rows, ``TC = BLOCK_N / 16`` keys) from
   shared memory; the graph's own pointwise ops (scale, masks) turn them into the scores
   X (the evaluator, with S given); keys past the end are ``-inf``.
3. Online softmax per row: the tile's max (butterfly over the 16 threads of a row), the
   new running max ``m``, ``alpha = exp(m_old - m)``, ``p = exp(x - m)``, the running sum
   ``l = l * alpha + sum(p)``, and the O accumulators scaled by ``alpha``. A row whose
   scores are all ``-inf`` so far uses 0 as its max, so it stays 0 (never NaN).
4. The V tile replaces K in shared memory (``[BLOCK_N][Dv]``) and the thread's ``p``
   values go to a ``[BLOCK_N][BLOCK_M]`` buffer; each thread accumulates its ``TR`` rows x
   ``ceil(Dv / 16)`` value columns of P·V in f32.
5. After the last tile, ``O = acc / l`` (0 where ``l = 0``: a fully masked row, as
   PyTorch's SDPA gives) is written once, through the group's outputs.

S and P never leave the chip. With a causal mask (keys ``n > m + c`` are ``-inf``,
recognized from the index comparisons) the loop stops at the block's last useful key
tile, and key tiles wholly below the diagonal evaluate the scores without the mask. Head dims up to 32, 64 and 128 have their own tiles; others (80, 96, ...) are
padded with zeros in shared memory to a multiple of 8 (the slower path), larger ones use
smaller tiles until Q, K/V and P fit the static shared memory. Sequence lengths need not
be multiples of the tiles: rows and keys are clamped for loads and masked for stores and
the softmax. Products accumulate in f32 for f32, f16 and bf16 inputs (SIMT FMAs). This
is the f32 kernel; f16 and bf16 groups get the tensor-core kernel of
:mod:`.attention_mma` first (mma.sync, cp.async) and this one where it does not apply
or ``matmul=simt`` asks for it.
"""

from __future__ import annotations

import contextlib
import math

from mlir import ir
from mlir.dialects import gpu, memref, vector

from .... import cost
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
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, Shared, delinearize, numel

TX, TY = cost.ATTENTION_THREADS
WARP = 32
#: Head-dim (and key) steps unrolled inside the product loops; head dims are padded to it.
UNROLL = 8


def _tile(group: Group, head: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for ``head`` on the target launch shapes are tuned for, shrunk
    until shared memory fits (the static 48 KiB every target has)."""
    tile = cost.attention_tile(group.options.target, head)
    bm, bn = tile.block_m, tile.block_n
    d = _pad(head)
    while _smem_bytes(bm, bn, d, d) > cost.ATTENTION_SMEM_BYTES and (bm > TY or bn > TX):
        if bm >= bn and bm > TY:
            bm //= 2
        else:
            bn //= 2
    return bm, bn


def _pad(d: int) -> int:
    return -(-d // UNROLL) * UNROLL


def _smem_bytes(bm: int, bn: int, d: int, dv: int) -> int:
    tx_cols = -(-dv // TX) * TX
    return 4 * (d * bm + max(d * bn, bn * tx_cols) + bn * bm)


def emit_attention(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    p = plan(group)
    att = p.att
    D, Dv, N, M = att.head_dim, att.value_dim, att.keys, att.queries
    bm, bn = _tile(group, max(D, Dv))
    tr, tc, td = bm // TY, bn // TX, -(-Dv // TX)
    d_pad, dv_pad = _pad(D), td * TX
    require(_smem_bytes(bm, bn, d_pad, Dv) <= cost.ATTENTION_SMEM_BYTES,
            f"head dim {D} too large for shared memory")
    G = numel(att.batch)
    grid = (-(-M // bm), G, 1)
    require(grid[0] <= 2**31 - 1 and grid[1] <= 65535, "too many blocks")
    f32 = ir.F32Type.get(module.context)
    shared = [Shared(d_pad * bm), Shared(max(d_pad * bn, bn * dv_pad)), Shared(bn * bm)]
    kb = KernelBuilder(module, name, group.params, grid, (TX, TY, 1), shared)
    q_s, kv_s, p_s = kb.shared
    ev = AttentionEvaluator(kb, group.func, group.leaves(kb.params))
    k = _Kernel(kb, ev, p, bm, bn, tr, tc, td, d_pad, dv_pad, f32)
    k.emit()
    kb.meta = kernel_meta(att, (bm, bn), (d_pad, dv_pad), None)  # for the estimate
    return kb


class _Kernel:
    """The state of one attention kernel being built (see the module docstring)."""

    def __init__(self, kb, ev, p: Plan, bm, bn, tr, tc, td, d_pad, dv_pad, f32):
        self.kb, self.ev, self.p, self.att = kb, ev, p, p.att
        self.bm, self.bn, self.tr, self.tc, self.td = bm, bn, tr, tc, td
        self.d_pad, self.dv_pad, self.f32 = d_pad, dv_pad, f32
        self.q_s, self.kv_s, self.p_s = kb.shared
        att = self.att
        self.D, self.Dv, self.N, self.M = att.head_dim, att.value_dim, att.keys, att.queries
        bx, by = kb.add_dim(kb.block_id[0]), kb.add_dim(kb.block_id[1])
        self.tx, self.ty = kb.add_dim(kb.thread_id[0]), kb.add_dim(kb.thread_id[1])
        self.tid = self.tx + self.ty * TX
        self.bx = bx
        self.batch = delinearize(by, list(att.batch)) if att.batch else []
        self.m0 = bx * bm
        self.rows, self.row_ok = [], []
        for i in range(tr):
            r, ok = self._clamped(self.m0 + self.ty * tr + i, self.M, bm)
            self.rows.append(r)
            self.row_ok.append(ok)
        self.neg_inf = kb.const(f32, -math.inf)
        self.zero = kb.const(f32, 0.0)

    # ----- helpers ----------------------------------------------------------------------
    def _clamped(self, e: ir.AffineExpr, size: int, tile: int):
        return clamped(self.kb, e, size, tile)

    def _vec(self, lanes: int) -> ir.VectorType:
        return ir.VectorType.get([lanes], self.f32, loc=ir.Location.unknown(self.kb.ctx))

    def _at(self, exprs, **roles):
        return at(self.kb, self.att, exprs, roles, self.batch)

    def _load(self, value: ir.Value, exprs, **roles) -> ir.Value:
        return to_f32(self.kb, self.ev.value(value, self._at(exprs, **roles)).ssa)

    def _op(self, name: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return binary(self.kb, name, a, b)

    def _fma(self, acc, a, b):
        return fma(self.kb, acc, a, b)

    def _select(self, c, a, b):
        return select(self.kb, c, a, b)

    def _exp(self, x):
        return exp(self.kb, x)

    def _barrier(self):
        with self.kb.emitting():
            gpu.barrier()

    def _stage(self, rows: int, cols: int, store_index, fetch, loop: bool = False) -> None:
        """Every thread copies its share of a ``rows x cols`` tile (``cols`` fastest, so
        consecutive threads read consecutive head-dim or value columns) into shared
        memory: ``fetch(row, col) -> f32 value``, stored at ``store_index(row, col)``.
        Unrolled, or with ``loop`` (an operand the group computes: a RoPE prologue, whose
        unrolled loads ptxas would schedule all at once) one element per iteration."""
        kb = self.kb
        n_threads = TX * TY
        slots = rows * cols

        def one(s, partial: bool) -> None:
            guard = kb.cmp_lt(kb.apply(s), kb.index(slots)) if partial else None
            with kb.if_(guard) if guard is not None else contextlib.nullcontext():
                r = kb.add_dim(kb.apply(ir.AffineExpr.get_floor_div(s, cols)))
                c = kb.add_dim(kb.apply(ir.AffineExpr.get_mod(s, cols)))
                x, mem = fetch(r, c)
                addr = kb.apply(store_index(r, c))
                with kb.emitting():
                    memref.store(x, mem, [addr])

        if loop:
            def body(iv, _):
                one(self.tid + kb.add_dim(iv) * n_threads, slots % n_threads != 0)
                return []

            kb.for_(kb.index(0), kb.index(-(-slots // n_threads)), kb.index(1), [], body)
            return
        for first in range(0, slots, n_threads):
            with kb.at(kb.ip):
                one(self.tid + first if first else self.tid, first + n_threads > slots)

    def _computed(self, value: ir.Value, exprs, roles) -> bool:
        """Whether the group computes ``value`` (a prologue) rather than reading it as a
        view of a kernel parameter."""
        kb = self.kb
        probe = AttentionEvaluator(kb, self.p.group.func, self.ev.leaves)
        with kb.at(kb.ip):
            z = kb.add_dim(kb.index(0))
            return probe.source(value, self._at(exprs, **{r: z for r in roles})) is None

    def _padded(self, c: ir.AffineExpr, size: int, padded: int, load) -> ir.Value:
        """``load(clamped c)``, or 0 past ``size`` (the zero padding of a head dim)."""
        kb = self.kb
        if padded == size:
            return load(c)
        v = kb.apply(c)
        ok = kb.cmp_lt(v, kb.index(size))
        x = load(kb.add_dim(kb.min_index(v, kb.index(size - 1))))
        return self._select(ok, x, self.zero)

    def _butterfly(self, x: ir.Value, combine: str) -> ir.Value:
        """``x`` combined over the 16 threads of a row (lanes differing in the low 4 bits
        of the lane id: one half-warp)."""
        i32 = ir.IntegerType.get_signless(32, self.kb.ctx)
        off = TX // 2
        while off >= 1:
            with self.kb.emitting():
                other = gpu.shuffle(x, self.kb.const(i32, off), self.kb.const(i32, WARP),
                                    gpu.ShuffleMode.XOR)[0]
            x = self._op(combine, x, other)
            off //= 2
        return x

    # ----- the kernel -------------------------------------------------------------------
    def emit(self) -> None:
        kb, att = self.kb, self.att
        self._stage_q()
        self._barrier()
        vt = self._vec(self.td) if self.td > 1 else self.f32
        zero_acc = kb.const(vt, 0.0)
        inits = [self.neg_inf] * self.tr + [self.zero] * self.tr + [zero_acc] * self.tr
        ub = self._key_bound()
        finals = kb.for_(kb.index(0), ub, kb.index(self.bn), inits, self._tile_body)
        ls = finals[self.tr: 2 * self.tr]
        accs = finals[2 * self.tr:]
        self._store(ls, accs)

    def _stage_q(self) -> None:
        att, bm, d_pad = self.att, self.bm, self.d_pad

        def fetch(r, c):
            row, _ = self._clamped(self.m0 + r, self.M, bm)
            x = self._padded(c, self.D, d_pad, lambda h: self._load(att.q, att.q_idx, m=row, head=h))
            return x, self.q_s

        self._stage(bm, d_pad, lambda r, c: c * bm + r, fetch,
                    loop=self._computed(att.q, att.q_idx, ("m", "head")))

    def _key_bound(self) -> ir.Value:
        return key_bound(self.kb, self.att.causal, self.m0, self.bm, self.N)

    def _tile_body(self, iv, state):
        kb, att, tr, tc = self.kb, self.att, self.tr, self.tc
        n0 = kb.add_dim(iv)
        m_old, l_old, acc = state[:tr], state[tr: 2 * tr], state[2 * tr:]
        self._stage_k(n0)
        self._barrier()
        s = self._scores()

        def scores() -> list[ir.Value]:
            keys, key_ok = [], []
            for j in range(tc):
                key, ok = self._clamped(n0 + self.tx * tc + j, self.N, self.bn)
                keys.append(key)
                key_ok.append(ok)
            return [self._score(s[i][j], i, keys[j], key_ok[j]) for i in range(tr) for j in range(tc)]

        below = below_diagonal(kb, att, self.m0, n0, self.bn)
        flat = scores_by_tile(kb, self.ev, att, below, tr * tc, scores)
        x = [flat[i * tc: (i + 1) * tc] for i in range(tr)]
        m_new, l_new, probs = [], [], []
        for i in range(tr):
            mt = x[i][0]
            for j in range(1, tc):
                mt = self._op("arith.maximumf", mt, x[i][j])
            mt = self._butterfly(mt, "arith.maximumf")
            mn, m_use, alpha = rescale(kb, m_old[i], mt, self.neg_inf, self.zero)
            row_p = [self._exp(self._op("arith.subf", x[i][j], m_use)) for j in range(tc)]
            lt = row_p[0]
            for j in range(1, tc):
                lt = self._op("arith.addf", lt, row_p[j])
            lt = self._butterfly(lt, "arith.addf")
            l_new.append(self._fma(lt, l_old[i], alpha))
            acc[i] = self._op("arith.mulf", acc[i], self._splat(alpha))
            m_new.append(mn)
            probs.append(row_p)
        self._barrier()  # every thread is done with the K tile
        self._stage_v(n0)
        self._stage_p(probs)
        self._barrier()
        acc = self._pv(acc)
        self._barrier()  # the next tile's K and P overwrite these buffers
        return m_new + l_new + acc

    def _splat(self, x: ir.Value) -> ir.Value:
        if self.td == 1:
            return x
        with self.kb.emitting():
            return vector.broadcast(self._vec(self.td), x)

    def _stage_k(self, n0) -> None:
        att = self.att
        self._stage_kv(n0, att.k, att.k_idx, "head", self.D, self.d_pad,
                       lambda r, c: c * self.bn + r)  # [D][BLOCK_N]

    def _stage_v(self, n0) -> None:
        att = self.att
        self._stage_kv(n0, att.v, att.v_idx, "n", self.Dv, self.dv_pad,
                       lambda r, c: r * self.dv_pad + c)  # [BLOCK_N][Dv]

    def _stage_kv(self, n0, value, exprs, role: str, size: int, padded: int, index) -> None:
        """The key tile at ``n0`` of K or V (``size`` columns along ``role``, zero-padded
        to ``padded``) into the K/V buffer at ``index(key, column)``."""

        def fetch(r, c):
            key, _ = self._clamped(n0 + r, self.N, self.bn)
            x = self._padded(c, size, padded, lambda d: self._load(value, exprs, k=key, **{role: d}))
            return x, self.kv_s

        self._stage(self.bn, padded, index, fetch, loop=self._computed(value, exprs, ("k", role)))

    def _scores(self) -> list[list[ir.Value]]:
        """S for the thread's TR x TC (row, key) points: a loop over the head dim in steps
        of UNROLL, reading Q and K vectors from shared memory."""
        kb, tr, tc, bm, bn = self.kb, self.tr, self.tc, self.bm, self.bn
        qt = self._vec(tr)
        kt = self._vec(tc)

        def body(iv, s):
            h0 = kb.add_dim(iv)
            s = list(s)
            for u in range(UNROLL):
                h = h0 + u if u else h0
                qa = kb.apply(h * bm + self.ty * tr)
                ka = kb.apply(h * bn + self.tx * tc)
                with kb.emitting():
                    qv = vector.load(qt, self.q_s, [qa], alignment=_align(tr))
                    kv = vector.load(kt, self.kv_s, [ka], alignment=_align(tc))
                    qs = [vector.extract(qv, [], [i]) for i in range(tr)]
                    ks = [vector.extract(kv, [], [j]) for j in range(tc)]
                for i in range(tr):
                    for j in range(tc):
                        s[i * tc + j] = self._fma(s[i * tc + j], qs[i], ks[j])
            return s

        flat = kb.for_(kb.index(0), kb.index(self.d_pad), kb.index(UNROLL),
                       [self.zero] * (tr * tc), body)
        return [flat[i * tc: (i + 1) * tc] for i in range(tr)]

    def _score(self, s: ir.Value, i: int, key, key_ok) -> ir.Value:
        """X at (row i, key) in f32: the graph's pointwise ops on S; -inf past the keys."""
        att, ev = self.att, self.ev
        ev.held = {att.s: Val(from_f32(self.kb, s, elem_type(att.s)), True)}
        x = ev.value(att.score, self._at(att.score_idx, m=self.rows[i], k=key)).ssa
        ev.held = {}
        x = to_f32(self.kb, x)
        return x if key_ok is None else self._select(key_ok, x, self.neg_inf)

    def _stage_p(self, probs) -> None:
        """The thread's p values into the ``[BLOCK_N][BLOCK_M]`` buffer (rounded to the
        element type P has in the graph when it is cast before P·V, as the tensor-core
        kernels round it)."""
        kb, att = self.kb, self.att
        for i in range(self.tr):
            for j in range(self.tc):
                x = probs[i][j]
                if att.probs_type is not None:
                    x = to_f32(kb, from_f32(kb, x, att.probs_type))
                addr = kb.apply((self.tx * self.tc + j) * self.bm + self.ty * self.tr + i)
                with kb.emitting():
                    memref.store(x, self.p_s, [addr])

    def _pv(self, acc: list[ir.Value]) -> list[ir.Value]:
        kb, tr, td, bm = self.kb, self.tr, self.td, self.bm
        pt = self._vec(tr)
        vt = self._vec(td) if td > 1 else self.f32

        def body(iv, acc):
            j0 = kb.add_dim(iv)
            acc = list(acc)
            for u in range(min(UNROLL, self.bn)):
                j = j0 + u if u else j0
                pa = kb.apply(j * bm + self.ty * tr)
                va = kb.apply(j * self.dv_pad + self.tx * td)
                with kb.emitting():
                    pv = vector.load(pt, self.p_s, [pa], alignment=_align(tr))
                    if td > 1:
                        vv = vector.load(vt, self.kv_s, [va], alignment=_align(td))
                    else:
                        vv = memref.load(self.kv_s, [va])
                    ps = [vector.extract(pv, [], [i]) for i in range(tr)]
                for i in range(tr):
                    acc[i] = self._fma(acc[i], self._splat(ps[i]), vv)
            return acc

        step = min(UNROLL, self.bn)
        return kb.for_(kb.index(0), kb.index(self.bn), kb.index(step), acc, body)

    def _store(self, ls, accs) -> None:
        """O = acc / l (0 for rows with no unmasked key), through the group's outputs."""
        kb, att, ev, td = self.kb, self.att, self.ev, self.td
        o_type = elem_type(self.p.o)
        for i in range(self.tr):
            inv = reciprocal_or_zero(kb, ls[i], self.zero)
            o_row = self._op("arith.mulf", accs[i], self._splat(inv))
            for d in range(td):
                col = self.tx * td + d
                dv_ok = None
                if self.dv_pad != self.Dv:
                    dv_ok = kb.cmp_lt(kb.apply(col), kb.index(self.Dv))
                    col = kb.add_dim(kb.min_index(kb.apply(col), kb.index(self.Dv - 1)))
                with kb.emitting():
                    o = vector.extract(o_row, [], [d]) if td > 1 else o_row
                ev.held = {self.p.o: Val(from_f32(kb, o, o_type), True)}
                pred = kb.and_(self.row_ok[i], dv_ok)
                for out, o_idx in self.p.outputs:
                    idx = self._at(o_idx, m=self.rows[i], n=col)
                    val = ev.value(out.value, idx)
                    leaf = self.p.group.output_leaf(out, self.p.group.result_param(kb.params, out.index))
                    with kb.if_(pred) if pred is not None else contextlib.nullcontext():
                        ev.store(leaf, idx, val)
                ev.held = {}


def _align(lanes: int) -> int:
    """The alignment a vector of ``lanes`` f32 at a multiple of ``lanes`` has (<= 16 B)."""
    b = 4 * lanes
    return min(16, b & -b)


__all__ = ["emit_attention"]
