"""The emulator's launch state (see :mod:`opfuse.testing.emulator.emulate`).

One launch's thread ids and shared memory (:class:`_Launch`), the checks on its accesses
and barriers (vector alignment, barriers reached by part of a block), and the
shared-memory race check (:class:`_RaceCheck`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mlir import ir

from ...errors import EXIT_INTERNAL_ERROR, OpfuseError
from .instructions import _np_type, _storage_type

WARP = 32


class _Launch:
    """One launch's thread ids and shared memory (a row of each workgroup buffer per block;
    threads are numbered block-major, so thread ``g`` is in block ``g // threads``)."""

    def __init__(self, grid, block, shared: Sequence[ir.MemRefType], kernel: str, racecheck: bool):
        self.grid, self.block = grid, block
        self.kernel = kernel
        tb = block[0] * block[1] * block[2]
        nb = grid[0] * grid[1] * grid[2]
        self.threads = tb
        self.n = tb * nb
        g = np.arange(self.n, dtype=np.int64)
        self.block_linear = g // tb
        t = g % tb
        self.ids = [
            self.block_linear % grid[0],
            (self.block_linear // grid[0]) % grid[1],
            self.block_linear // (grid[0] * grid[1]),
            t % block[0],
            (t // block[0]) % block[1],
            t // (block[0] * block[1]),
        ]
        self.lane_base = g - (t % WARP)  # flat index of lane 0 of the thread's warp
        self.lane = t % WARP
        self.shared = [
            np.zeros((nb, m.shape[0]), dtype=_storage_type(m.element_type)) for m in shared
        ]
        self.races = _RaceCheck(self, [str(m) for m in shared]) if racecheck and shared else None
        self.copies = None  # cp.async copies in flight (emulate_mma.AsyncCopies)
        self.wgmma = None  # warpgroup-MMA state (emulate_wgmma.State), for kernels using it

    def where(self, g: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Block and thread coordinates of thread ``g``."""
        c = tuple(int(i[g]) for i in self.ids)
        return c[:3], c[3:]


def _check_alignment(op: ir.Operation, mem: ir.Value, idx, mask, L: _Launch) -> None:
    """A vector access's address must have the alignment the op claims: PTX's
    ``ld.global.v4`` / ``ld.shared.v4`` fault on a misaligned address. Buffers start
    256-byte (device allocations) or 16-byte (shared memory) aligned, so the element index
    decides."""
    if "alignment" not in op.attributes:
        return
    align = ir.IntegerAttr(op.attributes["alignment"]).value
    size = _np_type(ir.MemRefType(mem.type).element_type)().itemsize
    active = np.broadcast_to(np.asarray(idx), (L.n,))[np.broadcast_to(mask, (L.n,))]
    bad = active[(active * size) % align != 0]
    if bad.size:
        raise OpfuseError(
            f"emulator: misaligned {op.name} in kernel {L.kernel}: it claims {align}-byte "
            f"alignment, element {int(bad[0])} of {ir.MemRefType(mem.type)} is not",
            exit_code=EXIT_INTERNAL_ERROR,
        )


def _check_convergent(L: _Launch, mask) -> None:
    """A block reaches a barrier with all of its threads or with none: on a GPU a barrier
    that part of a block skips (under a thread-dependent ``scf.if``) hangs or is undefined."""
    per_block = np.broadcast_to(np.asarray(mask, dtype=bool), (L.n,)).reshape(-1, L.threads)
    partial = per_block.any(axis=1) & ~per_block.all(axis=1)
    if partial.any():
        b = int(np.argmax(partial))
        block, _ = L.where(b * L.threads)
        skipped = int(np.argmin(per_block[b]))
        _, t = L.where(b * L.threads + skipped)
        raise OpfuseError(
            f"emulator: divergent gpu.barrier in kernel {L.kernel}: block {block} reaches it "
            f"with {int(per_block[b].sum())} of {L.threads} threads (thread {t} skips it)",
            exit_code=EXIT_INTERNAL_ERROR,
        )


class _RaceCheck:
    """Shared-memory hazards between barriers, like compute-sanitizer's racecheck.

    For each workgroup buffer, block and element it keeps, since the block's last
    ``gpu.barrier``, the thread that wrote it and the smallest and largest thread that read
    it (the two bounds tell whether a reader other than a given thread exists). The
    emulator runs each op for all threads at once, so an access conflicts with every other
    thread's access since the barrier, whatever order the GPU would run them in; within one
    op only writes can conflict (two threads storing to one element). Threads are the
    launch's flat indices.

    Correct kernels read between barriers far more than they write (the row exchange, a
    matmul's K loop over its staged slabs), so reads cost little: the read-after-write
    check runs only on a buffer written since the barrier, and the readers are only
    recorded (the accesses kept as they come) until a write to that buffer needs them.
    """

    def __init__(self, launch: _Launch, types: list[str]):
        self.launch = launch
        self.types = types
        self.nb = launch.grid[0] * launch.grid[1] * launch.grid[2]
        self.writer = [np.full(a.shape, -1, np.int64) for a in launch.shared]
        self.read_lo = [np.full(a.shape, launch.n, np.int64) for a in launch.shared]
        self.read_hi = [np.full(a.shape, -1, np.int64) for a in launch.shared]
        self.written = [False] * len(types)
        self.has_reads = [False] * len(types)  # read_lo/read_hi hold something
        self.pending: list[list] = [[] for _ in types]  # reads not yet in read_lo/read_hi

    def barrier(self, mask: np.ndarray) -> None:
        blocks = mask.reshape(self.nb, -1).any(axis=1)
        every = bool(blocks.all())
        for k in range(len(self.types)):
            if every:
                self.pending[k].clear()
            else:
                self._record_reads(k)
            if self.written[k]:
                self.writer[k][blocks] = -1
                self.written[k] = not every
            if self.has_reads[k]:
                self.read_lo[k][blocks] = self.launch.n
                self.read_hi[k][blocks] = -1
                self.has_reads[k] = not every

    def on_read(self, k: int, addr: np.ndarray, mask: np.ndarray, op: str) -> None:
        """The active threads read elements ``addr`` (one, or a row per thread) of buffer ``k``."""
        if self.written[k]:
            flat, threads = self._flat(k, addr, mask)
            w = self.writer[k].reshape(-1)[flat]
            bad = (w >= 0) & (w != threads)
            if bad.any():
                i = int(np.argmax(bad))
                self._raise("read-after-write", k, flat[i], threads[i], w[i], op)
        self.pending[k].append((addr, mask))

    def on_write(self, k: int, addr: np.ndarray, mask: np.ndarray, op: str) -> None:
        """The active threads write elements ``addr`` (one, or a row per thread) of buffer ``k``."""
        flat, threads = self._flat(k, addr, mask)
        self._record_reads(k)
        if self.has_reads[k]:
            lo = self.read_lo[k].reshape(-1)[flat]
            hi = self.read_hi[k].reshape(-1)[flat]
            bad = (hi >= 0) & ((lo != threads) | (hi != threads))
            if bad.any():
                i = int(np.argmax(bad))
                other = lo[i] if lo[i] != threads[i] else hi[i]
                self._raise("write-after-read", k, flat[i], threads[i], other, op)
        writer = self.writer[k].reshape(-1)
        if self.written[k]:
            w = writer[flat]
            bad = (w >= 0) & (w != threads)
            if bad.any():
                i = int(np.argmax(bad))
                self._raise("write-after-write", k, flat[i], threads[i], w[i], op)
        # two threads of this op on one element: one of them does not read itself back
        writer[flat] = threads
        bad = writer[flat] != threads
        if bad.any():  # name the first element and its first two writers, whichever won
            e = flat[bad].min()
            ts = threads[flat == e]
            self._raise("write-after-write", k, e, ts[ts != ts.min()].min(), ts.min(), op)
        self.written[k] = True

    def _flat(self, k: int, addr: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Indices into the flattened ``(blocks, size)`` state and the thread of each."""
        addr = addr.reshape(self.launch.n, -1)[mask]
        threads = np.repeat(np.nonzero(mask)[0], addr.shape[1])
        flat = self.launch.block_linear[threads] * self.writer[k].shape[1] + addr.reshape(-1)
        return flat, threads

    def _record_reads(self, k: int) -> None:
        if not self.pending[k]:
            return
        parts = [self._flat(k, addr, mask) for addr, mask in self.pending[k]]
        self.pending[k].clear()
        flat = np.concatenate([f for f, _ in parts])
        threads = np.concatenate([t for _, t in parts])
        np.minimum.at(self.read_lo[k].reshape(-1), flat, threads)
        np.maximum.at(self.read_hi[k].reshape(-1), flat, threads)
        self.has_reads[k] = True

    def _raise(self, kind: str, k: int, flat, thread, other, op: str) -> None:
        block, t = self.launch.where(int(thread))
        _, o = self.launch.where(int(other))
        addr = int(flat) % self.writer[k].shape[1]
        did = "read" if kind == "write-after-read" else "wrote"
        does = "reads" if kind == "read-after-write" else "writes"
        raise OpfuseError(
            f"emulator: shared-memory race in kernel {self.launch.kernel}: {kind} on workgroup "
            f"buffer {k} ({self.types[k]}) at element {addr} in block {block}: "
            f"thread {t} {does} it ({op}) after thread {o} {did} it, with no gpu.barrier "
            "in between",
            exit_code=EXIT_INTERNAL_ERROR,  # generated code: a compiler bug, not bad input
        )
