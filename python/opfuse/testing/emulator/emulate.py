"""Run the ``kernels`` stage on the CPU: every thread of a launch in lockstep, with numpy.

This is how the GPU kernels are tested on machines without a GPU. It interprets the IR
the emitters produce (before outlining and lowering: ``gpu.launch`` bodies of ``arith``,
``math``, ``affine.apply``, ``memref``/``vector`` loads and stores, ``scf.if``/``scf.for``,
``gpu.shuffle``, ``gpu.barrier``; the tensor-core and ``cp.async`` ops of
:mod:`opfuse.testing.emulator.mma`): each SSA value is a numpy array with one row per thread
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
(the emitters give every output element one writer, or combine into it with
``memref.atomic_rmw``: :mod:`.atomics`), and warp-synchronous assumptions (a
shuffle always sees its whole warp).
Floating point follows numpy in the element type (``exp`` is exact-ish here and
approximate on the GPU): compare with tolerances.

This module holds the entry points (:class:`Emulator`, :func:`run_program`) and the
interpreter's loop over the IR; :mod:`.state` the launch state and race check,
:mod:`.instructions` the element types and scalar instructions.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mlir import ir

from ...errors import OpfuseError
from . import atomics as emulate_atomics, mma as emulate_mma, wgmma as emulate_wgmma
# The launch state and the scalar instructions live in their own modules; every name is
# re-exported here (tests use emulate._round_bf16, emulate._elements, ...).
from .instructions import (  # noqa: F401
    _BF16_BITS,
    _ELEMENT,
    _FLOAT,
    _INT,
    _PURE,
    _affine,
    _cast,
    _cmpf,
    _cmpi,
    _combine,
    _const,
    _elem,
    _elements,
    _erf,
    _f,
    _from_bf16_bits,
    _half_bits,
    _lanes,
    _maximumf,
    _minimumf,
    _np_type,
    _round_bf16,
    _scalar,
    _select,
    _storage_type,
    _to_bf16_bits,
    _unsigned_pick,
)
from .state import WARP, _check_alignment, _check_convergent, _Launch, _RaceCheck  # noqa: F401

#: Ops the tensor-core modules emulate (wgmma's extractvalue also checks readiness).
_HANDLERS = {**emulate_mma.HANDLERS, **emulate_wgmma.HANDLERS, **emulate_atomics.HANDLERS}


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


def run_program(
    program, inputs: Sequence[np.ndarray], *, outlined: bool = True, racecheck: bool = True
) -> list[np.ndarray]:
    """Run a :class:`~opfuse.backends.gpu.compiler.GpuProgram` on the CPU: its host schedule with
    numpy buffers, each kernel emulated. ``outlined``: launch the outlined ``gpu.func``s
    with the arguments their KernelSpecs bind (exactly the cuda runtime's contract);
    otherwise run the ``kernels`` stage. ``racecheck``: see :class:`Emulator`."""
    from ...ir import make_context, parse_module
    from ...runtime.schedule import bind_params, plan_buffers, run_numpy

    module = parse_module(program.outlined_ir if outlined else program.kernels_ir, make_context())
    emu = Emulator(module, racecheck=racecheck)

    def call(func: str, args: list[np.ndarray], results: list[np.ndarray]) -> None:
        spec = program.kernels[func]
        for i in spec.zeroed:  # what the cuda runtime memsets before the launch
            results[i].reshape(-1).view(np.uint8)[:] = 0
        if outlined:
            emu.run_entry(spec.entry, spec.grid, spec.block, bind_params(spec, args, results))
        else:
            emu.run(func, [*args, *results])

    schedule = program.schedule
    return run_numpy(schedule, plan_buffers(schedule), list(inputs), call)
