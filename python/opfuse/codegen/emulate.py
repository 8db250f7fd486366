"""Run the ``kernels`` stage on the CPU: every thread of a launch in lockstep, with numpy.

This is how the GPU kernels are tested on machines without a GPU. It interprets the IR
the emitters produce (before outlining and lowering: ``gpu.launch`` bodies of ``arith``,
``math``, ``affine.apply``, ``memref``/``vector`` loads and stores, ``scf.if``/``scf.for``,
``gpu.shuffle``, ``gpu.barrier``; the tensor-core and ``cp.async`` ops of
:mod:`opfuse.codegen.emulate_mma`): each SSA value is a numpy array with one row per thread
of the whole grid, so one pass over the body runs every thread. Lockstep execution gives
barriers and warp shuffles their meaning for free (every thread has executed everything
before the barrier when the first one passes it); control flow is executed under a mask.

Shared memory is race-checked (like compute-sanitizer's racecheck; on by default, see
:class:`Emulator`): lockstep would hide a missing barrier, so every workgroup access is
recorded per block and address until the block's next ``gpu.barrier``, and a thread that
reads what another thread of its block wrote (read-after-write), writes what another read
(write-after-read) or writes what another wrote (write-after-write, even the same value:
no emitter relies on that) raises :class:`~opfuse.errors.OpfuseError` naming the kernel,
buffer, element and the two threads. Threads masked off by control flow do not access.

With the race check on, a ``gpu.barrier`` that only part of a block reaches (under
thread-dependent control flow: a hang or undefined behaviour on a GPU) is an error too,
and so is, always, a vector load or store at an address without the alignment it claims
(a misaligned-address fault on a GPU).

What it does not check: the NVVM/PTX lowering (LLVM's job), races through global memory
(the emitters give every output element one writer), and warp-synchronous assumptions (a
shuffle always sees its whole warp).
Floating point follows numpy in the element type (``exp`` is exact-ish here and
approximate on the GPU): compare with tolerances.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np
from mlir import ir

from ..errors import EXIT_INTERNAL_ERROR, OpfuseError
from . import emulate_mma, emulate_wgmma

#: Ops the tensor-core modules emulate (wgmma's extractvalue also checks readiness).
_HANDLERS = {**emulate_mma.HANDLERS, **emulate_wgmma.HANDLERS}

WARP = 32

# bf16 values compute as float32 holding bf16-representable values (rounded to nearest
# even wherever the IR produces a bf16 value) and live in memory as their 16 bits, as the
# host passes them (np.uint16: the runtime's dtype table).
_FLOAT = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": np.float32}
_BF16_BITS = np.dtype(np.uint16)
_INT = {
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "i1": np.bool_,
    "index": np.int64,
}


def _np_type(t: ir.Type):
    s = str(t)
    if s in _FLOAT:
        return _FLOAT[s]
    if s in _INT:
        return _INT[s]
    raise OpfuseError(f"emulator: unsupported element type {s}")


def _lanes(t: ir.Type) -> int:
    """Elements a load or store moves: a vector's length, else 1."""
    return ir.VectorType(t).shape[0] if isinstance(t, ir.VectorType) else 1


def _elem(t: ir.Type) -> ir.Type:
    return ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t


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


class Emulator:
    """Runs kernel host functions of a ``kernels`` module.

    Args:
        module: the kernels module (``GpuProgram.kernels_ir`` parsed, or its outlined form
            for :meth:`run_entry`).
        racecheck: raise on shared-memory races (see the module docstring).
    """

    def __init__(self, module: ir.Module, *, racecheck: bool = True, bank_stats: bool = False):
        self.module = module
        self.racecheck = racecheck
        #: Count shared-memory bank conflicts of scalar loads too (ldmatrix always), in
        #: :attr:`stats`: off by default (it costs a sort per load).
        self.bank_stats = bank_stats
        #: What the tensor-core and async-copy ops did (ldmatrix bank conflicts, ...).
        self.stats = emulate_mma.MmaStats()
        self.funcs = {}
        self.gpu_funcs = {}
        for op in module.body.operations:
            op = op.operation
            if op.name == "func.func":
                self.funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op
            elif op.name == "gpu.module":
                for inner in op.regions[0].blocks[0].operations:
                    inner = inner.operation
                    if inner.name == "gpu.func":
                        self.gpu_funcs[ir.StringAttr(inner.attributes["sym_name"]).value] = inner

    def run_entry(
        self, entry: str, grid: Sequence[int], block: Sequence[int], args: Sequence[np.ndarray]
    ) -> None:
        """Launch outlined kernel ``entry`` (a ``gpu.func``) with ``args`` in its own
        argument order: what the cuda runtime does with a KernelSpec."""
        func = self.gpu_funcs[entry]
        body = func.regions[0].blocks[0]
        n_wg = (
            ir.IntegerAttr(func.attributes["workgroup_attributions"]).value
            if "workgroup_attributions" in func.attributes
            else 0
        )
        params = list(body.arguments)
        n_args = len(params) - n_wg
        if len(args) != n_args:
            raise OpfuseError(f"emulator: {entry} takes {n_args} arguments, got {len(args)}")
        shared = [ir.MemRefType(a.type) for a in params[n_args:]]
        launch = _Launch(list(grid), list(block), shared, f"@{entry}", self.racecheck)
        emulate_wgmma.attach(launch, body)
        env: dict = {}
        for a, buf in zip(params, args):
            env[a] = ("mem", buf.reshape(-1))
        for k, a in enumerate(params[n_args:]):
            env[a] = ("smem", k)
        env["__launch__"] = launch
        self._block(body, env, np.ones(launch.n, dtype=bool), launch)

    def run(self, name: str, buffers: Sequence[np.ndarray]) -> None:
        """Run kernel ``name`` with ``buffers`` (flat arrays, one per parameter, in the
        host function's parameter order); writes outputs in place."""
        func = self.funcs[name]
        entry = func.regions[0].blocks[0]
        env: dict = {}
        for arg, buf in zip(entry.arguments, buffers):
            env[arg] = ("mem", buf.reshape(-1))
        for op in entry.operations:
            op = op.operation
            if op.name == "arith.constant":
                env[op.results[0]] = _const(op)
            elif op.name in ("llvm.mlir.undef", "llvm.mlir.poison"):  # hoisted by canonicalize
                env[op.results[0]] = emulate_wgmma.undef_value(op)
            elif op.name == "gpu.launch":
                self._launch(op, env, name)
            elif op.name == "func.return":
                return
            else:
                raise OpfuseError(f"emulator: unexpected host op {op.name}")

    def _launch(self, op: ir.Operation, env: dict, kernel: str) -> None:
        ops = list(op.operands)
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        i = seg[0]
        grid = [int(env[v]) for v in ops[i : i + 3]]
        block = [int(env[v]) for v in ops[i + 3 : i + 6]]
        body = op.regions[0].blocks[0]
        args = list(body.arguments)
        shared = [ir.MemRefType(a.type) for a in args[12:]]
        launch = _Launch(grid, block, shared, f"@{kernel}", self.racecheck)
        emulate_wgmma.attach(launch, body)
        local = dict(env)
        for k, a in enumerate(args[:6]):
            local[a] = launch.ids[k]
        for k, a in enumerate(args[6:12]):
            local[a] = np.int64((grid + block)[k])
        for k, a in enumerate(args[12:]):
            local[a] = ("smem", k)
        mask = np.ones(launch.n, dtype=bool)
        self._block(body, local, mask, launch)

    # ----- execution ---------------------------------------------------------------------
    def _block(self, block: ir.Block, env: dict, mask: np.ndarray, L: _Launch) -> list:
        for op in block.operations:
            op = op.operation
            name = op.name
            if name in ("scf.yield", "gpu.terminator", "func.return", "gpu.return"):
                return [env[v] for v in op.operands]
            self._op(op, env, mask, L)
        return []

    def _op(self, op: ir.Operation, env: dict, mask: np.ndarray, L: _Launch) -> None:
        name = op.name
        get = lambda v: env[v]  # noqa: E731
        extra = _HANDLERS.get(name)
        if extra is not None:
            extra(self, op, env, mask, L)
            return
        if name == "arith.constant":
            env[op.results[0]] = _const(op)
            return
        if name == "affine.apply":
            amap = ir.AffineMapAttr(op.attributes["map"]).value
            vals = [np.asarray(get(v)) for v in op.operands]
            env[op.results[0]] = _affine(amap.results[0], vals[: amap.n_dims], vals[amap.n_dims :])
            return
        if name in ("memref.load", "vector.load"):
            mem, idx = get(op.operands[0]), get(op.operands[1])
            _check_alignment(op, op.operands[0], idx, mask, L)
            lanes = _lanes(op.results[0].type)
            env[op.results[0]] = self._load(mem, np.asarray(idx), mask, L, lanes, name)
            return
        if name in ("memref.store", "vector.store"):
            mem, idx = get(op.operands[1]), get(op.operands[2])
            _check_alignment(op, op.operands[1], idx, mask, L)
            lanes = _lanes(op.operands[0].type)
            self._store(mem, get(op.operands[0]), np.asarray(idx), mask, L, lanes, name)
            return
        if name == "scf.if":
            self._if(op, env, mask, L)
            return
        if name == "scf.for":
            self._for(op, env, mask, L)
            return
        if name == "gpu.barrier":
            if L.races is not None:
                _check_convergent(L, mask)
                L.races.barrier(mask)
            emulate_wgmma.on_barrier(L, mask)
            return
        if name in ("gpu.block_id", "gpu.thread_id", "gpu.block_dim", "gpu.grid_dim"):
            dim = "xyz".index(str(op.attributes["dimension"]).split("<")[-1].rstrip(">")[-1])
            if name == "gpu.block_id":
                env[op.results[0]] = L.ids[dim]
            elif name == "gpu.thread_id":
                env[op.results[0]] = L.ids[3 + dim]
            else:
                env[op.results[0]] = np.int64((L.block if name == "gpu.block_dim" else L.grid)[dim])
            return
        if name == "gpu.shuffle":
            self._shuffle(op, env, L)
            return
        if name == "vector.broadcast":
            lanes = ir.VectorType(op.results[0].type).shape[0]
            x = np.asarray(get(op.operands[0]))
            env[op.results[0]] = (
                np.repeat(np.broadcast_to(x, (L.n,))[:, None], lanes, axis=1) if x.ndim <= 1 else x
            )
            return
        if name == "vector.from_elements":
            cols = [np.broadcast_to(np.asarray(get(v)), (L.n,)) for v in op.operands]
            env[op.results[0]] = np.stack(cols, axis=1)
            return
        if name == "vector.extract" and ir.VectorType(op.operands[0].type).rank > 1:
            emulate_mma.vector_extract(self, op, env, mask, L)
            return
        if name == "vector.extract":
            pos = list(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
            x = np.asarray(get(op.operands[0]))
            env[op.results[0]] = x[..., pos[0]] if x.ndim == 2 else x
            return
        if name == "vector.reduction":
            kind = str(op.attributes["kind"]).split("<")[-1].rstrip(">")
            x = np.asarray(get(op.operands[0]))
            acc = x[:, 0]
            for k in range(1, x.shape[1]):
                acc = _combine(kind, acc, x[:, k])
            env[op.results[0]] = acc
            return
        fn = _PURE.get(name)
        if fn is None:
            raise OpfuseError(f"emulator: unsupported op {name}")
        vals = [np.asarray(get(v)) for v in op.operands]
        out = fn(op, *vals)
        elem = _elem(op.results[0].type)
        out = np.asarray(out).astype(_np_type(elem), copy=False)
        env[op.results[0]] = _round_bf16(out) if isinstance(elem, ir.BF16Type) else out

    def _mem(self, mem, L: _Launch):
        kind, ref = mem
        if kind == "mem":
            return ref, None
        return L.shared[ref], L.block_linear

    def _load(
        self, mem, idx: np.ndarray, mask: np.ndarray, L: _Launch, lanes: int, op: str
    ) -> np.ndarray:
        arr = self._mem(mem, L)[0]
        out = self._load_raw(mem, idx, mask, L, lanes, op)
        return _from_bf16_bits(out) if arr.dtype == _BF16_BITS else out

    def _load_raw(
        self, mem, idx: np.ndarray, mask: np.ndarray, L: _Launch, lanes: int, op: str
    ) -> np.ndarray:
        arr, rows = self._mem(mem, L)
        idx = np.broadcast_to(idx, (L.n,))
        safe = np.where(mask, idx, 0)
        if lanes > 1:
            safe = safe[:, None] + np.arange(lanes)
            bad = mask[:, None] & ((safe >= arr.shape[-1]) | (safe < 0))
            if bad.any():
                raise OpfuseError("emulator: vector load out of bounds")
            if rows is None:
                return arr[np.where(mask[:, None], safe, 0)]
            self._track(mem, safe, mask, L, op, write=False)
            return arr[rows[:, None], safe]
        if np.any(mask & (idx >= arr.shape[-1])) or np.any(mask & (idx < 0)):
            raise OpfuseError(
                f"emulator: load out of bounds (index {int(idx[mask].max())}, size {arr.shape[-1]})"
            )
        if rows is None:
            return arr[safe]
        self._track(mem, safe, mask, L, op, write=False)
        if self.bank_stats:
            emulate_mma.count_banks(self.stats, safe, mask, arr.itemsize)
        return arr[rows, safe]

    def _store(
        self, mem, val, idx: np.ndarray, mask: np.ndarray, L: _Launch, lanes: int, op: str
    ) -> None:
        arr, rows = self._mem(mem, L)
        idx = np.broadcast_to(idx, (L.n,))
        sel = np.nonzero(mask)[0]
        if sel.size == 0:
            return
        if np.any(idx[sel] < 0) or np.any(idx[sel] + lanes > arr.shape[-1]):
            raise OpfuseError("emulator: store out of bounds")
        if rows is not None:
            self._track(mem, idx[:, None] + np.arange(lanes), mask, L, op, write=True)
        val = np.asarray(val)
        if arr.dtype == _BF16_BITS:
            val = _to_bf16_bits(val)
        if lanes > 1:
            v = np.broadcast_to(val, (L.n, lanes))[sel]
            pos = idx[sel][:, None] + np.arange(lanes)
            if rows is None:
                arr[pos] = v
            else:
                arr[rows[sel][:, None], pos] = v
        else:
            v = np.broadcast_to(val, (L.n,))[sel]
            if rows is None:
                arr[idx[sel]] = v
            else:
                arr[rows[sel], idx[sel]] = v

    @staticmethod
    def _track(mem, addr: np.ndarray, mask: np.ndarray, L: _Launch, op: str, write: bool) -> None:
        """Record a shared-memory access of the active threads (``addr``: one element per
        thread, or a row of ``lanes`` elements per thread) with the race check."""
        if write:
            emulate_wgmma.on_write(L, mem[1], addr, mask, op)
        if L.races is not None:
            emulate_mma.check_access(L, mem[1], addr, mask, op, write)
            (L.races.on_write if write else L.races.on_read)(mem[1], addr, mask, op)

    def _if(self, op: ir.Operation, env: dict, mask: np.ndarray, L: _Launch) -> None:
        cond = np.broadcast_to(np.asarray(env[op.operands[0]]), (L.n,))
        then_mask = mask & cond
        else_mask = mask & ~cond
        results = []
        regions = list(op.regions)
        outs = []
        for region, m in ((regions[0], then_mask), (regions[1], else_mask)):
            if len(region.blocks) == 0:
                outs.append(None)
                continue
            if not m.any() and len(op.results) == 0:
                outs.append(None)
                continue
            outs.append(self._block(region.blocks[0], env, m, L))
        for k, r in enumerate(op.results):
            a = np.asarray(outs[0][k]) if outs[0] is not None else None
            b = np.asarray(outs[1][k]) if outs[1] is not None else None
            c = cond if a is None or a.ndim <= 1 else cond[:, None]
            results.append(np.where(c, a, b))
        for r, v in zip(op.results, results):
            env[r] = v

    def _for(self, op: ir.Operation, env: dict, mask: np.ndarray, L: _Launch) -> None:
        lb, ub, step = (np.asarray(env[v]) for v in list(op.operands)[:3])
        # structs (tuples: a wgmma accumulator with its readiness) are carried as they are
        keep = lambda x: x if isinstance(x, tuple) else np.asarray(x)  # noqa: E731
        inits = [keep(env[v]) for v in list(op.operands)[3:]]
        body = op.regions[0].blocks[0]
        args = list(body.arguments)
        if lb.ndim == 0 and ub.ndim == 0 and step.ndim == 0:
            carried = inits
            for iv in range(int(lb), int(ub), int(step)):
                env[args[0]] = np.int64(iv)
                for a, v in zip(args[1:], carried):
                    env[a] = v
                carried = [keep(x) for x in self._block(body, env, mask, L)]
            for r, v in zip(op.results, carried):
                env[r] = v
            return
        if any(isinstance(v, tuple) for v in inits):
            raise OpfuseError("emulator: a loop with thread-dependent bounds carries a struct")
        iv = np.broadcast_to(lb, (L.n,)).astype(np.int64).copy()
        carried = []
        for a, v in zip(args[1:], inits):
            if isinstance(a.type, ir.VectorType) and v.ndim == 1:  # a constant: every thread's
                v = np.broadcast_to(v, (L.n, v.shape[0]))
            carried.append(np.broadcast_to(v, (L.n,) + v.shape[1:]).copy() if v.ndim
                           else np.full(L.n, v))
        while True:
            active = mask & (iv < ub)
            if not active.any():
                break
            env[args[0]] = iv.copy()
            for a, v in zip(args[1:], carried):
                env[a] = v
            new = [np.asarray(x) for x in self._block(body, env, active, L)]
            carried = [
                np.where(active if c.ndim == 1 else active[:, None], n, c)
                for c, n in zip(carried, new)
            ]
            iv = iv + np.where(active, step, 0)
        for r, v in zip(op.results, carried):
            env[r] = v

    def _shuffle(self, op: ir.Operation, env: dict, L: _Launch) -> None:
        """``gpu.shuffle`` as PTX's ``shfl.sync`` (ISA, "Parallel Synchronization and
        Communication Instructions: shfl.sync"), which the NVVM lowering emits: within
        segments of ``width`` lanes, the source lane ``j`` is ``lane ^ b`` (xor),
        ``lane - b`` (up), ``lane + b`` (down) or ``b`` (idx); a source outside the
        thread's segment is invalid: the thread gets its own value, ``valid`` false."""
        mode = str(op.attributes["mode"]).split("<")[-1].rstrip(">").split()[-1]
        x = np.broadcast_to(np.asarray(env[op.operands[0]]), (L.n,))
        off = np.broadcast_to(np.asarray(env[op.operands[1]]), (L.n,)).astype(np.int64)
        width = np.broadcast_to(np.asarray(env[op.operands[2]]), (L.n,)).astype(np.int64)
        seg = L.lane - L.lane % width  # first lane of the thread's segment
        if mode == "xor":
            j = L.lane ^ off
        elif mode == "up":
            j = L.lane - off
        elif mode == "down":
            j = L.lane + off
        elif mode == "idx":
            j = seg + off
        else:
            raise OpfuseError(f"emulator: gpu.shuffle {mode} not supported")
        valid = (j >= seg) & (j < seg + width) & (j < WARP)
        j = np.where(valid, j, L.lane)
        env[op.results[0]] = x[L.lane_base + j]
        env[op.results[1]] = valid


def _const(op: ir.Operation):
    attr = op.attributes["value"]
    t = op.results[0].type
    if isinstance(t, ir.VectorType):
        dense = ir.DenseElementsAttr(attr)
        et = _np_type(t.element_type)
        # a 1-d vector is every lane's: shape (1, w), as a per-lane vector is (lanes, w)
        # (vector.extract and vector.reduction index its last axis)
        shape = (1, *t.shape) if t.rank == 1 else tuple(t.shape)
        if dense.is_splat:
            return np.full(shape, _scalar(dense.get_splat_value()), dtype=et)
        return _elements(attr, t.element_type).astype(et).reshape(shape)
    return _np_type(t)(_scalar(attr))


def _elements(attr: ir.Attribute, elem: ir.Type) -> np.ndarray:
    """The elements of a non-splat dense constant, in order. DenseElementsAttr does not
    index its elements; the typed views do, except f16/bf16 ones ("Unsupported
    floating-point type"): those are read from the printed attribute, whose decimal
    values round back to the same half-precision values (a hex blob holds their bits)."""
    if isinstance(elem, (ir.IntegerType, ir.IndexType)):
        typed = ir.DenseIntElementsAttr(attr)
        return np.array([typed[i] for i in range(len(typed))])
    if not isinstance(elem, (ir.F16Type, ir.BF16Type)):
        typed = ir.DenseFPElementsAttr(attr)
        return np.array([typed[i] for i in range(len(typed))])
    text = str(attr)
    blob = re.search(r'"0x([0-9A-Fa-f]+)"', text)
    if blob is not None:
        bits = np.frombuffer(bytes.fromhex(blob.group(1)), dtype=np.uint16)
    else:  # dense<[v, ...]>: decimals, or the bits of a value with no decimal form (0x7E00)
        body = text.split("<", 1)[1].split(">", 1)[0]
        bits = np.array([int(x, 16) if x.startswith("0x") else _half_bits(float(x), elem)
                         for x in _ELEMENT.findall(body)], np.uint16)
    return _from_bf16_bits(bits) if isinstance(elem, ir.BF16Type) else bits.view(np.float16)


def _half_bits(x: float, elem: ir.Type) -> int:
    if isinstance(elem, ir.BF16Type):
        return int(_to_bf16_bits(np.array([x], np.float32))[0])
    return int(np.array([x], np.float16).view(np.uint16)[0])


_ELEMENT = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")


def _scalar(attr: ir.Attribute):
    if isinstance(attr, ir.FloatAttr) or str(attr.type).startswith(("f", "bf")):
        return ir.FloatAttr(attr).value
    if str(attr.type) == "i1":
        return (
            bool(ir.BoolAttr(attr).value)
            if isinstance(attr, ir.BoolAttr)
            else bool(ir.IntegerAttr(attr).value)
        )
    return ir.IntegerAttr(attr).value


def _affine(e: ir.AffineExpr, dims: list, syms: list = ()) -> Any:
    e = e.maybe_downcast()
    if isinstance(e, ir.AffineConstantExpr):
        return np.int64(e.value)
    if isinstance(e, ir.AffineDimExpr):
        return dims[e.position]
    if isinstance(e, ir.AffineSymbolExpr):
        return syms[e.position]
    a, b = _affine(e.lhs, dims, syms), _affine(e.rhs, dims, syms)
    if isinstance(e, ir.AffineAddExpr):
        return a + b
    if isinstance(e, ir.AffineMulExpr):
        return a * b
    if isinstance(e, ir.AffineFloorDivExpr):
        return a // b
    if isinstance(e, ir.AffineCeilDivExpr):
        return -((-a) // b)
    if isinstance(e, ir.AffineModExpr):
        return a % b
    raise OpfuseError(f"emulator: affine expression {e}")


def _combine(kind: str, a, b):
    return {
        "add": np.add,
        "mul": np.multiply,
        "maximumf": _maximumf,
        "minimumf": _minimumf,
        "maxnumf": np.fmax,
        "minnumf": np.fmin,
        "maxsi": np.maximum,
        "minsi": np.minimum,
        "maxui": np.maximum,
        "minui": np.minimum,
        "and": np.bitwise_and,
        "or": np.bitwise_or,
        "xor": np.bitwise_xor,
    }[kind](a, b)


def _maximumf(a, b):
    return np.maximum(a, b)  # propagates NaN, like arith.maximumf


def _minimumf(a, b):
    return np.minimum(a, b)


def _cmpf(op, a, b):
    pred = ir.IntegerAttr(op.attributes["predicate"]).value
    # arith.CmpFPredicate: false, oeq, ogt, oge, olt, ole, one, ord, ueq, ugt, uge, ult, ule, une, uno, true
    unordered = np.isnan(a) | np.isnan(b)
    base = [
        None,
        np.equal,
        np.greater,
        np.greater_equal,
        np.less,
        np.less_equal,
        np.not_equal,
        None,
        np.equal,
        np.greater,
        np.greater_equal,
        np.less,
        np.less_equal,
        np.not_equal,
        None,
        None,
    ][pred]
    if pred == 0:
        return np.zeros(np.broadcast(a, b).shape, bool)
    if pred == 15:
        return np.ones(np.broadcast(a, b).shape, bool)
    if pred == 7:
        return ~unordered
    if pred == 14:
        return unordered
    with np.errstate(invalid="ignore"):
        r = base(a, b)
    return (r & ~unordered) if pred < 8 else (r | unordered)


def _cmpi(op, a, b):
    pred = ir.IntegerAttr(op.attributes["predicate"]).value
    # eq, ne, slt, sle, sgt, sge, ult, ule, ugt, uge
    if pred >= 6:
        a, b = a.astype(np.uint64) if a.dtype != np.bool_ else a, (
            b.astype(np.uint64) if b.dtype != np.bool_ else b
        )
    return [
        np.equal,
        np.not_equal,
        np.less,
        np.less_equal,
        np.greater,
        np.greater_equal,
        np.less,
        np.less_equal,
        np.greater,
        np.greater_equal,
    ][pred](a, b)


def _unsigned_pick(cmp, a, b):
    """``a`` where ``cmp(a, b)`` as unsigned integers, else ``b`` (``arith.minui`` of -1 and
    15 is 15: a negative index is a huge unsigned one, which is how the emitters clamp)."""
    a, b = np.broadcast_arrays(a, b)
    unsigned = np.dtype(f"uint{a.dtype.itemsize * 8}")
    return np.where(cmp(a.view(unsigned), b.view(unsigned)), a, b)


def _f(fn):
    def wrap(op, *xs):
        with np.errstate(all="ignore"):
            return fn(*xs)

    return wrap


def _storage_type(t: ir.Type):
    """The numpy type of memory holding ``t`` values (bf16: its bits)."""
    return _BF16_BITS if isinstance(t, ir.BF16Type) else _np_type(t)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as float32; NaN stays."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), x, rounded.view(np.float32)).astype(np.float32)


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return (_round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def _select(op, c, a, b):
    """``arith.select``: a vector condition picks lane by lane; a scalar (per-thread) one
    picks whole vectors. Per-thread values are (threads,) or (threads, lanes) arrays,
    constants () or (lanes,): the op's types say which case this is, not the shapes."""
    c = np.asarray(c)
    scalar_cond = not isinstance(op.operands[0].type, ir.VectorType)
    if scalar_cond and isinstance(op.results[0].type, ir.VectorType) and c.ndim == 1:
        c = c[:, None]
    return np.where(c, a, b)


def _cast(op, x):
    return x.astype(_np_type(_elem(op.results[0].type)))


def _erf(x):
    v = np.vectorize(math.erf, otypes=[np.float64])
    return v(x.astype(np.float64)).astype(x.dtype)


_PURE = {
    "arith.addi": _f(np.add),
    "arith.subi": _f(np.subtract),
    "arith.muli": _f(np.multiply),
    "arith.divsi": _f(lambda a, b: np.trunc(a / b).astype(a.dtype)),
    "arith.divui": _f(np.floor_divide),
    "arith.remui": _f(np.remainder),
    "arith.remsi": _f(np.fmod),
    "arith.floordivsi": _f(np.floor_divide),
    "arith.ceildivsi": _f(lambda a, b: -((-a) // b)),
    "arith.minui": _f(lambda a, b: _unsigned_pick(np.less_equal, a, b)),
    "arith.maxui": _f(lambda a, b: _unsigned_pick(np.greater_equal, a, b)),
    "arith.minsi": _f(np.minimum),
    "arith.maxsi": _f(np.maximum),
    "arith.andi": _f(np.bitwise_and),
    "arith.ori": _f(np.bitwise_or),
    "arith.xori": _f(np.bitwise_xor),
    "arith.shli": _f(np.left_shift),
    "arith.shrui": _f(np.right_shift),
    "arith.shrsi": _f(np.right_shift),
    "arith.cmpi": _cmpi,
    "arith.cmpf": _cmpf,
    "arith.select": _select,
    "arith.addf": _f(np.add),
    "arith.subf": _f(np.subtract),
    "arith.mulf": _f(np.multiply),
    "arith.divf": _f(np.divide),
    "arith.remf": _f(np.fmod),
    "arith.negf": _f(np.negative),
    "arith.maximumf": _f(_maximumf),
    "arith.minimumf": _f(_minimumf),
    "arith.maxnumf": _f(np.fmax),
    "arith.minnumf": _f(np.fmin),
    "arith.extf": _cast,
    "arith.truncf": _cast,
    "arith.extsi": _cast,
    "arith.extui": _cast,
    "arith.trunci": _cast,
    "arith.sitofp": _cast,
    "arith.uitofp": _cast,
    "arith.fptosi": _cast,
    "arith.fptoui": _cast,
    "arith.index_cast": _cast,
    "arith.index_castui": _cast,
    "math.exp": _f(np.exp),
    "math.exp2": _f(np.exp2),
    "math.log": _f(np.log),
    "math.log2": _f(np.log2),
    "math.log1p": _f(np.log1p),
    "math.expm1": _f(np.expm1),
    "math.tanh": _f(np.tanh),
    "math.sqrt": _f(np.sqrt),
    "math.rsqrt": _f(lambda x: 1 / np.sqrt(x)),
    "math.absf": _f(np.abs),
    "math.absi": _f(np.abs),
    "math.sin": _f(np.sin),
    "math.cos": _f(np.cos),
    "math.tan": _f(np.tan),
    "math.atan": _f(np.arctan),
    "math.powf": _f(np.power),
    "math.fma": _f(lambda a, b, c: a * b + c),
    "math.ceil": _f(np.ceil),
    "math.floor": _f(np.floor),
    "math.round": _f(np.round),
    "math.roundeven": _f(np.rint),
    "math.trunc": _f(np.trunc),
    "math.erf": _f(_erf),
    "math.copysign": _f(np.copysign),
    "math.ipowi": _f(np.power),
    "math.fpowi": _f(np.power),
}


def run_program(
    program, inputs: Sequence[np.ndarray], *, outlined: bool = True, racecheck: bool = True
) -> list[np.ndarray]:
    """Run a :class:`~opfuse.codegen.gpu.GpuProgram` on the CPU: its host schedule with
    numpy buffers, each kernel emulated. ``outlined``: launch the outlined ``gpu.func``s
    with the arguments their KernelSpecs bind (exactly the cuda runtime's contract);
    otherwise run the ``kernels`` stage. ``racecheck``: see :class:`Emulator`."""
    from ..ir import make_context, parse_module
    from ..runtime.schedule import bind_params, plan_buffers, run_numpy

    module = parse_module(program.outlined_ir if outlined else program.kernels_ir, make_context())
    emu = Emulator(module, racecheck=racecheck)

    def call(func: str, args: list[np.ndarray], results: list[np.ndarray]) -> None:
        if outlined:
            spec = program.kernels[func]
            emu.run_entry(spec.entry, spec.grid, spec.block, bind_params(spec, args, results))
        else:
            emu.run(func, [*args, *results])

    schedule = program.schedule
    return run_numpy(schedule, plan_buffers(schedule), list(inputs), call)
