"""The cuda runtime's host side without a GPU: a stand-in for cuda-python's driver module.

``cuda.bindings.driver`` is replaced by a fake whose memory is host memory and whose
``cuLaunchKernel`` runs the launched ``gpu.func`` in the lockstep emulator. Everything the
real runtime does around a launch runs for real: driver selection, allocations and copies,
the buffer plan, PTX/cubin choice, kernel-parameter marshalling (an array of pointers to
the argument values), CUDA-event timing, and error reporting that names the failing call.
"""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.compiler import compile_module
from opfuse.errors import OpfuseError
from opfuse.frontends.builder.graphs import graphs
from opfuse.ir import make_context, parse_module
from opfuse.runtime import cuda, cuda_driver

from test_codegen_common import assert_close, compile_cpu, inputs_of


class _Enum:
    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def __eq__(self, other):
        return isinstance(other, _Enum) and other.value == self.value

    def __hash__(self):
        return self.value


SUCCESS = _Enum("CUDA_SUCCESS", 0)
INVALID = _Enum("CUDA_ERROR_INVALID_VALUE", 1)


def fake_driver(program, emulator, log):
    mem: dict[int, np.ndarray] = {}
    entries = {}

    cu = types.ModuleType("cuda.bindings.driver")
    cu.CUresult = types.SimpleNamespace(CUDA_SUCCESS=SUCCESS)
    cu.CUdevice_attribute = types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
    )
    cu.CUdeviceptr = int
    cu.CUstream = int

    def ok(*values):
        return (SUCCESS, *values)

    cu.cuInit = lambda flags: ok()
    cu.cuDeviceGetCount = lambda: ok(1)
    cu.cuDeviceGet = lambda i: ok(0)
    cu.cuDevicePrimaryCtxRetain = lambda dev: ok("ctx")
    cu.cuCtxSetCurrent = lambda ctx: ok()
    cu.cuDeviceGetAttribute = lambda attr, dev: ok({"major": 9, "minor": 0}[attr])

    def alloc(n):
        a = np.zeros(n, np.uint8)
        mem[a.ctypes.data] = a
        log.append(("alloc", n))
        return ok(a.ctypes.data)

    cu.cuMemAlloc = alloc
    cu.cuMemFree = lambda p: ok() if mem.pop(int(p), None) is not None else (INVALID,)

    def copy(dst, src, n):
        ctypes.memmove(int(dst), int(src), n)
        return ok()

    cu.cuMemcpyHtoD = copy
    cu.cuMemcpyDtoH = copy
    cu.cuMemcpyDtoD = copy

    def load(image_ptr):
        text = ctypes.string_at(image_ptr).decode()
        names = [ln.split("(")[0].split()[-1] for ln in text.splitlines() if ".entry " in ln]
        return ok(tuple(names))

    cu.cuModuleLoadData = load
    cu.cuModuleGetFunction = lambda mod, name: (
        ok(name.decode()) if name.decode() in mod else (INVALID,)
    )

    def launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        func = emulator.gpu_funcs[fn]
        body = func.regions[0].blocks[0]
        n_wg = 0
        if "workgroup_attributions" in func.attributes:
            from mlir import ir

            n_wg = ir.IntegerAttr(func.attributes["workgroup_attributions"]).value
        args = list(body.arguments)[: len(body.arguments) - n_wg]
        pointers = (ctypes.c_uint64 * len(args)).from_address(params)
        arrays = []
        for a, p in zip(args, pointers):
            value = ctypes.c_uint64.from_address(p).value  # the device address
            dtype = {"f32": np.float32, "f16": np.float16}[str(a.type.element_type)]
            arrays.append(mem[value].view(dtype))
        log.append(("launch", fn, (gx, gy, gz), (bx, by, bz)))
        emulator.run_entry(fn, (gx, gy, gz), (bx, by, bz), arrays)
        return ok()

    cu.cuLaunchKernel = launch
    cu.cuCtxSynchronize = lambda: ok()
    cu.cuEventCreate = lambda flags: ok(object())
    cu.cuEventRecord = lambda ev, stream: ok()
    cu.cuEventSynchronize = lambda ev: ok()
    cu.cuEventElapsedTime = lambda a, b: ok(0.25)
    cu.cuEventDestroy = lambda ev: ok()
    return cu, mem, entries


@pytest.fixture
def fake_cuda(monkeypatch):
    state = {}

    def install(program):
        emulator = emulate.Emulator(parse_module(program.outlined_ir, make_context()))
        log: list = []
        cu, mem, _ = fake_driver(program, emulator, log)
        pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
        pkg.bindings, bindings.driver = bindings, cu
        monkeypatch.setitem(sys.modules, "cuda", pkg)
        monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
        monkeypatch.setitem(sys.modules, "cuda.bindings.driver", cu)
        monkeypatch.setitem(sys.modules, "pycuda", None)  # force the cuda-python binding
        monkeypatch.setattr(cuda_driver, "_DRIVER", {})
        state.update(log=log, mem=mem)
        return state

    return install


@pytest.mark.parametrize("name", ["g3_softmax", "g5_attention", "g6_encoder_layer"])
def test_cuda_runtime_on_the_fake_driver(fake_cuda, name):
    graph = graphs(small=True)[name]
    exe = compile_cpu(graph)
    args = inputs_of(graph)
    program = compile_module(exe._source, targets=("sm_90",), ptxas=False)
    state = fake_cuda(program)
    assert cuda.available() and cuda.device_chip() == "sm_90"
    prog = cuda.CudaProgram(program.schedule, program.kernels)
    assert prog.drv.name == "cuda-python" and set(prog.code.values()) == {"ptx"}
    assert_close(prog(*args), graph.reference(*args))
    launches = [e for e in state["log"] if e[0] == "launch"]
    assert len(launches) == len(program.schedule.calls())
    for (_, entry, grid, block), call in zip(launches, program.schedule.calls()):
        spec = program.kernels[call.func]
        assert entry == spec.entry and grid == spec.grid and block == spec.block
    assert prog.time(*args, repeat=3, warmup=1) == [0.25e-3] * 3


def test_driver_errors_name_the_call(fake_cuda):
    graph = graphs(small=True)["g2_elementwise_chain"]
    program = compile_module(compile_cpu(graph)._source, targets=("sm_90",), ptxas=False)
    fake_cuda(program)
    drv = cuda.driver("cuda-python")
    with pytest.raises(OpfuseError, match=r"cuMemFree failed: CUDA_ERROR_INVALID_VALUE"):
        drv.free(12345)
    with pytest.raises(OpfuseError, match=r"cuModuleGetFunction\(nope\) failed"):
        drv.function(("k",), "nope", 1)


def test_no_binding_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setattr(cuda_driver, "_DRIVER", {})
    assert not cuda.available()
    with pytest.raises(OpfuseError, match="pycuda: not installed.*cuda-python: not installed"):
        cuda.driver()


def test_code_choice_prefers_matching_cubins():
    from opfuse.runtime.schedule import KernelSpec

    spec = KernelSpec(
        "k",
        "k",
        "loop",
        [],
        (1, 1, 1),
        (32, 1, 1),
        ptx={"sm_80": "p80", "sm_90": "p90"},
        cubin={"sm_80": b"c80"},
    )
    assert cuda.choose_code(spec, "sm_90") == ("ptx", b"p90")  # no sm_9x cubin: JIT the PTX
    assert cuda.choose_code(spec, "sm_86") == ("cubin", b"c80")  # sm_80 cubins run on sm_86
    with pytest.raises(OpfuseError, match="no PTX or cubin for sm_75"):
        cuda.choose_code(spec, "sm_75")
    # sm_90a code (wgmma) runs on sm_90 devices only: never JIT-compiled forward
    wg = KernelSpec("k", "k", "wgmma", [], (1, 1, 1), (128, 1, 1), ptx={"sm_90a": "pa"},
                    cubin={"sm_90a": b"ca"})
    assert cuda.choose_code(wg, "sm_90") == ("cubin", b"ca")
    wg.cubin = {}
    assert cuda.choose_code(wg, "sm_90") == ("ptx", b"pa")
    with pytest.raises(OpfuseError, match="no PTX or cubin for sm_100"):
        cuda.choose_code(wg, "sm_100")


def test_kernel_times_and_freed_allocations(fake_cuda):
    """Per-kernel times (what gpu-check reports per kernel) come one per kernel call, in
    program order; a bound run's device memory is freed once nothing refers to it (the
    cuda-python binding hands out plain addresses, so opfuse frees them itself)."""
    import gc

    graph = graphs(small=True)["g1_mlp"]
    args = inputs_of(graph)
    program = compile_module(compile_cpu(graph)._source, targets=("sm_90",), ptxas=False)
    state = fake_cuda(program)
    prog = cuda.CudaProgram(program.schedule, program.kernels)
    before = len(state["mem"])  # the program's constants, if any
    times = prog.kernel_times(*args, repeat=2)
    assert times == [(c.func, 0.25e-3) for c in program.schedule.calls()]
    gc.collect()
    assert len(state["mem"]) == before
    run = prog.bind(*args)
    assert len(state["mem"]) > before
    assert_close(run(), graph.reference(*args))
    del run
    gc.collect()
    assert len(state["mem"]) == before
