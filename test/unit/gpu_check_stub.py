"""A stand-in for the GPU, for tools/gpu/gpu-check's tests (``--stub this_file:make_driver``).

:class:`StubDriver` implements opfuse's :class:`~opfuse.runtime.cuda_driver.Driver` over
host memory. A launch runs the kernel's function from the bundle's CPU library (the same
fused function, so results are right), once per prepared launcher: later launches of it
only count (a kernel's inputs do not change between timing launches). CUDA events return
10 µs per launch enqueued between them. Everything the driver is asked is logged and
written to ``<folder>/stub-log/<key>.json`` at exit, for the tests to read.

:func:`make_torch` stands in for torch's CUDA calls the same way (the attention
section's SDPA, tools/gpu/gpu_check_attention.py): CPU torch computes, events, memsets and
synchronizes go into the driver's log, an SDPA call between events is 10 µs.

Planted failures (the factory's third argument): ``sync:<kernel>`` makes that kernel's
launch leave a sticky ``CUDA_ERROR_ILLEGAL_ADDRESS`` that the next synchronize reports
(as a real fault does); ``launch:<kernel>`` makes cuLaunchKernel itself fail (a kernel
may be named ``<bundle>/<kernel>``: only that bundle's launches fail); ``slow``
makes every event pair take 0.3 s of real time (a run that exceeds its deadline); ``cubin``
makes every cubin fail to load (the runtime must fall back to the PTX).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import time
from pathlib import Path

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.runtime import bundle as rb
from opfuse.runtime.cuda_driver import Driver
from opfuse.runtime.native import _Descriptor
from opfuse.runtime.schedule import Call

PER_LAUNCH_S = 1e-5


class StubDriver(Driver):
    name = "stub"

    def __init__(self, folder: Path, key: str, fail: str | None = None):
        self.folder, self.key, self.fail = Path(folder), key, fail
        self.log: list = []
        self.mem: dict[int, np.ndarray] = {}
        self.next = 1 << 20
        self.fault: str | None = None
        self.launches = 0
        self.images: dict[bytes, list] = {}  # code image -> [(bundle, kernel name)]
        self.native: dict[str, object] = {}
        if key not in ("device", "torch"):
            spec = json.loads((self.folder / "inputs.json").read_text())
            (e,) = [x for x in spec["entries"] if x["key"] == key]
            for bname, f in e["bundles"].items():
                b = rb.load(self.folder / f)
                self.native[bname] = (b, b.program("cpu")._impl)
                for kname, k in b.kernels.items():
                    for chip, text in k.ptx.items():
                        self.images.setdefault(text.encode(), []).append((bname, kname))
                    for chip, data in k.cubin.items():
                        self.images.setdefault(bytes(data), []).append((bname, kname))
        atexit.register(self.dump)

    def dump(self) -> None:
        out = self.folder / "stub-log" / f"{self.key}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(self.log))

    # ----- memory ---------------------------------------------------------------------------
    def compute_capability(self):
        return (9, 0)

    def alloc(self, nbytes):
        addr = self.next
        self.next += -(-max(1, nbytes) // 256) * 256 + 256
        self.mem[addr] = np.zeros(max(1, nbytes), np.uint8)
        return addr

    def free(self, ptr):
        self.mem.pop(int(ptr), None)

    def _bytes(self, ptr, n) -> np.ndarray:
        return self.mem[int(ptr)][:n]

    def htod(self, ptr, array):
        a = np.ascontiguousarray(array)
        self._bytes(ptr, a.nbytes)[:] = a.view(np.uint8).reshape(-1)

    def dtoh(self, array, ptr):
        array.view(np.uint8).reshape(-1)[:] = self._bytes(ptr, array.nbytes)

    def dtod(self, dst, src, nbytes):
        self._bytes(dst, nbytes)[:] = self._bytes(src, nbytes)

    def memset(self, ptr, byte, nbytes):
        self.log.append(["memset", nbytes])
        self._bytes(ptr, nbytes)[:] = byte

    def attribute(self, name):
        return {"L2_CACHE_SIZE": 1 << 16, "MULTIPROCESSOR_COUNT": 132}.get(name, 1)

    # ----- code ---------------------------------------------------------------------------
    def load(self, image, kind, name):
        self.log.append(["load", kind, name])
        if kind == "cubin" and self.fail == "cubin":
            raise OpfuseError(f"CUDA driver call cuModuleLoadData({name}, cubin) failed: "
                              "CUDA_ERROR_NO_BINARY_FOR_GPU")
        found = self.images.get(bytes(image).rstrip(b"\0"))
        if not found:
            raise OpfuseError(f"CUDA driver call cuModuleLoadData({name}, {kind}) failed: stub")
        return found

    def function(self, module, entry, n_params):
        for bname, kname in module:
            b, _ = self.native[bname]
            if b.kernels[kname].entry == entry:
                return (bname, kname)
        raise OpfuseError(f"CUDA driver call cuModuleGetFunction({entry}) failed: stub")

    def prepare(self, fn, grid, block, smem, args):
        bname, kname = fn
        self.log.append(["prepare", self.key, bname, kname])
        b, native = self.native[bname]
        spec = b.kernels[kname]
        call = next(s for s in b.schedule.steps if isinstance(s, Call) and s.func == kname)
        bufs = b.schedule.buffers

        def array(buf_id, ptr):
            buf = bufs[buf_id]
            if ptr is None:  # an argument the kernel does not use: any array of its shape
                return np.zeros(buf.shape, buf.dtype)
            return self._bytes(ptr, buf.nbytes).view(buf.dtype).reshape(buf.shape)

        ptrs = {tuple(p): int(a) for p, a in zip(spec.params, args)}
        arrays = [array(a, ptrs.get(("arg", i))) for i, a in enumerate(call.args)]
        arrays += [array(r, ptrs.get(("result", i))) for i, r in enumerate(call.results)]
        state = {"done": False}

        def launch() -> None:
            self.launches += 1
            self.log.append(["launch", self.key, bname, kname])
            if self.fail in (f"launch:{kname}", f"launch:{bname}/{kname}"):
                raise OpfuseError(
                    f"CUDA driver call cuLaunchKernel(grid={tuple(grid)}, block={tuple(block)}) "
                    "failed: CUDA_ERROR_LAUNCH_FAILED"
                )
            if self.fail in (f"sync:{kname}", f"sync:{bname}/{kname}"):
                self.fault = "CUDA_ERROR_ILLEGAL_ADDRESS"
            if not state["done"]:
                descs = [_Descriptor.of(a) for a in arrays]
                native._funcs[kname](*[ctypes.byref(d) for d in descs])
                state["done"] = True

        return launch

    # ----- synchronization and time -------------------------------------------------------
    def synchronize(self):
        self.log.append(["sync"])
        if self.fault:
            raise OpfuseError(f"CUDA driver call cuCtxSynchronize failed: {self.fault}")

    def elapsed(self, work):
        self.log.append(["event", "start"])
        before = self.launches
        work()
        self.log.append(["event", "end"])
        if self.fail == "slow":
            time.sleep(0.3)
        return max(1, self.launches - before) * PER_LAUNCH_S

    def close(self):
        pass


def make_driver(folder, key, fail=None) -> StubDriver:
    return StubDriver(folder, key, fail)


def make_torch(drv: StubDriver):
    """torch's CUDA device stood in for by CPU torch (see the module docstring)."""
    from gpu_check_attention import TorchCuda  # tools/ is on sys.path in gpu-check

    class StubTorch(TorchCuda):
        name = "stub-torch"
        device = "cpu"

        def __init__(self):
            import torch
            import torch.nn.functional as F

            self.torch, self.F = torch, F
            self.calls = 0
            self.done: dict = {}

        def sdpa(self, q, k, v, causal):
            # computed once per inputs (as the driver runs a kernel once per launcher):
            # the timing windows' thousands of calls only count
            self.calls += 1
            drv.log.append(["sdpa", list(q.shape), list(k.shape), causal])
            key = (id(q), id(k), id(v), causal)
            if key not in self.done:
                self.done[key] = (q, k, v, super().sdpa(q, k, v, causal))
            return self.done[key][3]

        def synchronize(self):
            drv.log.append(["sync"])

        def elapsed(self, work):
            drv.log.append(["event", "start"])
            before = self.calls
            work()
            drv.log.append(["event", "end"])
            return max(1, self.calls - before) * PER_LAUNCH_S

        def memset(self, buf, byte, nbytes):
            drv.log.append(["memset", nbytes])
            super().memset(buf, byte, nbytes)

        def attribute(self, name):
            return drv.attribute(name)

    return StubTorch()
