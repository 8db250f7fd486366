"""Run a bundle's native CPU library (ctypes, no MLIR) with the host schedule.

The library exports ``_mlir_ciface_opfuse_call_<kernel>(desc*...)`` per fused kernel:
one pointer to a memref descriptor (allocated, aligned, offset, sizes, strides) per
argument, then per result; the kernel writes its results in place. The host schedule and
buffer plan are the same as on the GPU (:mod:`opfuse.runtime.schedule`).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import OpfuseError
from .schedule import HostSchedule, contiguous, plan_buffers, run_numpy

WRAPPER_SYMBOL = "_mlir_ciface_opfuse_call_{}"


class _Descriptor:
    """Memref descriptor structs, one ctypes class per rank."""

    _classes: dict[int, type] = {}

    @classmethod
    def of(cls, array: np.ndarray) -> ctypes.Structure:
        rank = array.ndim
        struct = cls._classes.get(rank)
        if struct is None:
            fields = [
                ("allocated", ctypes.c_void_p),
                ("aligned", ctypes.c_void_p),
                ("offset", ctypes.c_int64),
            ]
            if rank:
                fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
            struct = type(f"NativeMemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})
            cls._classes[rank] = struct
        d = struct()
        d.allocated = d.aligned = array.ctypes.data
        d.offset = 0
        if rank:
            d.sizes[:] = array.shape
            d.strides[:] = [s // array.itemsize for s in array.strides]
        return d


class NativeProgram:
    """A host schedule whose kernels are functions of a shared library.

    Args:
        library: path of the ``.so``.
        schedule: the host schedule.
        kernels: kernel name -> symbol (default: ``_mlir_ciface_opfuse_call_<name>``).
    """

    def __init__(
        self, library: str | Path, schedule: HostSchedule, kernels: dict[str, str] | None = None
    ):
        try:
            self._lib = ctypes.CDLL(str(library))
        except OSError as e:
            raise OpfuseError(f"cannot load the CPU library {library}: {e}") from None
        self.schedule = schedule
        self.plan = plan_buffers(schedule)
        self._lock = threading.Lock()
        self._funcs: dict[str, Callable] = {}
        for call in schedule.calls():
            sym = (kernels or {}).get(call.func, WRAPPER_SYMBOL.format(call.func))
            try:
                fn = getattr(self._lib, sym)
            except AttributeError:
                raise OpfuseError(
                    f"the CPU library has no symbol {sym} for kernel {call.func}"
                ) from None
            fn.restype = None
            self._funcs[call.func] = fn

    def _call(self, func: str, args: list[np.ndarray], results: list[np.ndarray]) -> None:
        descs = [_Descriptor.of(a) for a in (*args, *results)]
        # a kernel's workspace is a global of the library (backends/cpu/buffers.py): one
        # call at a time (ctypes releases the GIL)
        with self._lock:
            self._funcs[func](*[ctypes.byref(d) for d in descs])

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return run_numpy(self.schedule, self.plan, list(inputs), self._call)

    def bind(self, *inputs: np.ndarray) -> Callable[[], list[np.ndarray]]:
        slots = [np.empty(n, dtype=np.uint8) for n in self.plan.slots]
        arrays = list(inputs)

        def run() -> list[np.ndarray]:
            return run_numpy(self.schedule, self.plan, arrays, self._call, slots)

        return run


def check_inputs(schedule: HostSchedule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Exact dtype and shape per input (no casts); C-contiguous copies where needed."""
    if len(inputs) != len(schedule.inputs):
        raise OpfuseError(
            f"@{schedule.entry} takes {len(schedule.inputs)} input(s), got {len(inputs)}"
        )
    out = []
    for i, (a, b) in enumerate(zip(inputs, schedule.inputs)):
        spec = schedule.buffers[b]
        if not isinstance(a, np.ndarray):
            raise OpfuseError(
                f"@{schedule.entry} input #{i}: expected a numpy array, got {type(a).__name__}"
            )
        if spec.element_type == "bf16" and a.dtype.name == "bfloat16":
            a = a.view(np.uint16)
        if a.dtype != spec.dtype or tuple(a.shape) != spec.shape:
            raise OpfuseError(
                f"@{schedule.entry} input #{i}: expected {spec.dtype}{list(spec.shape)}, "
                f"got {a.dtype}{list(a.shape)}"
            )
        out.append(contiguous(a))
    return out
