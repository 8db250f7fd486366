"""The cuda backend: load each kernel (cubin, or PTX for the driver to JIT) and launch the
host schedule, through PyCUDA (or cuda-python where PyCUDA is not installed: see
:mod:`opfuse.runtime.cuda_driver`).

Nothing GPU-related is imported at import time of this module: the package works without
PyCUDA and without a GPU. Every driver call is checked and names itself when it fails.

Memory follows :class:`~opfuse.runtime.schedule.BufferPlan`: one device allocation per
intermediate slot (reused by liveness), one per input, constant and output. ``bind``
uploads the inputs once, keeps every allocation and packs every launch's parameters, so
repeated runs (timing) only launch; :mod:`.cuda_timing` measures them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import OpfuseError
from . import cuda_driver
from .schedule import Call, Copy, HostSchedule, KernelSpec, bind_params, plan_buffers


def driver(preferred: str | None = None) -> cuda_driver.Driver:
    """The CUDA driver binding in use (PyCUDA first, else cuda-python)."""
    return cuda_driver.get(preferred)


def available() -> bool:
    """A device answers through PyCUDA or cuda-python (never raises)."""
    try:
        driver()
        return True
    except Exception:  # noqa: BLE001
        return False


def device_chip() -> str:
    """``sm_XY`` of device 0."""
    major, minor = driver().compute_capability()
    return f"sm_{major}{minor}"


def _cc(chip: str) -> int:
    return int("".join(ch for ch in chip[3:] if ch.isdigit()))


def _runs_on(code_chip: str, cc: int) -> bool:
    """Code for ``code_chip`` may be used on a device of compute capability ``cc``: not
    newer; and architecture-specific code (``sm_90a``: wgmma) only on that very chip,
    PTX included (it is not forward-compatible)."""
    if code_chip.endswith("a"):
        return _cc(code_chip) == cc
    return _cc(code_chip) <= cc


def choose_code(spec: KernelSpec, chip: str) -> tuple[str, bytes]:
    """("cubin", data) built for the device's major version and a minor not above it
    (cubins run forward within a major), else ("ptx", text) of the newest chip not newer
    than the device (the driver JIT-compiles PTX forward); ``sm_90a`` code only on sm_90."""
    cc = _cc(chip)
    cubins = [c for c in spec.cubin if _cc(c) // 10 == cc // 10 and _runs_on(c, cc)]
    if cubins:
        return "cubin", spec.cubin[max(cubins, key=_cc)]
    usable = sorted((c for c in spec.ptx if _runs_on(c, cc)), key=_cc)
    if not usable:
        raise OpfuseError(
            f"kernel {spec.name}: no PTX or cubin for {chip} " f"(have {sorted(spec.ptx)})"
        )
    return "ptx", spec.ptx[usable[-1]].encode()


class CudaProgram:
    """A host schedule and its kernels on device 0.

    Args:
        schedule: the host schedule.
        kernels: KernelSpec per called kernel (PTX and/or cubins).
        chip: override the device's ``sm_XY`` when choosing code.
        binding: ``pycuda`` or ``cuda-python`` (default: whichever works, PyCUDA first).

    Each kernel loads as the cubin for the device when there is one, and falls back to the
    PTX (the driver compiles it) when the cubin does not load; :attr:`code` says which.
    """

    def __init__(
        self,
        schedule: HostSchedule,
        kernels: dict[str, KernelSpec],
        *,
        chip: str | None = None,
        binding: str | None = None,
    ):
        self.drv = driver(binding)
        self.schedule = schedule
        self.kernels = kernels
        self.chip = chip or device_chip()
        self.plan = plan_buffers(schedule)
        self.code: dict[str, str] = {}  # kernel -> "cubin" | "ptx" | "ptx (cubin: why)"
        self._functions: dict[str, Any] = {}
        self._modules = []
        for call in schedule.calls():
            if call.func in self._functions:
                continue
            spec = kernels.get(call.func)
            if spec is None:
                raise OpfuseError(f"no kernel for {call.func} in the program")
            self._functions[call.func] = self._load(spec)
        self._consts = {}
        for b, a in schedule.consts.items():
            ptr = self.drv.alloc(a.nbytes)
            self.drv.htod(ptr, a)
            self._consts[b] = ptr

    def _load(self, spec: KernelSpec) -> Any:
        kind, image = choose_code(spec, self.chip)
        try:
            mod = self.drv.load(image, kind, spec.name)
            self.code[spec.name] = kind
        except OpfuseError as e:
            ptx = [c for c in spec.ptx if _runs_on(c, _cc(self.chip))]
            if kind != "cubin" or not ptx:
                raise OpfuseError(f"kernel {spec.name}: {e}") from None
            mod = self.drv.load(spec.ptx[max(ptx, key=_cc)].encode(), "ptx", spec.name)
            self.code[spec.name] = f"ptx (the cubin did not load: {e})"
        self._modules.append(mod)
        return self.drv.function(mod, spec.entry, len(spec.params))

    def bind(self, *arrays: np.ndarray) -> "Bound":
        """Upload ``arrays`` once, allocate every buffer and pack every launch's parameters:
        the returned :class:`Bound` runs the program (``bound()`` -> outputs) as often as
        wanted without host-side work beyond one driver call per launch."""
        drv, plan, sched = self.drv, self.plan, self.schedule
        owned: list[Any] = []  # keeps allocations alive as long as the bound call
        mem: dict[int, Any] = {}
        for b, a in zip(sched.inputs, arrays):
            p = drv.alloc(a.nbytes)
            drv.htod(p, a)
            mem[b] = p
            owned.append(p)
        mem.update(self._consts)
        slots = [drv.alloc(n) for n in plan.slots]
        owned += slots
        ptr: dict[int, int] = {}
        for b in sched.buffers:
            r = plan.root[b.id]
            if r not in mem:
                if r in plan.slot_of:
                    mem[r] = slots[plan.slot_of[r]]
                else:  # outputs, and results nobody reads
                    mem[r] = drv.alloc(sched.buffers[r].nbytes)
                    owned.append(mem[r])
            ptr[b.id] = int(mem[r])
        steps: list[tuple[str, Callable[[], None]]] = []
        for s in sched.steps:
            if isinstance(s, Call):
                spec = self.kernels[s.func]
                args = bind_params(spec, [ptr[a] for a in s.args], [ptr[r] for r in s.results])
                raw = drv.prepare(self._functions[s.func], spec.grid, spec.block, spec.smem, args)
                for i in spec.zeroed:  # results the kernel adds into atomically
                    b = s.results[i]
                    n = sched.buffers[b].nbytes
                    steps.append(("zero", lambda b=b, n=n: drv.memset(ptr[b], 0, n)))
                steps.append((s.func, _named(spec, raw)))
            elif isinstance(s, Copy):
                n = self.schedule.buffers[s.dst].nbytes
                steps.append(("copy", lambda s=s, n=n: drv.dtod(ptr[s.dst], ptr[s.src], n)))
        return Bound(self, steps, ptr, owned)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self.bind(*arrays)()

    def time(self, *arrays: np.ndarray, repeat: int = 10, warmup: int = 2) -> list[float]:
        """Seconds per run of the whole schedule, measured with CUDA events (device time,
        inputs already on the device, outputs not downloaded)."""
        run = self.bind(*arrays)
        for _ in range(warmup):
            run.launch_only()
        self.drv.synchronize()
        return [self.drv.elapsed(run.launch_only) for _ in range(repeat)]

    def kernel_times(self, *arrays: np.ndarray, repeat: int = 10) -> list[tuple[str, float]]:
        """Seconds of each kernel call alone (CUDA events around one launch, fastest of
        ``repeat``), in program order, after one full run so every input of every kernel
        holds the values it has in a real run."""
        run = self.bind(*arrays)
        run.launch_only()
        self.drv.synchronize()
        return run.step_times(repeat)


def _named(spec: KernelSpec, launch: Callable[[], None]) -> Callable[[], None]:
    """``launch``, with the kernel named in any error it raises."""

    def named() -> None:
        try:
            launch()
        except OpfuseError as e:
            raise OpfuseError(f"{describe(spec)}: {e}") from None

    return named


def describe(spec: KernelSpec) -> str:
    return f"kernel {spec.name} (entry {spec.entry}, emitter {spec.emitter})"


class Bound:
    """A program bound to device buffers (:meth:`CudaProgram.bind`).

    Attributes:
        steps: ``(kernel name | "copy" | "zero", launcher)`` in program order ("zero": the
            memset of a result a kernel adds into atomically); each launcher
            enqueues one launch (parameters packed once) and names its kernel on error.
    """

    def __init__(self, program: CudaProgram, steps, ptr: dict[int, int], owned: list):
        self.program = program
        self.drv = program.drv
        self.steps = steps
        self.ptr = ptr
        self.owned = owned
        sched = program.schedule
        self._host = [np.empty(sched.buffers[o].shape, sched.buffers[o].dtype) for o in sched.outputs]

    def launch_only(self) -> None:
        """Enqueue every step (no synchronization)."""
        for _, launch in self.steps:
            launch()

    def outputs(self) -> list[np.ndarray]:
        self.drv.synchronize()
        for h, o in zip(self._host, self.program.schedule.outputs):
            self.drv.dtoh(h, self.ptr[o])
        return [h.copy() for h in self._host]

    def __call__(self) -> list[np.ndarray]:
        self.launch_only()
        return self.outputs()

    def run_checked(self) -> list[np.ndarray]:
        """Run once, synchronizing after every kernel: a fault (an illegal address, a
        trap) is reported with the kernel that caused it, not by a later call."""
        for name, launch in self.steps:
            launch()
            if name in ("copy", "zero"):
                continue
            try:
                self.drv.synchronize()
            except OpfuseError as e:
                spec = self.program.kernels[name]
                raise OpfuseError(f"{describe(spec)} failed on the device: {e}") from None
        return self.outputs()

    def kernels(self) -> list[tuple[str, Callable[[], None]]]:
        """``(name, launcher)`` of every kernel call, in program order."""
        return [(n, f) for n, f in self.steps if n not in ("copy", "zero")]

    def device_time(self) -> float:
        """Seconds of device time of one run (CUDA events; no transfers)."""
        return self.drv.elapsed(self.launch_only)

    def step_times(self, repeat: int) -> list[tuple[str, float]]:
        """(kernel, fastest of ``repeat`` solo launches) per kernel call, in order."""
        return [(n, min(self.drv.elapsed(f) for _ in range(repeat))) for n, f in self.kernels()]


def load(executable: Any) -> CudaProgram:
    """The Executable contract: compile ``executable``'s fused stage for device 0 and load
    it (``__call__(*arrays) -> list``, ``bind(*arrays) -> () -> list``)."""
    chip = device_chip()
    target = "sm_90" if _cc(chip) >= 90 else "sm_80"
    program = executable.gpu_program(targets=(target,))
    return CudaProgram(program.schedule, program.kernels, chip=chip)


def copy_bandwidth(nbytes: int = 1 << 30, repeat: int = 10) -> float:
    """Bytes per second of a device-to-device copy, bytes read plus written (the
    yardstick for the fused kernels' achieved bandwidth)."""
    drv = driver()
    a, b = drv.alloc(nbytes), drv.alloc(nbytes)
    drv.dtod(b, a, nbytes)
    drv.synchronize()
    best = min(drv.elapsed(lambda: drv.dtod(b, a, nbytes)) for _ in range(repeat))
    drv.free(a)
    drv.free(b)
    return 2 * nbytes / best


__all__ = [
    "Bound",
    "CudaProgram",
    "available",
    "choose_code",
    "copy_bandwidth",
    "device_chip",
    "driver",
    "load",
]
