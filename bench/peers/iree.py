"""IREE as a peer: the very ``.mlir`` text opfuse compiles, compiled by IREE for ``llvm-cpu``.

IREE (``iree-base-compiler`` and ``iree-base-runtime``, the ``bench`` extra) takes the same
linalg-on-tensors input as opfuse, so unlike the other peers it needs no hand-written
version of a graph: every case, G graph or file, is compiled from its MLIR text, for the
host CPU (``--iree-llvmcpu-target-cpu=host``: AVX-512 where present), once per graph, and
run by two peers on that one module:

* ``iree_st``: the ``local-sync`` driver, every dispatch on the calling thread (one
  thread: the comparison for opfuse's single-threaded code);
* ``iree_mt``: the ``local-task`` driver, dispatches split into workgroups run by a task
  pool of one worker per usable core (``--task_topology_max_group_count``).

Dispatch counts: the module compiled up to IREE's ``flow`` stage (``--compile-to=flow``),
where each ``flow.dispatch`` call site in the program is one kernel launch per call of the
graph, the analogue of opfuse's kernel count; ``executables`` counts the distinct kernels
those calls launch. The same count is taken for CUDA too: the module compiled (compile
only, no GPU needed) for ``--iree-hal-target-device=cuda --iree-cuda-target=sm_80`` up to
``flow``; sm_80 because IREE 3.13 has no ``sm_90`` in its CUDA target table.

Timing: inputs are put on the device once (:func:`iree.runtime.asdevicearray`); a call is
the entry function on them and the result read back as a numpy array (``to_host``), which
on the local drivers is a mapping, not a copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import Peer, Prepared

#: How the dispatch count is taken (recorded in the JSON).
IREE_METHOD = ("flow.dispatch call sites in the module compiled with --compile-to=flow "
               "(one per kernel launch per call); executables = distinct flow.executable ops")

_DISPATCH = re.compile(r"\bflow\.dispatch @")
_EXECUTABLE = re.compile(r"^\s*flow\.executable\s+(?:private\s+|public\s+)?@", re.M)
_ENTRY = re.compile(r"func\.func\s+(private\s+|public\s+)?@([\w$.]+)\s*\(")

COMPILE_FLAGS = ("--iree-llvmcpu-target-cpu=host",)
LLVM_CPU = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
            *COMPILE_FLAGS)

#: IREE's CUDA target for the dispatch counts (IREE 3.13's CUDA table has no sm_90).
CUDA_TARGET = "sm_80"
CUDA = ("--iree-hal-target-device=cuda", f"--iree-cuda-target={CUDA_TARGET}")
CUDA_NOTE = "sm_80 (IREE 3.13 has no sm_90)"


def count_dispatches(flow_text: str) -> dict[str, Any]:
    """Dispatch call sites and distinct executables in IREE's ``flow``-stage output."""
    return {"count": len(_DISPATCH.findall(flow_text)),
            "executables": len(_EXECUTABLE.findall(flow_text)), "method": IREE_METHOD}


def cuda_dispatches(text: str) -> dict[str, Any]:
    """:func:`count_dispatches` of ``text`` compiled for CUDA (:data:`CUDA_TARGET`) up to
    ``flow``, with the ``target``; ``not_available`` with IREE's error if it fails."""
    try:
        flow = compile_module(text, "--compile-to=flow", target=CUDA).decode()
    except RuntimeError as e:
        return {"not_available": f"iree-compile for cuda {CUDA_NOTE}: {e}"}
    return {**count_dispatches(flow), "target": CUDA_NOTE}


def public_entry(text: str) -> str:
    """The first public ``func.func`` of the module text (the entry opfuse runs too)."""
    for m in _ENTRY.finditer(text):
        if (m.group(1) or "").strip() != "private":
            return m.group(2)
    raise ValueError("no public func.func in the module")


def iree_compile() -> Path:
    """The ``iree-compile`` binary of iree-base-compiler, found without importing
    ``iree.compiler``: its Python package carries MLIR bindings of its own, which cannot
    load into a process that already holds opfuse's (a nanobind symbol clash), so the
    compiler always runs as a subprocess.

    Raises:
        ImportError: iree-base-compiler is not installed.
    """
    spec = importlib.util.find_spec("iree.compiler")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "_mlir_libs" / "iree-compile"
        if path.is_file():
            return path
    raise ImportError("iree-base-compiler is not installed (no iree-compile found)")


def compile_module(text: str, *flags: str, target: Sequence[str] = LLVM_CPU) -> bytes:
    """``iree-compile`` of ``text`` for ``target`` (default llvm-cpu on the host), with
    ``flags``; its output.

    Raises:
        RuntimeError: iree-compile failed (its first error lines).
    """
    cmd = [str(iree_compile()), "-", *target, *flags, "-o", "-"]
    proc = subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=600)
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError("iree-compile failed: " + " | ".join(lines[:3]))
    return proc.stdout


class Compiled:
    """One module compiled by IREE: the VM flatbuffer, its dispatch counts, compile time."""

    def __init__(self, text: str) -> None:
        self.kernels = count_dispatches(compile_module(text, "--compile-to=flow").decode())
        self.kernels["cuda"] = cuda_dispatches(text)
        t0 = time.perf_counter()
        self.vmfb = compile_module(text)
        self.compile_s = time.perf_counter() - t0
        self.entry = public_entry(text)


class IreeCompiler:
    """Compiles each module text once for both IREE peers (the last one kept)."""

    def __init__(self) -> None:
        iree_compile()  # ImportError now, at discovery, when it is not installed
        self.version = _dist("iree-base-compiler")
        self._key: str | None = None
        self._compiled: Compiled | None = None

    def get(self, text: str) -> Compiled:
        key = hashlib.sha256(text.encode()).hexdigest()
        if key != self._key:
            self._compiled, self._key = Compiled(text), key
        assert self._compiled is not None
        return self._compiled


def usable_cores() -> int:
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


_FLAGS_SET = False


def set_task_workers(workers: int) -> None:
    """The ``local-task`` pool size; must be set before the first ``local-task`` device
    is made (the flag is read then), so once per process."""
    global _FLAGS_SET
    import iree.runtime as rt

    if not _FLAGS_SET:
        rt.flags.parse_flags(f"--task_topology_max_group_count={workers}")
        _FLAGS_SET = True


def _dist(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def make_runner(compiled: Compiled, driver: str, arrays: Sequence[np.ndarray]):
    """A zero-argument function running the compiled module's entry once on ``driver``,
    and its first output (numpy)."""
    import iree.runtime as rt

    config = rt.Config(driver)
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, compiled.vmfb))
    fn = ctx.modules.module[compiled.entry]
    device_inputs = [rt.asdevicearray(config.device, np.ascontiguousarray(a)) for a in arrays]

    def run():
        out = fn(*device_inputs)
        first = out[0] if isinstance(out, (tuple, list)) else out
        return first.to_host()

    keep = (ctx, config)  # the context owns the loaded module: keep it with the runner

    def run_kept():
        _ = keep
        return run()

    return run_kept, np.asarray(run())


class IreePeer(Peer):
    """One IREE driver on the module text of each case (a :class:`IreeCompiler` shared
    with the other IREE peer compiles it once)."""

    source = "mlir"  # prepare() gets the case's MLIR text, not a model function

    def __init__(self, name: str, driver: str, workers: int, compiler: IreeCompiler) -> None:
        import iree.runtime  # noqa: F401  (ImportError at discovery, not at the first graph)

        self.name, self.driver, self.workers, self.compiler = name, driver, workers, compiler
        self.version = compiler.version

    def warm_up(self) -> None:
        t0 = time.perf_counter()
        self.prepare(_TINY, [np.ones((4, 4), np.float32)]).run()
        self.init_s = time.perf_counter() - t0

    def prepare(self, text: str, arrays: Sequence[np.ndarray]) -> Prepared:
        compiled = self.compiler.get(text)
        if self.driver == "local-task":
            set_task_workers(self.workers)
        run, output = make_runner(compiled, self.driver, arrays)
        kernels = dict(compiled.kernels, driver=self.driver, threads=self.workers)
        return Prepared(run, output, compiled.compile_s, kernels)


def make_peers(threads: int) -> dict[str, Any]:
    """Makers of the two IREE peers (``iree_st``, ``iree_mt``) sharing one compiler; the
    ``local-task`` pool gets ``threads`` workers when more than one, else every usable
    core (it is the multi-threaded peer whatever the other peers are limited to).

    Raises:
        ImportError: iree-base-compiler is not installed (iree-base-runtime: when a maker
            is called).
    """
    compiler = IreeCompiler()
    workers = threads if threads > 1 else usable_cores()
    return {"iree_st": lambda: IreePeer("iree_st", "local-sync", 1, compiler),
            "iree_mt": lambda: IreePeer("iree_mt", "local-task", workers, compiler)}


_TINY = """func.func @tiny(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %e = tensor.empty() : tensor<4x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
       ins(%x : tensor<4x4xf32>) outs(%e : tensor<4x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = math.tanh %a : f32
    %m = arith.mulf %t, %a : f32
    linalg.yield %m : f32
  } -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
"""
