"""``Executable``: a compiled program's stages, its signature, and a way to run and time it.

An Executable holds the text of every stage it was built from (``linalg``, ``fused``, ...,
docs/architecture.md) and compiles for its backend on first use, keeping the
compiled program (for the CPU: the ExecutionEngine) for later calls.

Calling convention:
    * inputs are numpy arrays, one per argument of the entry function, with exactly the
      argument's shape and dtype (no silent casts);
    * a function with one result returns one ``np.ndarray``; a function with several
      results returns a ``tuple`` of arrays, in result order;
    * ``bf16`` has no numpy dtype: bf16 inputs and outputs are ``np.uint16`` arrays holding
      the bit patterns (``ml_dtypes.bfloat16`` arrays are accepted as inputs when that
      package is installed). :func:`float32_to_bf16_bits` and :func:`bf16_bits_to_float32`
      convert.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np
from mlir import ir

from ..errors import OpfuseError
from ..ir import parse_module, print_module
from .schedule import DTYPES, bf16_bits_to_float32, contiguous, float32_to_bf16_bits  # noqa: F401

#: Stage names in pipeline order (docs/architecture.md); ``cpu`` is the LLVM-dialect module.
STAGES = ("linalg", "fused", "kernels", "nvvm", "ptx", "cubin", "cpu")

#: Stages the CPU backend can compile from, most preferred first.
_CPU_SOURCES = ("fused", "linalg")

BACKENDS = ("cpu", "cuda")

# MLIR element type -> numpy dtype at the function boundary (bf16 travels as its bits);
# kept in the MLIR-free schedule module, which bundles use without the compiler.
_NUMPY_DTYPES = DTYPES


@dataclass(frozen=True)
class TensorSpec:
    """Shape and element type of one argument or result.

    Attributes:
        shape: static dimensions.
        element_type: the MLIR spelling (``f32``, ``f16``, ``bf16``, ``i32``, ...).
    """

    shape: tuple[int, ...]
    element_type: str

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype used at the boundary (``uint16`` for bf16 bit patterns)."""
        return _NUMPY_DTYPES[self.element_type]

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.element_type}>"


@dataclass(frozen=True)
class Signature:
    """Inputs and outputs of an entry function."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"@{self.name}({ins}) -> ({outs})"

    def check_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Validate call arguments against the signature.

        Returns:
            The arrays, C-contiguous (copied only where they were not), bf16 ones viewed
            as ``uint16``.

        Raises:
            OpfuseError: wrong count, shape or dtype, naming the argument.
        """
        expected = self._expected
        if len(arrays) == len(expected) and all(
                type(a) is np.ndarray and a.dtype == dtype and a.shape == shape
                and a.flags.c_contiguous for a, (shape, dtype) in zip(arrays, expected)):
            return list(arrays)  # the common case, checked in one pass (per-call cost)
        if len(arrays) != len(self.inputs):
            raise OpfuseError(
                f"@{self.name} takes {len(self.inputs)} input(s) {self._ins()}, got {len(arrays)}"
            )
        checked = []
        for i, (a, spec) in enumerate(zip(arrays, self.inputs)):
            if not isinstance(a, np.ndarray):
                raise OpfuseError(
                    f"@{self.name} input #{i}: expected a numpy array {spec}, "
                    f"got {type(a).__name__}"
                )
            if spec.element_type == "bf16" and a.dtype.name == "bfloat16":
                a = a.view(np.uint16)  # ml_dtypes.bfloat16: same bits
            if a.dtype != spec.dtype:
                bf16 = spec.element_type == "bf16"
                hint = " (bf16 is passed as uint16 bit patterns)" if bf16 else ""
                raise OpfuseError(
                    f"@{self.name} input #{i}: expected dtype {spec.dtype} for {spec}, "
                    f"got {a.dtype}{hint}"
                )
            if tuple(a.shape) != spec.shape:
                raise OpfuseError(
                    f"@{self.name} input #{i}: expected shape {spec.shape} for {spec}, "
                    f"got {tuple(a.shape)}"
                )
            checked.append(contiguous(a))
        return checked

    @cached_property
    def _expected(self) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        return tuple((tuple(spec.shape), spec.dtype) for spec in self.inputs)

    def _ins(self) -> str:
        return "(" + ", ".join(map(str, self.inputs)) + ")"


def find_entry(module: ir.Module, entry: str | None = None) -> ir.Operation:
    """The entry ``func.func``: ``entry`` by name, else the only public function with a body.

    Raises:
        OpfuseError: no such function, or several public candidates and no name given.
    """
    funcs = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and len(op.regions[0].blocks) > 0:
            funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op
    if entry is not None:
        if entry not in funcs:
            raise OpfuseError(f"no function @{entry} in the module (have: {_names(funcs)})")
        return funcs[entry]
    public = [
        name
        for name, op in funcs.items()
        if "sym_visibility" not in op.attributes
        or ir.StringAttr(op.attributes["sym_visibility"]).value == "public"
    ]
    if len(public) != 1:
        what = f"several public functions ({_names(public)})" if public else "no public function"
        raise OpfuseError(f"cannot choose an entry function: {what}; name one with entry=")
    return funcs[public[0]]


def _names(names) -> str:
    return ", ".join("@" + n for n in names) or "none"


def signature_of(func: ir.Operation) -> Signature:
    """The Signature of a tensor-level ``func.func``.

    Raises:
        OpfuseError: an argument or result that is not a statically shaped tensor of a
            supported element type (i1 is rejected: store booleans as i8).
    """
    name = ir.StringAttr(func.attributes["sym_name"]).value
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)

    def spec(t: ir.Type, what: str) -> TensorSpec:
        if not isinstance(t, ir.RankedTensorType):
            raise OpfuseError(f"@{name} {what}: only ranked tensors are supported, got {t}")
        if not t.has_static_shape:
            raise OpfuseError(f"@{name} {what}: dynamic shapes are not supported yet, got {t}")
        elem = str(t.element_type)
        if elem not in _NUMPY_DTYPES:
            hint = " (store booleans as i8)" if elem == "i1" else ""
            raise OpfuseError(f"@{name} {what}: element type {elem} is not supported{hint}")
        return TensorSpec(tuple(t.shape), elem)

    inputs = tuple(spec(t, f"input #{i}") for i, t in enumerate(ftype.inputs))
    outputs = tuple(spec(t, f"result #{i}") for i, t in enumerate(ftype.results))
    return Signature(name, inputs, outputs)


class Executable:
    """A program in all its stages, compiled lazily for one backend.

    Args:
        stages: stage name -> module (text or ``ir.Module``); the CPU backend compiles from
            ``fused`` if present, else ``linalg``.
        entry: the function to call; default: the only public function with a body.
        backend: ``"cpu"`` or ``"cuda"``.
        report: any object (e.g. the fusion report); stored, never read.

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
        self._program = None
        from ..codegen.cpu_threads import resolve_threads

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
        """The GPU kernels and host schedule (:class:`opfuse.codegen.gpu.GpuProgram`) of
        this program, compiled for ``targets`` (default: :attr:`target`); cached per
        targets. Needs no GPU: PTX always, cubins and ``ptxas -v`` figures when ptxas is
        installed. ``options`` go to :func:`opfuse.codegen.gpu.compile_module`."""
        from ..codegen.gpu import compile_module

        key = (tuple(targets or (self.target,)), tuple(sorted(options.items())))
        cache = self.__dict__.setdefault("_gpu_programs", {})
        if key not in cache:
            options.setdefault("want_nvvm", True)
            program = compile_module(self._source, targets=key[0], entry=self.entry, **options)
            cache[key] = program
            chip = program.targets[0] if program.targets else None
            self._stages.setdefault("kernels", program.kernels_ir)
            if chip is not None:
                self._stages.setdefault("nvvm", "\n".join(program.nvvm.get(chip, {}).values()))
                self._stages.setdefault("ptx", program.ptx_text(chip))
            if isinstance(self.report, dict):
                _attach_gpu(self.report, program)
        return cache[key]

    def save_bundle(self, path, targets: Sequence[str] = ("sm_80", "sm_90"), **options: Any):
        """Write the AOT bundle (kernels for ``targets``, host schedule, CPU library) to
        ``path``; see :mod:`opfuse.runtime.bundle`. Returns the path."""
        from ..codegen import bundle

        codegen = ("ptxas", "matmul", "allow_tf32")  # compile_module's choices
        program = self.gpu_program(targets, **{k: v for k, v in options.items() if k in codegen})
        report = self.report if isinstance(self.report, dict) else None
        rest = {k: v for k, v in options.items() if k not in codegen[1:]}
        return bundle.write(path, self._source, targets=targets, program=program,
                            entry=self.entry, report=_json_safe(report), **rest)

    def _compiled(self):
        if self._program is None:
            if self.backend == "cpu":
                from . import cpu

                llvm = self._lower_cpu()
                self._program = cpu.CpuProgram(llvm, self.signature)
            else:  # pragma: no cover - needs a GPU backend
                # The cuda runtime's contract: load(executable) returns a program with
                # __call__(*arrays) -> list[np.ndarray] and bind(*arrays) -> () -> list.
                _check_cuda()
                from . import cuda

                self._program = cuda.load(self)
        return self._program

    @property
    def threaded_kernels(self) -> tuple[int, int]:
        """CPU: (kernels whose tile loops run on the threads, kernels); with more than one
        thread the others are too small to pay for the hand-off (codegen/cpu_grain.py).
        Lowers the program if it was not yet."""
        from ..codegen import cpu as cpu_codegen

        if self.backend != "cpu":
            return (0, 0)
        return cpu_codegen.threaded_kernels(self._lower_cpu())

    def _lower_cpu(self) -> ir.Module:
        from ..codegen import cpu as cpu_codegen

        if getattr(self, "_llvm", None) is None:
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
