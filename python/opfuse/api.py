"""``opfuse.compile``: one call from a graph to a runnable, inspectable program."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from mlir import ir

from .frontends.mlir import contract
from . import ir as oir
from .backends.options import CodegenOptions
from .errors import EXIT_INTERNAL_ERROR, OpfuseError
from .pipeline import Pipeline
from .analysis import ledger as ledger_mod
from .report.summary import build_report
from .driver import progress
from .driver.executable import Executable
from .driver.specialized import SpecializedExecutable
from .frontends.mlir import specialize

#: Without fusion the program is still outlined, one kernel per op: the unfused baseline is
#: compiled and measured exactly like the fused one.
UNFUSED_PIPELINE = "builtin.module(opfuse-outline)"

BACKENDS = ("auto", "cpu", "cuda")


def load_source(source: Any, ctx: ir.Context | None = None, *,
                limits: contract.Limits | None = None, entry: str | None = None) -> ir.Module:
    """A module from a path, MLIR text, an ``ir.Module`` (copied) or a builder Graph,
    checked against the input contract (:func:`opfuse.frontends.mlir.contract.accept`);
    with ``entry``, only that function and what it calls are kept and checked."""
    module, name = parse_source(source, ctx)
    return contract.accept(module, filename=name, limits=limits, entry=entry)


def parse_source(source: Any, ctx: ir.Context | None = None) -> tuple[ir.Module, str]:
    """(module, name for messages) of a source, parsed but not yet checked."""
    if isinstance(source, ir.Module):
        module = oir.parse_module(oir.print_module(source, debug_info=True), ctx or source.context)
        name = "<module>"
    elif hasattr(source, "to_mlir"):  # opfuse.builder.Graph, or anything that prints MLIR
        name = f"{getattr(source, 'name', 'graph')}.mlir"
        module = oir.parse_module(source.to_mlir(), ctx, filename=name)
    elif isinstance(source, (str, os.PathLike)):
        module = oir.load(source if not isinstance(source, os.PathLike) else Path(source), ctx)
        name = str(source) if "\n" not in str(source) else "<string>"
    else:
        raise OpfuseError(f"cannot compile a {type(source).__name__}: pass a path, MLIR text, "
                          "an mlir.ir.Module or an opfuse.builder.Graph")
    return module, name


def resolve_backend(backend: str) -> str:
    """``auto`` is cuda when a GPU runtime is usable here, else cpu."""
    if backend not in BACKENDS:
        raise OpfuseError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if backend != "auto":
        return backend
    try:
        from .runtime import cuda  # noqa: F401  (imports no CUDA binding until asked)
    except ImportError:
        return "cpu"
    return "cuda" if getattr(cuda, "available", lambda: False)() else "cpu"


def compile(  # noqa: A001  (the public name the issue asks for)
    source: Any,
    *,
    backend: str = "auto",
    target: str = "sm_90",
    pipeline: Pipeline | str | None = None,
    fusion: bool = True,
    dump_dir: str | os.PathLike | None = None,
    entry: str | None = None,
    max_tensor_bytes: int | str | None = None,
    threads: int | None = None,
    matmul: str | None = None,
    allow_tf32: bool | None = None,
    **pass_options: Any,
) -> Executable:
    """Compile ``source`` with the fusion pipeline and return a runnable Executable.

    Args:
        source: a ``.mlir`` path, MLIR text, an ``mlir.ir.Module`` or a builder Graph.
        backend: ``auto``, ``cpu`` or ``cuda``.
        target: the GPU the cost model plans for (``sm_80``, ``sm_90``).
        pipeline: a Pipeline or pipeline string replacing the default one.
        fusion: False compiles the unfused baseline (every op its own kernel).
        dump_dir: write the IR after every stage, the pipeline and the ledger there.
        entry: the function to run (default: the only public function).
        max_tensor_bytes: the input contract's tensor size limit (bytes, or "16GiB");
            default ``OPFUSE_MAX_TENSOR_BYTES``.
        threads: threads of the CPU backend's parallel tile loops (default
            ``OPFUSE_CPU_THREADS``, else every usable core; 1: single-threaded code);
            ``Executable.threads`` says what was used.
        matmul: the GPU matmul kernels (``auto``, ``mma``, ``wgmma``, ``simt``, or per
            kernel ``fusion_3_output=simt,auto``; default ``OPFUSE_MATMUL``, else auto):
            :mod:`opfuse.backends.options`.
        allow_tf32: f32 GPU matmuls may use TF32 tensor cores (default
            ``OPFUSE_ALLOW_TF32``, off).
        **pass_options: options for every default pass that has them (``delta=0.2``,
            ``r_limit=64``, ``disable=("opfuse-fuse-reduction",)``).

    Returns:
        An Executable: call it with numpy arrays; ``.report`` holds the ledger and
        totals; ``.ir(stage)`` the IR of ``linalg``, ``fused`` or ``cpu``.

    Raises:
        OpfuseError: the only exception it raises: bad input (exit code 1, located
            ``file:line:col`` diagnostics), or an internal error (exit code 2; the
            original exception is its ``__cause__``).
    """
    try:
        # None: the environment decides when the GPU program is built, as it always has.
        explicit = matmul is not None or allow_tf32 is not None
        codegen = CodegenOptions.resolve(matmul, allow_tf32, target) if explicit else None
        again = dict(backend=backend, target=target, pipeline=pipeline, fusion=fusion,
                     dump_dir=dump_dir, entry=entry, max_tensor_bytes=max_tensor_bytes,
                     threads=threads, matmul=matmul, allow_tf32=allow_tf32, **pass_options)
        return _compile(source, backend, target, pipeline, fusion, dump_dir, entry,
                        max_tensor_bytes, threads, codegen, pass_options,
                        at_shapes=lambda text: compile(text, **again))
    except OpfuseError:
        raise
    except RecursionError as e:
        raise OpfuseError("the input nests too deeply to compile", exit_code=EXIT_INTERNAL_ERROR) from e
    except Exception as e:  # noqa: BLE001  (the API's contract: OpfuseError only)
        raise OpfuseError(f"internal error: {type(e).__name__}: {e}",
                          exit_code=EXIT_INTERNAL_ERROR) from e


#: The keywords of :func:`compile` besides its pass options (``torch.compile``'s
#: ``options=`` is checked against them).
COMPILE_KEYWORDS: tuple[str, ...] = tuple(
    p.name for p in inspect.signature(compile).parameters.values()
    if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _compile(source: Any, backend: str, target: str, pipeline: Pipeline | str | None,
             fusion: bool, dump_dir: str | os.PathLike | None, entry: str | None,
             max_tensor_bytes: int | str | None, threads: int | None,
             codegen: CodegenOptions | None, pass_options: dict[str, Any],
             at_shapes: Any = None) -> Executable | SpecializedExecutable:
    if isinstance(max_tensor_bytes, str):
        max_tensor_bytes = contract.parse_bytes(max_tensor_bytes, "max_tensor_bytes")
    with progress.stage("linalg"):
        module, name = parse_source(source)
        dynamic = _dynamic_entry(module, entry)
        if dynamic is not None and at_shapes is not None:
            return _specialized(module, name, dynamic, at_shapes)
        module = contract.accept(module, filename=name,
                                 limits=contract.Limits(max_tensor_bytes), entry=entry)
        linalg_text = oir.print_module(module, debug_info=True)
        before = oir.parse_module(linalg_text, module.context)
    pipe = _choose_pipeline(pipeline, fusion, target, pass_options)
    if any(getattr(getattr(s, "options", None), "measure_registers", False) for s in pipe.steps):
        from .backends.gpu import measure  # the GPU backend's ptxas measurement, asked for

        measure.install()
    with progress.stage("fused"):
        ledger = pipe.run(module, dump_dir=dump_dir)
    with progress.stage("report"):
        report = build_report(before, module, ledger, target=target)
    report["pipeline"] = str(pipe)
    return Executable({"linalg": linalg_text, "fused": module}, entry,
                      backend=resolve_backend(backend), report=report, threads=threads,
                      codegen=codegen)


def _dynamic_entry(module: ir.Module, entry: str | None) -> ir.Operation | None:
    """The entry function if it has ``?`` dims (None if it has none, or no entry can be
    chosen: the contract then says why)."""
    try:
        func = oir.find_entry(module, entry)
    except OpfuseError:
        return None
    return func if specialize.is_dynamic(func) else None


def _specialized(module: ir.Module, name: str, func: ir.Operation,
                 compile_text: Any) -> SpecializedExecutable:
    """A dynamic entry: compiled at each call's shapes, with this call's options."""
    entry = ir.StringAttr(func.attributes["sym_name"]).value
    text = oir.print_module(module, debug_info=True)

    def at(shapes):
        with progress.stage("linalg"):
            static = specialize.specialize(text, shapes, entry=entry, filename=name)
        return compile_text(static)

    return SpecializedExecutable(entry, specialize.argument_shapes(func), at)


def _choose_pipeline(pipeline: Pipeline | str | None, fusion: bool, target: str,
                     pass_options: dict[str, Any]) -> Pipeline:
    if pipeline is not None:
        if pass_options:
            raise OpfuseError("pass options apply to the default pipeline; put them in the "
                              "pipeline string instead")
        return Pipeline.parse(pipeline) if isinstance(pipeline, str) else pipeline
    if not fusion:
        return Pipeline.parse(UNFUSED_PIPELINE)
    disable = pass_options.pop("disable", ())
    return Pipeline.default(disable=disable, target=target, **pass_options)


__all__ = ["COMPILE_KEYWORDS", "compile", "load_source", "UNFUSED_PIPELINE", "ledger_mod"]
