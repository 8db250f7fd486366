"""The host schedule and kernel specs of a compiled program: plain data, no MLIR.

A compiled program is the entry function's body after outlining: calls of fused kernels
in order. :class:`HostSchedule` records it with buffers instead of SSA values; both
runtimes (PyCUDA on the GPU, the native CPU library of a bundle) execute the same
schedule, and :class:`BufferPlan` gives both the same memory plan: intermediates share
allocations when their lifetimes do not overlap.

Everything here round-trips through JSON (the AOT bundle's manifest) and imports nothing
but the standard library and numpy, so a machine without the compiler can run a bundle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Union

import numpy as np

from ..errors import OpfuseError

#: MLIR element type -> numpy dtype (bf16 travels as its bits).
DTYPES = {
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
    "i64": np.dtype(np.int64),
    "i32": np.dtype(np.int32),
    "i16": np.dtype(np.int16),
    "i8": np.dtype(np.int8),
}


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values to bf16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, 0x7FC0, rounded).astype(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) to float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def dtype_of(element_type: str) -> np.dtype:
    try:
        return DTYPES[element_type]
    except KeyError:
        raise ValueError(f"unsupported element type {element_type}") from None


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` if it is C-contiguous, else a C-contiguous copy; keeps 0-d arrays 0-d
    (``np.ascontiguousarray`` makes them 1-d, which no rank-0 tensor accepts)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


@dataclass(frozen=True)
class Buffer:
    """One tensor of the host schedule.

    Attributes:
        id: index in ``HostSchedule.buffers``.
        shape, element_type: the tensor type.
        role: ``input`` (argument ``index``), ``const`` (data in ``HostSchedule.consts``),
            or ``temp`` (written by a step; an output when listed in ``outputs``).
    """

    id: int
    shape: tuple[int, ...]
    element_type: str
    role: str
    index: int | None = None

    @property
    def dtype(self) -> np.dtype:
        return dtype_of(self.element_type)

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Call:
    """Run fused kernel ``func``: reads ``args``, writes ``results`` (buffer ids)."""

    func: str
    args: tuple[int, ...]
    results: tuple[int, ...]


@dataclass(frozen=True)
class View:
    """``dst`` is ``src``'s memory seen with ``dst``'s shape (a reshape: no kernel)."""

    dst: int
    src: int


@dataclass(frozen=True)
class Copy:
    """Copy ``src`` into ``dst`` (an output that is an input, or returned twice)."""

    dst: int
    src: int


Step = Union[Call, View, Copy]


@dataclass
class HostSchedule:
    """The entry function as buffers and steps.

    Attributes:
        entry: the entry function's name.
        buffers: every tensor.
        inputs, outputs: buffer ids of the arguments and results, in order.
        steps: calls, views and copies in execution order.
        consts: data of ``const`` buffers (by buffer id).
    """

    entry: str
    buffers: list[Buffer]
    inputs: list[int]
    outputs: list[int]
    steps: list[Step]
    consts: dict[int, np.ndarray] = field(default_factory=dict)

    def calls(self) -> list[Call]:
        return [s for s in self.steps if isinstance(s, Call)]

    def to_json(self) -> dict[str, Any]:
        def step(s: Step) -> dict:
            return {"op": type(s).__name__.lower(), **asdict(s)}

        return {
            "entry": self.entry,
            "buffers": [asdict(b) for b in self.buffers],
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "steps": [step(s) for s in self.steps],
        }

    @classmethod
    def from_json(
        cls, data: dict[str, Any], consts: dict[int, np.ndarray] | None = None
    ) -> "HostSchedule":
        buffers = [
            Buffer(b["id"], tuple(b["shape"]), b["element_type"], b["role"], b.get("index"))
            for b in data["buffers"]
        ]
        steps: list[Step] = []
        for s in data["steps"]:
            op = s["op"]
            if op == "call":
                steps.append(Call(s["func"], tuple(s["args"]), tuple(s["results"])))
            elif op == "view":
                steps.append(View(s["dst"], s["src"]))
            elif op == "copy":
                steps.append(Copy(s["dst"], s["src"]))
            else:
                raise ValueError(f"unknown schedule step {op!r}")
        return cls(
            data["entry"],
            buffers,
            list(data["inputs"]),
            list(data["outputs"]),
            steps,
            dict(consts or {}),
        )


@dataclass
class BufferPlan:
    """Where every buffer lives.

    Attributes:
        root: buffer id -> the buffer owning its memory (itself, or a view's source).
        slots: byte sizes of the reusable allocations for intermediates.
        slot_of: root buffer id -> slot index (intermediates only).
        pinned: roots that get memory of their own: inputs, constants, outputs.
    """

    root: dict[int, int]
    slots: list[int]
    slot_of: dict[int, int]
    pinned: set[int]

    @property
    def temp_bytes(self) -> int:
        return sum(self.slots)


def plan_buffers(schedule: HostSchedule) -> BufferPlan:
    """Assign intermediates to reusable slots by liveness (greedy best fit).

    A root's lifetime runs from the step that writes it to the last step that reads it or
    any view of it. Outputs never share: they are handed to the caller.
    """
    buffers = schedule.buffers
    root = {b.id: b.id for b in buffers}
    for s in schedule.steps:
        if isinstance(s, View):
            root[s.dst] = root[s.src]
    _check_read_only(schedule, root)
    pinned = {root[i] for i in schedule.inputs} | {root[o] for o in schedule.outputs}
    pinned |= {b.id for b in buffers if b.role in ("input", "const")}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, s in enumerate(schedule.steps):
        if isinstance(s, Call):
            reads, writes = s.args, s.results
        elif isinstance(s, View):
            reads, writes = (s.src,), ()
        else:
            reads, writes = (s.src,), (s.dst,)
        for b in writes:
            first.setdefault(root[b], t)
            last[root[b]] = max(last.get(root[b], t), t)
        for b in reads:
            last[root[b]] = max(last.get(root[b], t), t)
    slots: list[int] = []
    free: list[int] = []
    slot_of: dict[int, int] = {}
    ends: dict[int, list[int]] = {}
    for r, t in last.items():
        ends.setdefault(t, []).append(r)
    size = {b.id: b.nbytes for b in buffers}
    for t, s in enumerate(schedule.steps):
        born = [r for r, f in first.items() if f == t and r not in pinned and r not in slot_of]
        for r in born:
            need = size[r]
            fits = [i for i in free if slots[i] >= need]
            if fits:
                i = min(fits, key=lambda k: slots[k])
                free.remove(i)
            else:
                i = len(slots)
                slots.append(need)
            slot_of[r] = i
        for r in ends.get(t, []):
            if r in slot_of:
                free.append(slot_of[r])
    return BufferPlan(root, slots, slot_of, pinned)


def _check_read_only(schedule: HostSchedule, root: dict[int, int]) -> None:
    """Inputs and constants are never written: every runtime binds an input buffer to the
    caller's memory (the numpy array itself on the CPU, the uploaded copy that repeated
    runs reuse on the GPU). A schedule (from a bundle's manifest, say) that makes one a
    kernel result or a copy's destination, directly or through a view, is refused."""
    for s in schedule.steps:
        writes = s.results if isinstance(s, Call) else (s.dst,) if isinstance(s, Copy) else ()
        for b in writes:
            owner = schedule.buffers[root[b]]
            if owner.role in ("input", "const"):
                what = f"input #{owner.index}" if owner.role == "input" else "a constant"
                raise OpfuseError(
                    f"@{schedule.entry}: step {s} writes buffer {b}, which is {what}; "
                    "inputs and constants are read-only"
                )


@dataclass
class KernelSpec:
    """One GPU kernel: everything a runtime needs to launch it.

    Attributes:
        name: the fused function it implements (``fusion_3_loop``); schedule calls name it.
        entry: the PTX ``.entry`` symbol.
        emitter: which emitter built it (``loop``, ``rows``, ``mma``, ``matmul`` (SIMT),
            ``fallback``).
        params: per kernel argument, in launch order, ``["arg", i]`` or ``["result", i]``
            of the fused function (the outliner's order, read from the IR).
        grid, block: launch shape; ``smem``: dynamic shared memory bytes (static shared
            memory is in the PTX).
        ptx: PTX text per chip; ``resources``: ``ptxas -v`` figures per chip (when ptxas
            ran); ``cubin``: assembled code per chip (bytes, when ptxas ran).
        meta: what the emitter chose, for reports and estimates (matmuls: ``tile`` [bm,
            bn, bk], ``warps``, ``stages``, ``mma`` (the tensor-core kind) or absent);
            ``zeroed``: see :attr:`zeroed`.
    """

    name: str
    entry: str
    emitter: str
    params: list[tuple[str, int]]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0
    ptx: dict[str, str] = field(default_factory=dict)
    resources: dict[str, dict] = field(default_factory=dict)
    cubin: dict[str, bytes] = field(default_factory=dict)
    vector_lanes: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def zeroed(self) -> tuple[int, ...]:
        """Results the runtime fills with zero bytes before every launch: the kernel adds
        into them atomically from several blocks (a column sum in a row kernel)."""
        return tuple(int(i) for i in self.meta.get("zeroed", ()))

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "entry": self.entry,
            "emitter": self.emitter,
            "params": [list(p) for p in self.params],
            "grid": list(self.grid),
            "block": list(self.block),
            "smem": self.smem,
            "resources": self.resources,
            "vector_lanes": self.vector_lanes,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "KernelSpec":
        return cls(
            data["name"],
            data["entry"],
            data["emitter"],
            [(p[0], int(p[1])) for p in data["params"]],
            tuple(data["grid"]),
            tuple(data["block"]),
            int(data.get("smem", 0)),
            resources=dict(data.get("resources", {})),
            vector_lanes=int(data.get("vector_lanes", 1)),
            meta=dict(data.get("meta", {})),
        )


def bind_params(spec: KernelSpec, args: list, results: list) -> list:
    """The kernel's arguments in launch order, from a call's argument and result buffers."""
    out = []
    for kind, i in spec.params:
        out.append(args[i] if kind == "arg" else results[i])
    return out


__all__ = [
    "Buffer",
    "BufferPlan",
    "Call",
    "Copy",
    "HostSchedule",
    "KernelSpec",
    "Step",
    "View",
    "bind_params",
    "contiguous",
    "dtype_of",
    "plan_buffers",
]


def run_numpy(
    schedule: HostSchedule,
    plan: BufferPlan,
    inputs: list[np.ndarray],
    call: "Callable[[str, list[np.ndarray], list[np.ndarray]], None]",
    slots: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Execute ``schedule`` on host memory; ``call(func, args, results)`` runs one kernel
    (writing ``results`` in place). Outputs are fresh arrays; intermediates live in
    ``slots`` (byte arrays, reused across calls when given)."""
    bufs: dict[int, np.ndarray] = {}
    if slots is None:
        slots = [np.empty(n, dtype=np.uint8) for n in plan.slots]
    for b, arr in zip(schedule.inputs, inputs):
        bufs[b] = arr
    for b, data in schedule.consts.items():
        bufs[b] = data
    info = {b.id: b for b in schedule.buffers}

    def array(b: int) -> np.ndarray:
        if b in bufs:
            return bufs[b]
        r = plan.root[b]
        spec = info[b]
        if r != b:
            base = array(r)
            a = base.reshape(-1).view(np.uint8)[: spec.nbytes].view(spec.dtype).reshape(spec.shape)
        elif r in plan.slot_of:
            a = slots[plan.slot_of[r]][: spec.nbytes].view(spec.dtype).reshape(spec.shape)
        else:
            a = np.empty(spec.shape, spec.dtype)
        bufs[b] = a
        return a

    for s in schedule.steps:
        if isinstance(s, Call):
            call(s.func, [array(a) for a in s.args], [array(r) for r in s.results])
        elif isinstance(s, View):
            array(s.dst)
        else:
            np.copyto(array(s.dst), array(s.src).reshape(info[s.dst].shape))
    return [array(o) for o in schedule.outputs]
