"""The emulator's warpgroup-MMA operations (see :mod:`opfuse.testing.emulator.emulate`).

Semantics written from the PTX ISA (9.7.15 "Asynchronous Warpgroup Level Matrix
Multiply-Accumulate Instructions": the matrix descriptor, the shared-memory layouts, the
register fragments of ``wgmma.mma_async.m64nNk16``, ``wgmma.fence``, ``commit_group``,
``wait_group``; 9.7.13.4 ``fence.proxy.async``), independently of the emitter that uses
them (:mod:`opfuse.backends.gpu.build.wgmma`), and checked on their own against hand-made examples
(test/unit/test_emulate_wgmma.py):

* ``memref.extract_aligned_pointer_as_index`` of a workgroup buffer: its byte address in
  a modelled shared window (buffers one after the other from byte 1024, each 1024-byte
  aligned: a descriptor that loses the base, or the 16-byte granule, reads the wrong
  buffer and shows).
* ``nvvm.wgmma.mma_async`` (``m64nNk16``, f16/bf16 operands, f32 accumulators, scales
  one): warpgroup-collective (four consecutive warps of a block, the first a multiple of
  four, all lanes active or none); both descriptors the same in every thread of a
  warpgroup; decoded as the ISA's "Matrix Descriptor Format" says (start address bits
  0-13, LBO 16-29, SBO 32-45, each in 16-byte units; base offset 49-51 and swizzle 62-63
  must be 0: only the no-swizzle layout is emulated). Element (row ``r`` along M or N,
  ``k``) of an operand is at byte ``start + (r%8)*16 + (r//8)*SBO + (k%8)*2 + (k//8)*LBO``
  when it is K-major (A with ``layoutA = row``, B with ``layoutB = col``), at ``start +
  (r%8)*2 + (r//8)*SBO + (k%8)*16 + (k//8)*LBO`` when it is M/N-major (the transposed
  forms): the canonical interleaved layouts of 8 x 16-byte core matrices. ``D = A B + D``
  (products exact, sums in float64, rounded to f32), D placed as the ISA's fragment figure
  for D places it: warp ``w`` of the warpgroup rows ``16w + groupID (+8 for d[i] with
  i%4 >= 2)``, column ``8(i/4) + 2 threadID_in_group + i%2``.
* Asynchrony: the result (the accumulator struct) may be passed on to another
  ``mma_async`` of the same shape, and carried by loops, but reading an element of it
  (``llvm.extractvalue``) before a ``wgmma.wait_group`` of the issuing warpgroup covers its
  group is an error. The operand shared memory it reads is *held* until that wait and
  the next barrier: a write into it before then (a store, a ``cp.async`` issued or
  landing) is an error. The accumulator it takes must come from a ``mma_async`` of the
  same shape, or a ``wgmma.fence`` of the warpgroup must separate the register writes that
  made it (``llvm.insertvalue``) from the ``mma_async``.
* ``nvvm.wgmma.commit.group.sync.aligned`` / ``nvvm.wgmma.wait.group.sync.aligned N``:
  per thread (warpgroup-collective), like ``cp.async``'s groups.
* Proxies: shared memory written through the generic proxy (stores, landed ``cp.async``
  copies) is visible to ``mma_async`` only after the writing thread's ``nvvm.fence.proxy``
  (``async.shared``, ``cta``) and then a ``gpu.barrier`` of the block; reading an element
  still pending either is an error.
* ``llvm.mlir.undef`` (a struct of NaN), ``llvm.insertvalue``.
"""

from __future__ import annotations

import numpy as np
from mlir import ir

from .mma import WARP, _fail, _per_thread, from_bits

WARPGROUP = 128
SHARED_BASE = 1024  # first buffer's byte address in the modelled shared window
SHARED_ALIGN = 1024
_ESIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8}


class Struct(tuple):
    """An ``!llvm.struct`` value: a tuple of per-thread arrays. ``stamp``: the emulator
    step that wrote it (register writes a ``wgmma.fence`` must follow); ``shape``: the
    ``mma_async`` shape that produced it (None: plain register writes); ``ready``: per
    thread, whether a ``wait_group`` has covered the instruction (all True when not
    asynchronous)."""

    stamp: int = -1
    shape: tuple | None = None
    ready: np.ndarray | None = None

    @classmethod
    def make(cls, items, stamp: int, shape=None, ready=None) -> "Struct":
        s = cls(items)
        s.stamp, s.shape, s.ready = stamp, shape, ready
        return s


class State:
    """The wgmma state of one launch (created by :func:`attach` for kernels using it)."""

    def __init__(self, L):
        self.L = L
        nb = L.grid[0] * L.grid[1] * L.grid[2]
        self.esize = [a.itemsize for a in L.shared]
        self.base, addr = [], SHARED_BASE
        for a in L.shared:
            self.base.append(addr)
            addr += -(-a.shape[1] * a.itemsize // SHARED_ALIGN) * SHARED_ALIGN
        self.proxy = [np.zeros(a.shape, np.int8) for a in L.shared]  # 0 ok, 1 unfenced, 2 fenced
        self.writer = [np.full(a.shape, -1, np.int64) for a in L.shared]
        self.hold = [np.zeros(a.shape, np.int32) for a in L.shared]  # wgmma reads in flight
        self.recent = [np.zeros(a.shape, bool) for a in L.shared]  # read since the barrier
        self.step = 0
        self.fenced = np.full(L.n, -1, np.int64)  # step of each thread's last wgmma.fence
        self.committed = np.zeros(L.n, np.int64)
        self.pending: list[dict] = []
        self.nb = nb
        self.count = 0  # mma_async executed (per warpgroup)

    # ----- hooks of the emulator --------------------------------------------------------
    def on_write(self, k: int, addr: np.ndarray, mask: np.ndarray, op: str, landed: bool = True):
        """Threads in ``mask`` write elements ``addr`` (one or a row per thread) of buffer
        ``k`` through the generic proxy (``landed`` False: a cp.async issued, not yet
        written)."""
        L = self.L
        m = np.broadcast_to(mask, (L.n,))
        if not m.any():
            return
        threads = np.nonzero(m)[0]
        a = np.asarray(addr).reshape(L.n, -1)[threads]
        blocks = np.repeat(L.block_linear[threads], a.shape[1])
        flat = a.reshape(-1)
        for arr, what in ((self.hold[k], "still being read by a wgmma.mma_async in flight "
                           "(no wgmma.wait_group covers it)"),
                          (self.recent[k], "read by a wgmma.mma_async since the last "
                           "gpu.barrier")):
            bad = arr[blocks, flat] > 0
            if bad.any():
                i = int(np.argmax(bad))
                block, t = L.where(int(threads[i // a.shape[1]]))
                _fail(f"shared-memory race in kernel {L.kernel}: thread {t} of block {block} "
                      f"writes element {int(flat[i])} of workgroup buffer {k} ({op}) {what}")
        if landed:
            self.proxy[k][blocks, flat] = 1
            self.writer[k][blocks, flat] = np.repeat(threads, a.shape[1])

    def barrier(self, mask: np.ndarray) -> None:
        blocks = np.broadcast_to(mask, (self.L.n,)).reshape(self.nb, -1).any(axis=1)
        for k in range(len(self.proxy)):
            p = self.proxy[k]
            p[blocks] = np.where(p[blocks] == 2, 0, p[blocks])
            self.recent[k][blocks] = False

    # ----- ops --------------------------------------------------------------------------
    def proxy_fence(self, mask: np.ndarray) -> None:
        active = np.broadcast_to(mask, (self.L.n,))
        for k in range(len(self.proxy)):
            mine = (self.proxy[k] == 1) & active[np.maximum(self.writer[k], 0)]
            self.proxy[k][mine] = 2

    def address(self, smem) -> np.int64:
        return np.int64(self.base[smem[1]])

    def locate(self, addr: np.ndarray, what: str) -> tuple[int, np.ndarray]:
        """The buffer and element indices of byte addresses ``addr`` (one buffer)."""
        L = self.L
        for k, base in enumerate(self.base):
            size = L.shared[k].shape[1] * self.esize[k]
            inside = (addr >= base) & (addr < base + size)
            if inside.all():
                rel = addr - base
                if np.any(rel % self.esize[k]):
                    _fail(f"wgmma.mma_async in kernel {L.kernel}: {what} element address not "
                          f"aligned to its size in workgroup buffer {k}")
                return k, rel // self.esize[k]
            if inside.any():
                break
        _fail(f"wgmma.mma_async in kernel {L.kernel}: {what} descriptor addresses outside one "
              "workgroup buffer (bytes "
              f"{int(addr.min())}..{int(addr.max())}; buffers at {self.base})")


def attach(L, body: ir.Block) -> None:
    """Give launch ``L`` a :class:`State` when its body uses wgmma."""
    found = []

    def visit(op):
        if op.name.startswith("nvvm.wgmma") or op.name == "memref.extract_aligned_pointer_as_index":
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    for op in body.operations:
        op.operation.walk(visit)
        if found:
            break
    L.wgmma = State(L) if found else None


def _state(L) -> State:
    if getattr(L, "wgmma", None) is None:
        L.wgmma = State(L)
    return L.wgmma


def _groups(mask: np.ndarray, L, what: str) -> np.ndarray:
    """The active warpgroups of a warpgroup-collective op (all of a warpgroup's lanes or
    none), as a bool per warpgroup of the launch."""
    if L.threads % WARPGROUP:
        _fail(f"{what} in kernel {L.kernel}: blocks of {L.threads} threads are not whole "
              "warpgroups (128 threads)")
    m = np.broadcast_to(mask, (L.n,)).reshape(-1, WARPGROUP)
    active = m.any(axis=1)
    partial = active & ~m.all(axis=1)
    if partial.any():
        w = int(np.argmax(partial))
        _fail(f"{what} in kernel {L.kernel} executed by part of warpgroup {w} "
              f"({int(m[w].sum())} of 128 threads): it is warpgroup-collective (.aligned)")
    return active


def _attr(op, name: str) -> str:
    return str(op.attributes[name]).split("<")[-1].rstrip(">").strip()


def extract_pointer(emu, op, env, mask, L) -> None:
    mem = env[op.operands[0]]
    if mem[0] != "smem":
        _fail("memref.extract_aligned_pointer_as_index of a global buffer is not emulated")
    env[op.results[0]] = _state(L).address(mem)


def undef_value(op) -> Struct:
    """``llvm.mlir.undef`` / ``poison`` of a struct: NaN fields (no register written, so
    no fence owed: stamp -1). Also a host-level op (canonicalization hoists it)."""
    t = str(op.results[0].type)
    if not t.startswith("!llvm.struct<("):
        _fail(f"{op.name} of {t} is not emulated")
    n = len(t[len("!llvm.struct<("):-2].split(","))
    return Struct.make([np.float32(np.nan)] * n, -1)


def undef(emu, op, env, mask, L) -> None:
    env[op.results[0]] = undef_value(op)


def insertvalue(emu, op, env, mask, L) -> None:
    (pos,) = list(ir.DenseI64ArrayAttr(op.attributes["position"]))
    s = list(env[op.operands[0]])
    old = np.asarray(s[pos])
    new = np.asarray(env[op.operands[1]])
    m = np.broadcast_to(mask, (L.n,))
    if m.all():
        s[pos] = new
    else:
        s[pos] = np.where(m, np.broadcast_to(new, (L.n,)), np.broadcast_to(old, (L.n,)))
    st = _state(L)
    st.step += 1
    env[op.results[0]] = Struct.make(s, st.step)


def extractvalue(emu, op, env, mask, L) -> None:
    x = env[op.operands[0]]
    if isinstance(x, Struct) and x.ready is not None:
        m = np.broadcast_to(mask, (L.n,))
        early = m & ~x.ready
        if early.any():
            block, t = L.where(int(np.argmax(early)))
            _fail(f"kernel {L.kernel}: thread {t} of block {block} reads an accumulator of a "
                  "wgmma.mma_async before a wgmma.wait_group covers it")
    pos = list(ir.DenseI64ArrayAttr(op.attributes["position"]))
    for p in pos:
        x = x[p]
    env[op.results[0]] = x


def fence(emu, op, env, mask, L) -> None:
    st = _state(L)
    _groups(mask, L, op.name)
    st.step += 1
    st.fenced[np.broadcast_to(mask, (L.n,))] = st.step


def fence_proxy(emu, op, env, mask, L) -> None:
    kind = _attr(op, "kind") if "kind" in op.attributes else ""
    if kind != "async.shared":
        _fail(f"nvvm.fence.proxy kind {kind or 'generic'} is not emulated")
    _state(L).proxy_fence(mask)


def _operand_addresses(desc: np.ndarray, rows: int, k_major: bool, what: str, L) -> np.ndarray:
    """Byte addresses (warpgroups, rows, 16) of a ``rows x 16`` operand per descriptor."""
    d = desc.astype(np.uint64)
    start = ((d & np.uint64(0x3FFF)) << np.uint64(4)).astype(np.int64)
    lbo = (((d >> np.uint64(16)) & np.uint64(0x3FFF)) << np.uint64(4)).astype(np.int64)
    sbo = (((d >> np.uint64(32)) & np.uint64(0x3FFF)) << np.uint64(4)).astype(np.int64)
    base_offset = ((d >> np.uint64(49)) & np.uint64(7)).astype(np.int64)
    swizzle = ((d >> np.uint64(62)) & np.uint64(3)).astype(np.int64)
    if np.any(swizzle) or np.any(base_offset):
        _fail(f"wgmma.mma_async in kernel {L.kernel}: {what} descriptor with swizzle mode "
              f"{int(swizzle.max())}, base offset {int(base_offset.max())} is not emulated")
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    # a core matrix row is 16 bytes along K (K-major) or along M/N (M/N-major)
    off = (r % 8) * 16 + (k % 8) * 2 if k_major else (r % 8) * 2 + (k % 8) * 16
    return start[:, None, None] + off + (r // 8) * sbo[:, None, None] + (k // 8) * lbo[:, None, None]


def d_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of shape (128, n/2) of each warpgroup thread's accumulators d[i]."""
    tid = np.arange(WARPGROUP)
    w, lane = tid // WARP, tid % WARP
    g, t = lane >> 2, lane % 4
    i = np.arange(n // 2)
    rows = 16 * w[:, None] + g[:, None] + 8 * ((i[None, :] >> 1) & 1)
    cols = 8 * (i[None, :] >> 2) + 2 * t[:, None] + (i[None, :] & 1)
    return rows, cols


def mma_async(emu, op, env, mask, L) -> None:
    st = _state(L)
    shape = str(op.attributes["shape"])
    m, n, kk = (int(shape.split(f"{d} = ")[1].split(",")[0].rstrip(">")) for d in "mnk")
    ta, tb, td = _attr(op, "typeA"), _attr(op, "typeB"), _attr(op, "typeD")
    scales = {_attr(op, s) for s in ("scaleA", "scaleB", "scaleD")}
    if (m, kk) != (64, 16) or ta != tb or ta not in ("f16", "bf16") or td != "f32" or scales != {"one"}:
        _fail(f"nvvm.wgmma.mma_async m{m}n{n}k{kk} {td}.{ta}.{tb} (scales {sorted(scales)}) "
              "is not emulated")
    a_k_major = _attr(op, "layoutA") == "row"
    b_k_major = _attr(op, "layoutB") == "col"
    acc_v, da_v, db_v = list(op.operands)
    active = _groups(mask, L, op.name)
    acc = env[acc_v]
    threads = np.repeat(active, WARPGROUP)
    if len(acc) != n // 2:
        _fail(f"nvvm.wgmma.mma_async m64n{n}k16 with an accumulator of {len(acc)} values")
    same_shape = isinstance(acc, Struct) and acc.shape == (m, n, kk)
    if not same_shape:
        stamp = acc.stamp if isinstance(acc, Struct) else st.step
        late = threads & (st.fenced <= stamp)
        if late.any():
            block, t = L.where(int(np.argmax(late)))
            _fail(f"wgmma.mma_async in kernel {L.kernel}: thread {t} of block {block} passes "
                  "accumulators written by other instructions without a wgmma.fence between")
    W = L.n // WARPGROUP
    descs = []
    for v, what in ((da_v, "A"), (db_v, "B")):
        d = np.broadcast_to(_per_thread(env[v], (), L.n), (L.n,)).astype(np.int64).reshape(W, WARPGROUP)
        if np.any(d[active] != d[active][:, :1]):
            _fail(f"wgmma.mma_async in kernel {L.kernel}: the {what} descriptor differs "
                  "between threads of one warpgroup")
        descs.append(d[active, 0])
    groups = np.nonzero(active)[0]
    block = L.block_linear[groups * WARPGROUP]
    operands, reads = [], []
    for desc, rows, k_major, what, want in ((descs[0], 64, a_k_major, "A", ta),
                                            (descs[1], n, b_k_major, "B", tb)):
        addr = _operand_addresses(desc, rows, k_major, what, L)  # (g, rows, 16)
        k, idx = st.locate(addr, what)
        if L.shared[k].dtype != (np.uint16 if want == "bf16" else np.float16):
            _fail(f"wgmma.mma_async in kernel {L.kernel}: {what} ({want}) reads workgroup "
                  f"buffer {k} of another element type")
        b = np.broadcast_to(block[:, None, None], idx.shape)
        bad = st.proxy[k][b, idx] != 0
        if bad.any():
            g_, r_, c_ = (int(x) for x in np.argwhere(bad)[0])
            _fail(f"wgmma.mma_async in kernel {L.kernel} reads element {int(idx[g_, r_, c_])} of "
                  f"workgroup buffer {k} ({what}) written through the generic proxy without a "
                  "fence.proxy.async by its writer and a barrier since")
        raw = L.shared[k][b, idx]  # bf16 buffers hold bits, f16 ones float16 values
        vals = from_bits(raw, "bf16") if raw.dtype == np.uint16 else raw
        operands.append(np.asarray(vals, np.float64))
        reads.append((k, b, idx))
    A = operands[0]  # (g, 64, 16)
    B = operands[1].transpose(0, 2, 1)  # (g, 16, n)
    dr, dc = d_coords(n)
    c = np.stack([np.broadcast_to(_per_thread(x, (), L.n), (L.n,)) for x in acc], 1)
    c = c.reshape(W, WARPGROUP, n // 2)[active].astype(np.float64)
    C = np.zeros((len(groups), 64, n))
    C[:, dr, dc] = c
    D = (A @ B + C).astype(np.float32)
    out = np.zeros((W, WARPGROUP, n // 2), np.float32)
    out[active] = D[:, dr, dc]
    out = out.reshape(L.n, n // 2)
    ready = ~threads
    result = Struct.make([out[:, i] for i in range(n // 2)], st.step, (m, n, kk), ready)
    env[op.results[0]] = result
    for k, b, idx in reads:
        np.add.at(st.hold[k], (b.reshape(-1), idx.reshape(-1)), 1)
    st.pending.append({"threads": np.nonzero(threads)[0], "group": -1, "reads": reads,
                       "result": result})
    st.count += len(groups)
    emu.stats.wgmma += len(groups)


def commit(emu, op, env, mask, L) -> None:
    st = _state(L)
    _groups(mask, L, op.name)
    m = np.broadcast_to(mask, (L.n,))
    for p in st.pending:
        if p["group"] < 0 and m[p["threads"]].all():
            p["group"] = int(st.committed[p["threads"][0]])
    st.committed[m] += 1


def wait(emu, op, env, mask, L) -> None:
    st = _state(L)
    _groups(mask, L, op.name)
    keep = ir.IntegerAttr(op.attributes["group"]).value
    m = np.broadcast_to(mask, (L.n,))
    still = []
    for p in st.pending:
        th = p["threads"]
        if p["group"] >= 0 and m[th].all() and p["group"] < st.committed[th[0]] - keep:
            p["result"].ready[th] = True
            for k, b, idx in p["reads"]:
                np.add.at(st.hold[k], (b.reshape(-1), idx.reshape(-1)), -1)
                st.recent[k][b.reshape(-1), idx.reshape(-1)] = True
        else:
            still.append(p)
    st.pending = still


def on_barrier(L, mask: np.ndarray) -> None:
    if getattr(L, "wgmma", None) is not None:
        L.wgmma.barrier(mask)


def on_write(L, k: int, addr: np.ndarray, mask: np.ndarray, op: str, landed: bool = True) -> None:
    if getattr(L, "wgmma", None) is not None:
        L.wgmma.on_write(k, addr, mask, op, landed)


HANDLERS = {
    "memref.extract_aligned_pointer_as_index": extract_pointer,
    "llvm.mlir.undef": undef,
    "llvm.mlir.poison": undef,
    "llvm.insertvalue": insertvalue,
    "llvm.extractvalue": extractvalue,
    "nvvm.wgmma.fence.aligned": fence,
    "nvvm.fence.proxy": fence_proxy,
    "nvvm.wgmma.mma_async": mma_async,
    "nvvm.wgmma.commit.group.sync.aligned": commit,
    "nvvm.wgmma.wait.group.sync.aligned": wait,
}

__all__ = ["HANDLERS", "State", "Struct", "attach", "d_coords", "on_barrier", "on_write",
           "undef_value"]
