"""The few CUDA driver calls the cuda runtime makes, over PyCUDA or cuda-python.

Two interchangeable implementations of :class:`Driver`:

* ``pycuda`` (the default when it imports): ``pycuda.driver``;
* ``cuda-python`` (``cuda.bindings.driver``, from the ``cuda-bindings`` package): the same
  calls through NVIDIA's own bindings; used when PyCUDA is not installed (GPU images often
  ship cuda-bindings but not PyCUDA, whose build needs the CUDA headers).

Both are imported on first use only. Every call is checked and a failure raises
:class:`OpfuseError` naming the driver call (``cuLaunchKernel(...) failed: ...``).

Launches are prepared once (:meth:`Driver.prepare`: the kernel's parameters packed into
the buffer the driver reads) and then cost one driver call each, so that timing many
launches between two events measures the kernels, not Python's argument packing.
"""

from __future__ import annotations

import atexit
from typing import Any, Callable

import numpy as np

from .. import config
from ..errors import OpfuseError

_DRIVER: dict[str, "Driver"] = {}


class Driver:
    """Device 0's primary context and the calls opfuse needs (device pointers are ints)."""

    name = "abstract"

    def compute_capability(self) -> tuple[int, int]: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def htod(self, ptr: int, array: np.ndarray) -> None: ...
    def dtoh(self, array: np.ndarray, ptr: int) -> None: ...
    def dtod(self, dst: int, src: int, nbytes: int) -> None: ...
    def load(self, image: bytes, kind: str, name: str) -> Any:
        """Load a module from ``image`` (``kind``: ``cubin`` or ``ptx``)."""

    def function(self, module: Any, entry: str, n_params: int) -> Any: ...
    def prepare(self, fn: Any, grid, block, smem: int, args: list[int]) -> Callable[[], None]:
        """A launcher: each call enqueues the kernel with these arguments (packed once)
        and checks the launch call's result."""
        raise NotImplementedError

    def launch(self, fn: Any, grid, block, smem: int, args: list[int]) -> None:
        self.prepare(fn, grid, block, smem, args)()

    def memset(self, ptr: int, byte: int, nbytes: int) -> None: ...
    def synchronize(self) -> None: ...
    def elapsed(self, work: Callable[[], None]) -> float:
        """Seconds of device time ``work`` enqueues (CUDA events around it)."""
        raise NotImplementedError

    def attribute(self, name: str) -> int:
        """A ``CU_DEVICE_ATTRIBUTE_<name>`` of device 0 (``L2_CACHE_SIZE``, ...)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the context (PyCUDA's is pushed on creation and must be popped)."""


def _check(what: str, fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except OpfuseError:
        raise
    except Exception as e:  # the bindings' error types
        raise OpfuseError(f"CUDA driver call {what} failed: {e}") from None


class PyCudaDriver(Driver):
    name = "pycuda"

    def __init__(self) -> None:
        import pycuda.driver as drv  # noqa: PLC0415  (optional dependency, loaded on use)

        self.drv = drv
        _check("cuInit", drv.init)
        if _check("cuDeviceGetCount", drv.Device.count) < 1:
            raise OpfuseError("no CUDA device")
        self.device = drv.Device(0)
        self.context = _check("cuDevicePrimaryCtxRetain", self.device.retain_primary_context)
        _check("cuCtxPushCurrent", self.context.push)

    def compute_capability(self):
        return self.device.compute_capability()

    def alloc(self, nbytes):
        return _Allocation(_check(f"cuMemAlloc({nbytes})", self.drv.mem_alloc, max(1, nbytes)))

    def free(self, ptr):
        if isinstance(ptr, _Allocation):
            ptr.handle.free()

    def htod(self, ptr, array):
        _check("cuMemcpyHtoD", self.drv.memcpy_htod, int(ptr), np.ascontiguousarray(array))

    def dtoh(self, array, ptr):
        _check("cuMemcpyDtoH", self.drv.memcpy_dtoh, array, int(ptr))

    def dtod(self, dst, src, nbytes):
        _check("cuMemcpyDtoD", self.drv.memcpy_dtod, int(dst), int(src), nbytes)

    def load(self, image, kind, name):
        if kind == "ptx" and not image.endswith(b"\0"):
            image = image + b"\0"  # the driver reads PTX up to its NUL
        return _check(f"cuModuleLoadData({name}, {kind})", self.drv.module_from_buffer, image)

    def function(self, module, entry, n_params):
        fn = _check(f"cuModuleGetFunction({entry})", module.get_function, entry)
        fn.prepare("P" * n_params)
        return fn

    def prepare(self, fn, grid, block, smem, args):
        what = f"cuLaunchKernel(grid={tuple(grid)}, block={tuple(block)})"
        grid, block, values = tuple(grid), tuple(block), [int(a) for a in args]
        try:  # PyCUDA's prepared_call packs on every call; pack once, launch many times
            from pycuda._pvt_struct import pack  # noqa: PLC0415

            buf = pack(fn.arg_format, *values)
            raw = fn._launch_kernel
        except (ImportError, AttributeError):
            return lambda: _check(what, fn.prepared_call, grid, block, *values, shared_size=smem)

        def launch() -> None:
            _check(what, raw, grid, block, buf, smem, None)

        return launch

    def memset(self, ptr, byte, nbytes):
        _check("cuMemsetD8", self.drv.memset_d8, int(ptr), byte, nbytes)

    def synchronize(self):
        _check("cuCtxSynchronize", self.drv.Context.synchronize)

    def attribute(self, name):
        attr = getattr(self.drv.device_attribute, name)
        return int(_check(f"cuDeviceGetAttribute({name})", self.device.get_attribute, attr))

    def close(self):
        if self.context is not None:
            ctx, self.context = self.context, None
            _check("cuCtxPopCurrent", self.drv.Context.pop)
            _check("cuDevicePrimaryCtxRelease", ctx.detach)

    def elapsed(self, work):
        start, end = self.drv.Event(), self.drv.Event()
        start.record()
        work()
        end.record()
        _check("cuEventSynchronize", end.synchronize)
        return start.time_till(end) / 1e3


class CudaPythonDriver(Driver):
    name = "cuda-python"

    def __init__(self) -> None:
        from cuda.bindings import driver as cu  # noqa: PLC0415  (optional dependency)

        self.cu = cu
        self._call("cuInit", cu.cuInit, 0)
        (n,) = self._call("cuDeviceGetCount", cu.cuDeviceGetCount)
        if n < 1:
            raise OpfuseError("no CUDA device")
        (self.device,) = self._call("cuDeviceGet", cu.cuDeviceGet, 0)
        (self.context,) = self._call(
            "cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain, self.device
        )
        self._call("cuCtxSetCurrent", cu.cuCtxSetCurrent, self.context)

    def _call(self, what: str, fn: Callable, *args) -> tuple:
        out = _check(what, fn, *args)
        if not isinstance(out, tuple):
            out = (out,)
        err, rest = out[0], out[1:]
        if err != self.cu.CUresult.CUDA_SUCCESS:
            name = getattr(err, "name", str(err))
            raise OpfuseError(f"CUDA driver call {what} failed: {name}")
        return rest

    def compute_capability(self):
        attr = self.cu.CUdevice_attribute
        (major,) = self._call(
            "cuDeviceGetAttribute",
            self.cu.cuDeviceGetAttribute,
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            self.device,
        )
        (minor,) = self._call(
            "cuDeviceGetAttribute",
            self.cu.cuDeviceGetAttribute,
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            self.device,
        )
        return int(major), int(minor)

    def alloc(self, nbytes):
        (ptr,) = self._call(f"cuMemAlloc({nbytes})", self.cu.cuMemAlloc, max(1, nbytes))
        return _DeviceBuffer(int(ptr), self)

    def free(self, ptr):
        if isinstance(ptr, _DeviceBuffer):
            ptr.release()
        else:
            self._call("cuMemFree", self.cu.cuMemFree, self.cu.CUdeviceptr(int(ptr)))

    def htod(self, ptr, array):
        a = np.ascontiguousarray(array)
        self._call(
            "cuMemcpyHtoD",
            self.cu.cuMemcpyHtoD,
            self.cu.CUdeviceptr(int(ptr)),
            a.ctypes.data,
            a.nbytes,
        )

    def dtoh(self, array, ptr):
        self._call(
            "cuMemcpyDtoH",
            self.cu.cuMemcpyDtoH,
            array.ctypes.data,
            self.cu.CUdeviceptr(int(ptr)),
            array.nbytes,
        )

    def dtod(self, dst, src, nbytes):
        self._call(
            "cuMemcpyDtoD",
            self.cu.cuMemcpyDtoD,
            self.cu.CUdeviceptr(int(dst)),
            self.cu.CUdeviceptr(int(src)),
            nbytes,
        )

    def load(self, image, kind, name):
        if kind == "ptx" and not image.endswith(b"\0"):
            image = image + b"\0"  # the driver reads PTX up to its NUL
        buf = np.frombuffer(image, dtype=np.uint8).copy()
        (mod,) = self._call(
            f"cuModuleLoadData({name}, {kind})", self.cu.cuModuleLoadData, buf.ctypes.data
        )
        return (mod, buf)

    def function(self, module, entry, n_params):
        (fn,) = self._call(
            f"cuModuleGetFunction({entry})", self.cu.cuModuleGetFunction, module[0], entry.encode()
        )
        return fn

    def prepare(self, fn, grid, block, smem, args):
        # kernelParams: an array of pointers, each to one argument's value (a device
        # address); both arrays live as long as the launcher
        values = np.array([int(a) for a in args], dtype=np.uint64)
        pointers = np.array([values.ctypes.data + 8 * i for i in range(len(args))], dtype=np.uint64)
        what = f"cuLaunchKernel(grid={tuple(grid)}, block={tuple(block)})"
        call = (
            fn,
            *[int(g) for g in grid],
            *[int(b) for b in block],
            int(smem),
            self.cu.CUstream(0),
            pointers.ctypes.data if len(args) else 0,
            0,
        )
        launch_kernel = self.cu.cuLaunchKernel

        def launch() -> None:
            self._call(what, launch_kernel, *call)

        launch.keep = (values, pointers)  # type: ignore[attr-defined]
        return launch

    def memset(self, ptr, byte, nbytes):
        self._call("cuMemsetD8", self.cu.cuMemsetD8, self.cu.CUdeviceptr(int(ptr)), byte, nbytes)

    def synchronize(self):
        self._call("cuCtxSynchronize", self.cu.cuCtxSynchronize)

    def attribute(self, name):
        attr = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        (value,) = self._call(
            f"cuDeviceGetAttribute({name})", self.cu.cuDeviceGetAttribute, attr, self.device
        )
        return int(value)

    def close(self):
        if self.context is not None:
            self.context = None
            self._call("cuDevicePrimaryCtxRelease", self.cu.cuDevicePrimaryCtxRelease, self.device)

    def elapsed(self, work):
        (start,) = self._call("cuEventCreate", self.cu.cuEventCreate, 0)
        (end,) = self._call("cuEventCreate", self.cu.cuEventCreate, 0)
        self._call("cuEventRecord", self.cu.cuEventRecord, start, self.cu.CUstream(0))
        work()
        self._call("cuEventRecord", self.cu.cuEventRecord, end, self.cu.CUstream(0))
        self._call("cuEventSynchronize", self.cu.cuEventSynchronize, end)
        (ms,) = self._call("cuEventElapsedTime", self.cu.cuEventElapsedTime, start, end)
        self._call("cuEventDestroy", self.cu.cuEventDestroy, start)
        self._call("cuEventDestroy", self.cu.cuEventDestroy, end)
        return float(ms) / 1e3


class _DeviceBuffer:
    """A cuda-python allocation: converts to its device address and is freed when the
    last reference goes (as PyCUDA's allocations are), so bound programs do not leak."""

    def __init__(self, ptr: int, drv: "CudaPythonDriver"):
        self.ptr = ptr
        self.drv = drv

    def __int__(self) -> int:
        return self.ptr

    def release(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            self.drv._call("cuMemFree", self.drv.cu.cuMemFree, self.drv.cu.CUdeviceptr(ptr))

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001  (interpreter shutdown: the context may be gone)
            pass


class _Allocation:
    """A PyCUDA allocation that converts to its device address."""

    def __init__(self, handle: Any):
        self.handle = handle

    def __int__(self) -> int:
        return int(self.handle)


IMPLEMENTATIONS = {"pycuda": PyCudaDriver, "cuda-python": CudaPythonDriver}


def _close(drv: Driver) -> None:
    """At exit: release the context (a PyCUDA context left pushed aborts the process)."""
    try:
        drv.close()
    except Exception:  # noqa: BLE001  (exiting: nothing to report to)
        pass


def install(drv: Driver) -> None:
    """Make ``drv`` the driver every later :func:`get` returns, whatever binding is asked
    for (a stand-in for the GPU: tools/gpu/gpu-check's tests run it on a stubbed driver)."""
    _DRIVER.clear()
    for key in ("auto", *IMPLEMENTATIONS):
        _DRIVER[key] = drv


def get(preferred: str | None = None) -> Driver:
    """The driver (created once): ``preferred`` (``pycuda`` or ``cuda-python``), else
    ``$OPFUSE_CUDA_BINDING``, else the first that works, PyCUDA first.

    Raises:
        OpfuseError: none works (each one's reason is listed).
    """
    preferred = preferred or config.CUDA_BINDING.get()
    key = preferred or "auto"
    if key in _DRIVER:
        return _DRIVER[key]
    order = [preferred] if preferred else list(IMPLEMENTATIONS)
    reasons = []
    for name in order:
        if name not in IMPLEMENTATIONS:
            raise OpfuseError(
                f"unknown CUDA driver binding {name!r} (have: {', '.join(IMPLEMENTATIONS)})"
            )
        if name in _DRIVER:
            return _DRIVER[name]
        try:
            drv = IMPLEMENTATIONS[name]()
        except ImportError as e:
            reasons.append(f"{name}: not installed ({e})")
            continue
        except OpfuseError as e:
            reasons.append(f"{name}: {e}")
            continue
        _DRIVER[name] = _DRIVER[key] = drv
        atexit.register(_close, drv)
        return drv
    raise OpfuseError(
        "cuda backend not available: "
        + "; ".join(reasons)
        + " (pip install 'opfuse[cuda]' on a GPU machine)"
    )


__all__ = ["CudaPythonDriver", "Driver", "PyCudaDriver", "get", "install"]
