"""The emulator's tensor-core and async-copy operations (see :mod:`opfuse.testing.emulator.emulate`).

Semantics written from the PTX ISA (9.7.9.25 cp.async, 9.7.14.5 warp-level matrix
fragments, ldmatrix, mma), independently of the emitters that use them
(:mod:`opfuse.backends.gpu.build.mma`), and checked on their own against hand-made examples from the
ISA's tables (test/unit/test_emulate_mma.py):

* ``nvgpu.ldmatrix``: each lane gives the address of one 16-byte row (lanes ``8j..8j+7``
  the rows of matrix ``j``); lane ``l`` receives, for each matrix, elements ``2(l%4)``
  and ``2(l%4)+1`` of row ``l/4`` (one 32-bit element ``l%4`` for 32-bit types), or with
  ``.trans`` elements ``(2(l%4), l/4)`` and ``(2(l%4)+1, l/4)``. Warp-collective: a warp
  executes it with all of its lanes or none. Each row must be 16-byte aligned. The rows of
  one matrix are read in one shared-memory phase; rows that share a bank group cost extra
  wavefronts, counted in :attr:`MmaStats.ldmatrix_wavefronts` (a conflict-free read costs
  one per matrix).
* ``nvvm.mma.sync`` (m16n8k16 f16/bf16, m16n8k8 tf32, row.col, f32 accumulators):
  gathers each warp's fragments into A (16 x k), B (k x 8) and C (16 x 8) by the ISA's
  fragment tables, computes ``D = A B + C`` (products exact, sum in float64, rounded to
  f32) and scatters D back; TF32 operands keep the upper 19 bits of their f32 pattern.
* ``nvvm.convert.float.to.tf32`` (``cvt.rna.tf32.f32``): round to nearest, ties away.
* ``nvgpu.device_async_copy`` (``cp.async``): copies ``srcElements`` elements (default:
  all ``dstElements``) from global memory and zero-fills the rest of the destination; the
  copy is *in flight* until the issuing thread's ``cp.async.wait_group`` covers its group:
  only then does the data land in shared memory. ``nvgpu.device_async_create_group``
  commits the thread's uncommitted copies as one group (possibly empty);
  ``nvgpu.device_async_wait {numGroups = N}`` completes all but the N most recent groups.
  With the race check on, reading or overwriting an element while a copy into it is in
  flight is an error, the copy counts as a write of the issuing thread both when it is
  issued (so it must not overtake another thread's read of the old data: the barrier
  before re-filling a stage) and when it lands (so other threads may read it only after a
  barrier).
* ``vector.bitcast``, ``arith.bitcast`` (bit patterns, element 0 in the low bits),
  ``llvm.extractvalue`` of the mma result, ``vector.extract`` of n-D vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mlir import ir

from ...errors import EXIT_INTERNAL_ERROR, OpfuseError

WARP = 32

# ----- fragment tables (PTX ISA 9.7.14.5.7, 9.7.14.5.8) -----------------------------------
# For each register r of a lane, the (row, col) offsets of its elements from the lane's
# anchor (groupID = lane >> 2 along one dim, threadID_in_group = lane % 4 along the other,
# scaled by the elements per register): the ISA's formulas regrouped by register.


def _lanes():
    lane = np.arange(WARP)
    return lane >> 2, lane % 4  # groupID, threadID_in_group


def a_coords(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of shape (32, elements per lane) of each lane's A elements, in order."""
    g, t = _lanes()
    if kind in ("f16", "bf16"):  # a0..a7: registers (a0 a1) (a2 a3) (a4 a5) (a6 a7)
        reg_rows, reg_cols = (0, 8, 0, 8), (0, 0, 8, 8)
        rows = [g + reg_rows[r] for r in range(4) for _ in range(2)]
        cols = [2 * t + e + reg_cols[r] for r in range(4) for e in range(2)]
    elif kind == "tf32":  # a0..a3: (g, t) (g+8, t) (g, t+4) (g+8, t+4)
        rows = [g, g + 8, g, g + 8]
        cols = [t, t, t + 4, t + 4]
    else:
        raise OpfuseError(f"emulator: mma operand type {kind}")
    return np.stack(rows, 1), np.stack(cols, 1)


def b_coords(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows = k, cols = n) of each lane's B elements, shape (32, elements per lane)."""
    g, t = _lanes()
    if kind in ("f16", "bf16"):  # b0..b3: (2t, g) (2t+1, g) (2t+8, g) (2t+9, g)
        rows = [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]
        cols = [g] * 4
    elif kind == "tf32":  # b0, b1: (t, g) (t+4, g)
        rows = [t, t + 4]
        cols = [g, g]
    else:
        raise OpfuseError(f"emulator: mma operand type {kind}")
    return np.stack(rows, 1), np.stack(cols, 1)


def c_coords() -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of each lane's f32 accumulators c0..c3, shape (32, 4)."""
    g, t = _lanes()
    return np.stack([g, g, g + 8, g + 8], 1), np.stack([2 * t, 2 * t + 1] * 2, 1)


# ----- bit patterns -------------------------------------------------------------------------


def to_bits(x: np.ndarray, elem: str) -> np.ndarray:
    """The emulator's values of MLIR type ``elem`` as unsigned bit patterns."""
    if elem == "bf16":
        f = np.asarray(x, np.float32).view(np.uint32)
        return (f >> np.uint32(16)).astype(np.uint16)
    width = _WIDTH[elem]
    if elem.startswith("f"):
        return np.asarray(x, _FLOAT[elem]).view(_UINT[width])
    return np.asarray(x).astype(_SINT[width]).view(_UINT[width])


def from_bits(bits: np.ndarray, elem: str) -> np.ndarray:
    """Bit patterns as the emulator's values of MLIR type ``elem``."""
    if elem == "bf16":
        return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    width = _WIDTH[elem]
    raw = np.asarray(bits, _UINT[width])
    if elem.startswith("f"):
        return raw.view(_FLOAT[elem])
    out = raw.view(_SINT[width])
    return out.astype(np.bool_) if elem == "i1" else out


_WIDTH = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i8": 8, "i16": 16, "i32": 32, "i64": 64}
_FLOAT = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


def bitcast_lanes(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Reinterpret the last axis of ``x`` (elements of ``src``) as elements of ``dst``
    (element 0 in the lowest bits, as on the GPU)."""
    bits = np.ascontiguousarray(to_bits(x, src))
    return from_bits(bits.view(_UINT[_WIDTH[dst]]), dst)


def tf32_rna(x: np.ndarray) -> np.ndarray:
    """``cvt.rna.tf32.f32``: f32 rounded to 10 mantissa bits, ties away from zero; the
    result's bit pattern (low 13 bits zero) as int32. NaN and infinity are kept."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    keep = ~np.isfinite(np.asarray(x, np.float32))
    return np.where(keep, bits, rounded).view(np.int32)


# ----- statistics ---------------------------------------------------------------------------


@dataclass
class MmaStats:
    """What the tensor-core ops of one emulator did (summed over its launches)."""

    ldmatrix_matrices: int = 0  # 8x8 matrices read (one shared-memory phase each)
    ldmatrix_wavefronts: int = 0  # phases they cost (== matrices when conflict-free)
    mma: int = 0  # warp-level mma instructions executed
    wgmma: int = 0  # warpgroup-level wgmma.mma_async instructions executed
    cp_async: int = 0  # thread-level copies issued
    shared_loads: int = 0  # warp-level scalar shared loads (with Emulator(bank_stats=True))
    shared_load_wavefronts: int = 0  # the shared-memory phases they cost


# ----- the ops ------------------------------------------------------------------------------


def _fail(msg: str) -> None:
    raise OpfuseError(f"emulator: {msg}", exit_code=EXIT_INTERNAL_ERROR)


def _per_thread(x, shape: tuple, n: int) -> np.ndarray:
    """A value as a per-thread array ``(n,) + shape`` (constants have no thread axis)."""
    x = np.asarray(x)
    if x.ndim == len(shape):
        return np.broadcast_to(x, (n,) + tuple(shape))
    return x


def _warp_mask(mask: np.ndarray, L, what: str) -> np.ndarray:
    """The active warps of a warp-collective op (each warp entirely active or not)."""
    m = np.broadcast_to(mask, (L.n,)).reshape(-1, WARP)
    active = m.any(axis=1)
    partial = active & ~m.all(axis=1)
    if partial.any():
        w = int(np.argmax(partial))
        _fail(
            f"{what} in kernel {L.kernel} executed by part of warp {w} "
            f"({int(m[w].sum())} of 32 lanes): it is warp-collective (.sync.aligned)"
        )
    return active


def _elem_name(t: ir.Type) -> str:
    t = ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t
    if isinstance(t, ir.MemRefType):
        t = t.element_type
    return str(t)


def ldmatrix(emu, op: ir.Operation, env: dict, mask: np.ndarray, L) -> None:
    mem = env[op.operands[0]]
    if mem[0] != "smem":
        _fail(f"nvgpu.ldmatrix in kernel {L.kernel} reads global memory")
    k = mem[1]
    arr = L.shared[k]
    elem = _elem_name(op.operands[0].type)
    esize = _WIDTH[elem] // 8
    count = ir.IntegerAttr(op.attributes["numTiles"]).value
    trans = bool(ir.BoolAttr(op.attributes["transpose"]).value)
    per = 4 // esize  # elements of one lane's register
    row_len = 16 // esize
    if trans and esize != 2:
        _fail("ldmatrix .trans of 32-bit elements (it transposes 16-bit elements)")
    out_shape = (L.n, count, per)
    active = _warp_mask(mask, L, "nvgpu.ldmatrix")
    out = np.zeros(out_shape, np.float32 if elem == "bf16" else _FLOAT.get(elem, np.float32))
    if not active.any():
        env[op.results[0]] = out
        return
    idx = np.broadcast_to(np.asarray(env[op.operands[1]]), (L.n,)).reshape(-1, WARP)[active]
    rows_addr = idx[:, : 8 * count].reshape(-1, count, 8)  # (warps, matrix, row)
    if np.any((rows_addr * esize) % 16):
        _fail(f"nvgpu.ldmatrix in kernel {L.kernel}: a row address is not 16-byte aligned")
    if np.any(rows_addr < 0) or np.any(rows_addr + row_len > arr.shape[1]):
        _fail(f"nvgpu.ldmatrix in kernel {L.kernel}: a row out of bounds of workgroup buffer {k}")
    block = L.block_linear.reshape(-1, WARP)[active, 0]
    cols = np.arange(row_len)
    data = arr[block[:, None, None, None], rows_addr[..., None] + cols]  # (w, count, 8, row_len)
    if arr.dtype == np.uint16 and elem == "bf16":
        data = from_bits(data, "bf16")
    g, t = _lanes()
    if not trans:  # lane l: row g, elements per*t .. per*t + per - 1
        src_row = np.repeat(g[:, None], per, 1)
        src_col = per * t[:, None] + np.arange(per)
    else:  # lane l: elements (2t + e, g)
        src_row = 2 * t[:, None] + np.arange(per)
        src_col = np.repeat(g[:, None], per, 1)
    frag = data[:, :, src_row, src_col]  # (w, count, 32, per)
    full = out.reshape(-1, WARP, count, per)
    full[active] = frag.transpose(0, 2, 1, 3)
    env[op.results[0]] = out
    # the elements each lane receives, for the race check: (threads, count * per)
    addr = rows_addr[:, :, src_row] + src_col  # (w, count, 32, per)
    addr_full = np.zeros((L.n // WARP, WARP, count * per), np.int64)
    addr_full[active] = addr.transpose(0, 2, 1, 3).reshape(-1, WARP, count * per)
    emu._track(mem, addr_full.reshape(L.n, -1), np.broadcast_to(mask, (L.n,)), L, op.name, False)
    # bank groups: the 8 rows of one matrix are one phase; distinct rows in one group
    # of 16 bytes (mod 128) are served one after the other
    slot = (rows_addr * esize % 128) // 16
    waves = 0
    for s in range(8):
        same = slot == s
        distinct = np.where(same, rows_addr, -1)
        srt = np.sort(distinct, axis=-1)
        n_distinct = ((srt[..., 1:] != srt[..., :-1]) & (srt[..., 1:] >= 0)).sum(-1) + (
            srt[..., 0] >= 0
        )
        waves = np.maximum(waves, n_distinct)
    emu.stats.ldmatrix_matrices += int(rows_addr.shape[0] * count)
    emu.stats.ldmatrix_wavefronts += int(np.sum(waves))


def count_banks(stats: MmaStats, addr: np.ndarray, mask: np.ndarray, itemsize: int) -> None:
    """Bank conflicts of one scalar shared load (elements of at most 4 bytes): per warp,
    the most distinct 4-byte words any of the 32 banks must serve (lanes reading the same
    word are served at once)."""
    m = np.broadcast_to(mask, addr.shape).reshape(-1, WARP)
    words = (addr.astype(np.int64) * itemsize // 4).reshape(-1, WARP)
    keys = np.where(m, (words % 32) * (1 << 40) + words, -1)
    keys.sort(axis=1)
    first = np.ones_like(keys, dtype=bool)
    first[:, 1:] = keys[:, 1:] != keys[:, :-1]
    first &= keys >= 0
    per_bank = np.zeros((keys.shape[0], 32), np.int64)
    rows = np.repeat(np.arange(keys.shape[0]), WARP).reshape(keys.shape)
    np.add.at(per_bank, (rows[first], (keys[first] >> 40)), 1)
    active = m.any(axis=1)
    stats.shared_loads += int(active.sum())
    stats.shared_load_wavefronts += int(per_bank.max(axis=1)[active].sum())


def _unpack(reg: np.ndarray, ptx: str, n: int) -> np.ndarray:
    """One operand register per thread as its elements, float64, shape (n, per)."""
    if ptx == "f16":
        return _per_thread(reg, (2,), n).astype(np.float64)
    bits = _per_thread(reg, (), n).astype(np.int64) & 0xFFFFFFFF
    if ptx == "bf16":
        lo = from_bits((bits & 0xFFFF).astype(np.uint16), "bf16")
        hi = from_bits((bits >> 16).astype(np.uint16), "bf16")
        return np.stack([lo, hi], 1).astype(np.float64)
    if ptx == "tf32":  # the tensor core reads the upper 19 bits
        kept = (bits & 0xFFFFE000).astype(np.uint32).view(np.float32)
        return kept[:, None].astype(np.float64)
    _fail(f"nvvm.mma.sync operand type {ptx}")


def mma_sync(emu, op: ir.Operation, env: dict, mask: np.ndarray, L) -> None:
    shape = str(op.attributes["shape"])
    m, n_, k = (int(shape.split(f"{d} = ")[1].split(",")[0].rstrip(">")) for d in "mnk")
    seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    ops = list(op.operands)
    a_regs, b_regs, c_regs = ops[: seg[0]], ops[seg[0] : seg[0] + seg[1]], ops[seg[0] + seg[1] :]
    ptx = str(op.attributes["multiplicandAPtxType"]).split("<")[-1].rstrip(">")
    if "multiplicandBPtxType" in op.attributes:
        if str(op.attributes["multiplicandBPtxType"]).split("<")[-1].rstrip(">") != ptx:
            _fail("nvvm.mma.sync with different A and B types")
    layout_a = str(op.attributes["layoutA"]).split("<")[-1].rstrip(">")
    layout_b = str(op.attributes["layoutB"]).split("<")[-1].rstrip(">")
    want = {"f16": (16, 8, 16), "bf16": (16, 8, 16), "tf32": (16, 8, 8)}.get(ptx)
    if (m, n_, k) != want or (layout_a, layout_b) != ("row", "col") or len(c_regs) != 4:
        _fail(f"nvvm.mma.sync m{m}n{n_}k{k} {ptx} {layout_a}.{layout_b} is not emulated")
    N = L.n
    active = _warp_mask(mask, L, "nvvm.mma.sync")
    a = np.concatenate([_unpack(env[v], ptx, N) for v in a_regs], 1)  # (N, elems)
    b = np.concatenate([_unpack(env[v], ptx, N) for v in b_regs], 1)
    c = np.stack([_per_thread(env[v], (), N).astype(np.float64) for v in c_regs], 1)
    W = N // WARP
    ar, ac = a_coords(ptx)
    br, bc = b_coords(ptx)
    cr, cc = c_coords()
    A = np.zeros((W, m, k))
    B = np.zeros((W, k, n_))
    C = np.zeros((W, m, n_))
    A[:, ar, ac] = a.reshape(W, WARP, -1)
    B[:, br, bc] = b.reshape(W, WARP, -1)
    C[:, cr, cc] = c.reshape(W, WARP, -1)
    D = (A @ B + C).astype(np.float32)
    d = D[:, cr, cc].reshape(N, 4)  # (N, 4)
    d[~np.repeat(active, WARP)] = 0
    env[op.results[0]] = tuple(d[:, i] for i in range(4))
    emu.stats.mma += int(active.sum())


def extractvalue(emu, op: ir.Operation, env: dict, mask, L) -> None:
    pos = list(ir.DenseI64ArrayAttr(op.attributes["position"]))
    x = env[op.operands[0]]
    for p in pos:
        x = x[p]
    env[op.results[0]] = x


def tf32(emu, op: ir.Operation, env: dict, mask, L) -> None:
    rnd = str(op.attributes["rnd"]) if "rnd" in op.attributes else "none"
    if "rna" not in rnd:
        _fail(f"nvvm.convert.float.to.tf32 with rounding {rnd} is not emulated")
    env[op.results[0]] = tf32_rna(np.asarray(env[op.operands[0]]))


def vector_bitcast(emu, op: ir.Operation, env: dict, mask, L) -> None:
    src, dst = _elem_name(op.operands[0].type), _elem_name(op.results[0].type)
    env[op.results[0]] = bitcast_lanes(np.asarray(env[op.operands[0]]), src, dst)


def arith_bitcast(emu, op: ir.Operation, env: dict, mask, L) -> None:
    src, dst = _elem_name(op.operands[0].type), _elem_name(op.results[0].type)
    x = np.asarray(env[op.operands[0]])
    env[op.results[0]] = from_bits(to_bits(x, src), dst)


def vector_extract(emu, op: ir.Operation, env: dict, mask, L) -> None:
    """``vector.extract`` with static positions, from vectors of any rank."""
    vt = ir.VectorType(op.operands[0].type)
    pos = list(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
    if any(p < 0 for p in pos):
        _fail("vector.extract with a dynamic position")
    x = np.asarray(env[op.operands[0]])
    per_thread = x.ndim == vt.rank + 1
    env[op.results[0]] = x[(slice(None), *pos)] if per_thread else x[tuple(pos)]


# ----- cp.async ---------------------------------------------------------------------------


class AsyncCopies:
    """The cp.async copies of one launch that have not landed, and each thread's groups."""

    def __init__(self, L):
        self.L = L
        self.committed = np.zeros(L.n, np.int64)  # groups each thread has committed
        # each copy op's threads: buffer, thread ids, addresses (t, E), values (t, E),
        # group per thread (-1: not committed yet)
        self.pending: list[dict] = []
        self.inflight: dict[int, np.ndarray] = {}  # buffer -> (blocks, size) issuing thread or -1

    def issue(self, k: int, threads, addr, values, op: str, racecheck) -> None:
        L = self.L
        if racecheck is not None:
            self.check(k, addr, threads, op, write=True)
            racecheck.on_write(k, _rows(L, threads, addr), _mask(L, threads), op)
        if getattr(L, "wgmma", None) is not None:  # not into shared memory a wgmma reads
            L.wgmma.on_write(k, _rows(L, threads, addr), _mask(L, threads), op, landed=False)
        fl = self.inflight.setdefault(k, np.full(L.shared[k].shape, -1, np.int64))
        fl[L.block_linear[threads][:, None], addr] = threads[:, None]
        self.pending.append(
            dict(k=k, threads=threads, addr=addr, values=values, group=np.full(len(threads), -1))
        )

    def commit(self, mask: np.ndarray) -> None:
        for p in self.pending:
            open_ = (p["group"] < 0) & mask[p["threads"]]
            p["group"][open_] = self.committed[p["threads"][open_]]
        self.committed[mask] += 1

    def wait(self, keep: int, mask: np.ndarray, racecheck, op: str) -> None:
        L = self.L
        still = []
        for p in self.pending:
            th = p["threads"]
            done = (p["group"] >= 0) & (p["group"] < self.committed[th] - keep) & mask[th]
            if done.any():
                t, a = th[done], p["addr"][done]
                arr = L.shared[p["k"]]
                v = p["values"][done]
                arr[L.block_linear[t][:, None], a] = v
                self.inflight[p["k"]][L.block_linear[t][:, None], a] = -1
                if racecheck is not None:
                    racecheck.on_write(p["k"], _rows(L, t, a), _mask(L, t), op)
                if getattr(L, "wgmma", None) is not None:  # a generic-proxy write lands
                    L.wgmma.on_write(p["k"], _rows(L, t, a), _mask(L, t), op)
            if not done.all():
                rest = ~done
                still.append({**p, "threads": th[rest], "addr": p["addr"][rest],
                              "values": p["values"][rest], "group": p["group"][rest]})
        self.pending = still

    def check(self, k: int, addr: np.ndarray, threads: np.ndarray, op: str, write: bool) -> None:
        """No access to an element a copy is still being made into."""
        fl = self.inflight.get(k)
        if fl is None:
            return
        owner = fl[self.L.block_linear[threads][:, None], addr]
        bad = owner >= 0
        if bad.any():
            i, j = np.argwhere(bad)[0]
            block, who = self.L.where(int(threads[i]))
            _, src = self.L.where(int(owner[i, j]))
            _fail(
                f"shared-memory race in kernel {self.L.kernel}: thread {who} of block {block} "
                f"{'writes' if write else 'reads'} element {int(addr[i, j])} of workgroup "
                f"buffer {k} ({op}) while a cp.async of thread {src} into it is still in "
                "flight (no cp.async.wait_group covers it)"
            )


def _rows(L, threads: np.ndarray, addr: np.ndarray) -> np.ndarray:
    out = np.zeros((L.n, addr.shape[1]), np.int64)
    out[threads] = addr
    return out


def _mask(L, threads: np.ndarray) -> np.ndarray:
    m = np.zeros(L.n, bool)
    m[threads] = True
    return m


def _copies(L) -> AsyncCopies:
    if getattr(L, "copies", None) is None:
        L.copies = AsyncCopies(L)
    return L.copies


def async_copy(emu, op: ir.Operation, env: dict, mask: np.ndarray, L) -> None:
    seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    ops = list(op.operands)
    dst_v, dst_idx = ops[0], ops[1 : 1 + seg[1]]
    at = 1 + seg[1]
    src_v, src_idx = ops[at], ops[at + 1 : at + 1 + seg[3]]
    at += 1 + seg[3]
    n_src = ops[at] if seg[4] else None
    E = ir.IntegerAttr(op.attributes["dstElements"]).value
    if len(dst_idx) != 1 or len(src_idx) != 1:
        _fail("nvgpu.device_async_copy on multi-dimensional memrefs is not emulated")
    dst, src = env[dst_v], env[src_v]
    if dst[0] != "smem" or src[0] != "mem":
        _fail("nvgpu.device_async_copy must copy from global to shared memory")
    elem = _elem_name(dst_v.type)
    esize = _WIDTH[elem] // 8
    if E * esize not in (4, 8, 16):
        _fail(f"cp.async of {E * esize} bytes")
    m = np.broadcast_to(mask, (L.n,))
    threads = np.nonzero(m)[0]
    if threads.size == 0:
        env[op.results[0]] = None
        return
    d = np.broadcast_to(np.asarray(env[dst_idx[0]]), (L.n,))[threads].astype(np.int64)
    s = np.broadcast_to(np.asarray(env[src_idx[0]]), (L.n,))[threads].astype(np.int64)
    cnt = (
        np.broadcast_to(np.asarray(env[n_src]), (L.n,))[threads].astype(np.int64)
        if n_src is not None
        else np.full(threads.size, E)
    )
    garr = src[1]
    sarr = L.shared[dst[1]]
    if np.any((d * esize) % (E * esize)) or np.any((s * esize) % (E * esize)):
        _fail(f"cp.async of {E * esize} bytes in kernel {L.kernel} at a misaligned address")
    if np.any((cnt < 0) | (cnt > E)):
        _fail(f"cp.async in kernel {L.kernel}: src-size outside 0..{E} elements")
    if np.any(d < 0) or np.any(d + E > sarr.shape[1]):
        _fail(f"cp.async in kernel {L.kernel} writes out of bounds of workgroup buffer {dst[1]}")
    lanes = np.arange(E)
    read = lanes[None, :] < cnt[:, None]
    src_pos = s[:, None] + lanes
    if np.any(read & ((src_pos < 0) | (src_pos >= garr.shape[0]))):
        _fail(f"cp.async in kernel {L.kernel} reads out of bounds of a global buffer")
    vals = np.where(read, garr[np.where(read, src_pos, 0)], np.zeros((), garr.dtype))
    if vals.dtype != sarr.dtype:  # a bf16 buffer given as float32 values (tests may)
        vals = to_bits(vals, "bf16") if elem == "bf16" else vals.astype(sarr.dtype)
    _copies(L).issue(dst[1], threads, d[:, None] + lanes, vals, op.name, L.races)
    env[op.results[0]] = None
    emu.stats.cp_async += int(threads.size)


def create_group(emu, op: ir.Operation, env: dict, mask: np.ndarray, L) -> None:
    _copies(L).commit(np.broadcast_to(mask, (L.n,)))
    for r in op.results:
        env[r] = None


def wait_group(emu, op: ir.Operation, env: dict, mask: np.ndarray, L) -> None:
    attr = "n" if op.name == "nvvm.cp.async.wait.group" else "numGroups"
    keep = ir.IntegerAttr(op.attributes[attr]).value if attr in op.attributes else 0
    _copies(L).wait(keep, np.broadcast_to(mask, (L.n,)), L.races, op.name)


def check_access(L, k: int, addr: np.ndarray, mask: np.ndarray, op: str, write: bool) -> None:
    """Called by the emulator for every shared-memory access (race check on)."""
    copies = getattr(L, "copies", None)
    if copies is None or not copies.inflight:
        return
    threads = np.nonzero(np.broadcast_to(mask, (L.n,)))[0]
    rows = np.asarray(addr).reshape(L.n, -1)[threads]
    copies.check(k, rows, threads, op, write)


HANDLERS = {
    "nvgpu.ldmatrix": ldmatrix,
    "nvvm.mma.sync": mma_sync,
    "nvvm.convert.float.to.tf32": tf32,
    "llvm.extractvalue": extractvalue,
    "vector.bitcast": vector_bitcast,
    "arith.bitcast": arith_bitcast,
    "nvgpu.device_async_copy": async_copy,
    "nvgpu.device_async_create_group": create_group,
    "nvgpu.device_async_wait": wait_group,
    "nvvm.cp.async.commit.group": create_group,
    "nvvm.cp.async.wait.group": wait_group,
}

__all__ = [
    "HANDLERS",
    "MmaStats",
    "a_coords",
    "b_coords",
    "bitcast_lanes",
    "c_coords",
    "check_access",
    "from_bits",
    "tf32_rna",
    "to_bits",
]
