"""``Executable``: a program in all its stages, compiled for its backend on first use.

An Executable holds the text of every stage it was built from (``linalg``, ``fused``, ...,
docs/architecture.md) and drives the backends for the rest: the CPU backend lowers the
``cpu`` stage and the runtime's :class:`~opfuse.runtime.cpu.CpuProgram` runs it; the GPU
backend produces ``kernels``, ``nvvm``, ``ptx`` and the bundle. The compiled program is
kept for later calls. The calling convention at the boundary is the runtime's
(:mod:`opfuse.runtime.signature`).

It lives in the driver, not the runtime: it compiles, and the runtime only loads and runs.
"""

from __future__ import annotations

import time as _time
from typing import Any, Mapping, Sequence

import numpy as np
from mlir import ir

from ..errors import OpfuseError
from ..ir import find_entry, parse_module, print_module
from ..backends.options import CodegenOptions
from ..runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits  # noqa: F401
from ..runtime.signature import Signature, TensorSpec, signature_of  # noqa: F401
from . import progress
from .stages import MODULE_STAGES

#: Stage names in pipeline order (:mod:`opfuse.driver.stages`); ``cpu`` is the LLVM-dialect
#: module.
STAGES = MODULE_STAGES

#: Stages the CPU backend can compile from, most preferred first.
_CPU_SOURCES = ("fused", "linalg")

BACKENDS = ("cpu", "cuda")


class Executable:
    """A program in all its stages, compiled lazily for one backend.

    Args:
        stages: stage name -> module (text or ``ir.Module``); the CPU backend compiles from
            ``fused`` if present, else ``linalg``.
        entry: the function to call; default: the only public function with a body.
        backend: ``"cpu"`` or ``"cuda"``.
        report: any object (e.g. the fusion report); stored, never read.
        threads: threads of the CPU backend's tile loops (default ``OPFUSE_CPU_THREADS``,
            else every usable core).
        codegen: the GPU backend's choices (``matmul``, ``allow_tf32``) for
            :meth:`gpu_program` and :meth:`save_bundle` when they are not given there;
            None: the environment's.

    Attributes:
        entry: the entry function's name.
        backend: the backend name.
        signature: the entry's inputs and outputs (:class:`Signature`).
        report: what the caller stored.
    """

    def __init__(
        self,
        stages: Mapping[str, str | ir.Module],
        entry: str | None = None,
        *,
        backend: str = "cpu",
        report: Any = None,
        threads: int | None = None,
        codegen: CodegenOptions | None = None,
    ):
        if backend not in BACKENDS:
            raise OpfuseError(f"unknown backend {backend!r} (have: {', '.join(BACKENDS)})")
        if backend == "cuda":
            _check_cuda()
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise OpfuseError(f"unknown stage(s) {unknown} (stages: {', '.join(STAGES)})")
        self._stages = {
            s: (m if isinstance(m, str) else print_module(m)) for s, m in stages.items()
        }
        source = next((s for s in _CPU_SOURCES if s in self._stages), None)
        if source is None:
            raise OpfuseError(
                f"an Executable needs a {' or '.join(_CPU_SOURCES)} stage, got {list(stages)}"
            )
        self._source_stage = source
        self._source = parse_module(self._stages[source], filename=f"<{source}>")
        func = find_entry(self._source, entry)
        self.entry: str = ir.StringAttr(func.attributes["sym_name"]).value
        self.signature: Signature = signature_of(func)
        self.backend = backend
        self.report = report
        self.codegen = codegen
        self._program = None
        from ..backends.cpu.threads import resolve_threads

        #: threads of the CPU backend's tile loops (``threads``, else
        #: ``OPFUSE_CPU_THREADS``, else every usable core), resolved now so that a later
        #: change of the environment does not change a compiled program
        self.threads: int = resolve_threads(threads)

    @classmethod
    def from_module(
        cls,
        module: ir.Module | str,
        entry: str | None = None,
        *,
        stage: str = "linalg",
        backend: str = "cpu",
        report: Any = None,
        threads: int | None = None,
    ) -> "Executable":
        """An Executable from one module, recorded as ``stage``."""
        return cls({stage: module}, entry, backend=backend, report=report, threads=threads)

    @property
    def stages(self) -> tuple[str, ...]:
        """Stage names available now (``cpu`` appears once lowered)."""
        return tuple(s for s in STAGES if s in self._stages)

    def ir(self, stage: str) -> str:
        """The module text of ``stage``; ``cpu`` is lowered on demand for the cpu backend,
        the GPU stages ``kernels``, ``nvvm`` and ``ptx`` for the cuda backend (any
        Executable gets them from :meth:`gpu_program`; no GPU needed).

        Raises:
            OpfuseError: the stage is unknown or was not produced for this Executable.
        """
        if stage == "cpu" and stage not in self._stages and self.backend == "cpu":
            self._lower_cpu()
        if stage in ("kernels", "nvvm", "ptx") and stage not in self._stages and self.backend == "cuda":
            self.gpu_program()
        if stage not in self._stages:
            raise OpfuseError(
                f"no {stage!r} stage in this Executable (have: {', '.join(self.stages)})"
            )
        return self._stages[stage]

    def __call__(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the entry function; one result -> an array, several -> a tuple of arrays."""
        outs = self._compiled()(*arrays)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def pointer_call(self):
        """The compiled program's unchecked entry on raw data addresses
        (``call(pointers)``: inputs then outputs, contiguous, of the signature's shapes and
        dtypes; :meth:`opfuse.runtime.cpu.CpuProgram.call_pointers`), or None where the
        backend has none (the cuda runtime takes device buffers its own way)."""
        if self.backend != "cpu":
            return None
        return self._compiled().call_pointers

    def time(self, *arrays: np.ndarray, repeat: int = 10, warmup: int = 2) -> list[float]:
        """Seconds per call, ``repeat`` calls after ``warmup`` untimed ones.

        Arguments are validated and marshalled once, outside the timed region, so the
        figures are the compiled code's (host schedule + kernels), not numpy conversion.
        """
        if repeat < 1 or warmup < 0:
            raise OpfuseError(
                f"time(): repeat must be >= 1 and warmup >= 0, got {repeat}, {warmup}"
            )
        call = self._compiled().bind(*arrays)
        for _ in range(warmup):
            call()
        times = []
        for _ in range(repeat):
            t0 = _time.perf_counter()
            call()
            times.append(_time.perf_counter() - t0)
        return times

    @property
    def target(self) -> str:
        """The GPU the program was planned for (``sm_90`` unless compile() said otherwise)."""
        report = self.report if isinstance(self.report, dict) else {}
        return str(report.get("target") or "sm_90")

    def gpu_program(self, targets: Sequence[str] | None = None, **options: Any):
        """The GPU kernels and host schedule
        (:class:`opfuse.backends.gpu.compiler.GpuProgram`) of this program, compiled for
        ``targets`` (default: :attr:`target`) through the driver's one program cache
        (:func:`opfuse.driver.compile.program`). Needs no GPU: PTX always, cubins and
        ``ptxas -v`` figures when ptxas is installed. ``options``: ``ptxas``, ``matmul``,
        ``allow_tf32``, ``want_nvvm`` (default True), ``lower``, ``isolate``."""
        from .compile import program  # noqa: PLC0415  (loads the GPU backend)

        options = dict(options)
        unknown = set(options) - {"ptxas", "matmul", "allow_tf32", "want_nvvm", "lower",
                                  "isolate"}
        if unknown:
            raise OpfuseError(f"gpu_program(): unknown option(s) {sorted(unknown)}")
        codegen = self._codegen(options.pop("matmul", None), options.pop("allow_tf32", None))
        options.setdefault("want_nvvm", True)
        chips = tuple(targets or (self.target,))
        program = program(self._source, chips, entry=self.entry, options=codegen, **options)
        attached = self.__dict__.setdefault("_attached", [])
        if not any(p is program for p in attached):  # its stages and figures, once
            attached.append(program)
            chip = program.targets[0] if program.targets else None
            self._stages.setdefault("kernels", program.kernels_ir)
            if chip is not None:
                self._stages.setdefault("nvvm", "\n".join(program.nvvm.get(chip, {}).values()))
                self._stages.setdefault("ptx", program.ptx_text(chip))
            if isinstance(self.report, dict):
                _attach_gpu(self.report, program)
        return program

    def _codegen(self, matmul: str | None, allow_tf32: bool | None) -> CodegenOptions | None:
        """The codegen options of one call: its arguments over :attr:`codegen`."""
        if matmul is None and allow_tf32 is None:
            return self.codegen
        base = self.codegen
        return CodegenOptions.resolve(
            matmul if matmul is not None else (base.matmul if base else None),
            allow_tf32 if allow_tf32 is not None else (base.allow_tf32 if base else None))

    def save_bundle(self, path, targets: Sequence[str] = ("sm_80", "sm_90"), **options: Any):
        """Write the AOT bundle (kernels for ``targets``, host schedule, CPU library) to
        ``path``; see :mod:`opfuse.runtime.bundle`. Returns the path."""
        from ..backends.gpu import bundle

        codegen = ("ptxas", "matmul", "allow_tf32")  # compile_module's choices
        program = self.gpu_program(targets, **{k: v for k, v in options.items() if k in codegen})
        report = self.report if isinstance(self.report, dict) else None
        rest = {k: v for k, v in options.items() if k not in codegen[1:]}
        return bundle.write(path, self._source, targets=targets, program=program,
                            entry=self.entry, report=_json_safe(report), **rest)

    def _compiled(self):
        if self._program is None:
            if self.backend == "cpu":
                from ..runtime import cpu

                llvm = self._lower_cpu()
                with progress.stage("jit"):
                    self._program = cpu.CpuProgram(llvm, self.signature)
            else:  # pragma: no cover - needs a GPU backend
                # The cuda runtime's contract: load(executable) returns a program with
                # __call__(*arrays) -> list[np.ndarray] and bind(*arrays) -> () -> list.
                _check_cuda()
                from ..runtime import cuda

                self._program = cuda.load(self)
        return self._program

    @property
    def threaded_kernels(self) -> tuple[int, int]:
        """CPU: (kernels whose tile loops run on the threads, kernels); with more than one
        thread the others are too small to pay for the hand-off (backends/cpu/grain.py).
        Lowers the program if it was not yet."""
        from ..backends.cpu import lower as cpu_codegen

        if self.backend != "cpu":
            return (0, 0)
        return cpu_codegen.threaded_kernels(self._lower_cpu())

    def _lower_cpu(self) -> ir.Module:
        from ..backends.cpu import lower as cpu_codegen

        if getattr(self, "_llvm", None) is None:
            with progress.stage("cpu"):
                self._llvm = cpu_codegen.lower_to_llvm(self._source, threads=self.threads)
            self._stages["cpu"] = print_module(self._llvm)
        return self._llvm

    def __repr__(self) -> str:
        return f"Executable({self.signature}, backend={self.backend!r}, stages={list(self.stages)})"


def _attach_gpu(report: dict, program: Any) -> None:
    """Launch shapes and ``ptxas -v`` figures into the fusion report: ``report["gpu"]``
    per chip, and the first chip's measured registers joined to the kernel rows."""
    report.setdefault("gpu", {})
    for chip in program.targets:
        report["gpu"][chip] = [
            {k: v for k, v in row.items() if k not in program.targets} | row.get(chip, {})
            for row in program.report()]
    if program.targets and "kernels" in report:
        chip = program.targets[0]
        measured = {k.name: {**k.resources[chip], "arch": chip}
                    for k in program.kernels.values() if chip in k.resources}
        if measured:
            from ..report import summary

            attach = getattr(summary, "attach_measured", None)
            if attach is not None:
                attach(report, measured)


def _json_safe(value: Any) -> Any:
    import json

    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))


def _check_cuda() -> None:
    import importlib.util

    def found(mod: str) -> bool:
        try:
            return importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            return False

    if not (found("pycuda") or found("cuda.bindings")):
        raise OpfuseError("cuda backend not available: neither PyCUDA nor cuda-python "
                          "(cuda-bindings) is installed (pip install 'opfuse[cuda]' on a GPU machine)")
