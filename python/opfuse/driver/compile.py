"""The one GPU program cache, and the GPU stages built from it.

``program(module, targets, ...)`` compiles a fused module for the GPU once per (module,
targets, entry, codegen options): ``fuse-opt --emit=kernels|nvvm|ptx|cubin|bundle`` and
``Executable.gpu_program`` / ``save_bundle`` all go through it, so asking for several
stages of one input compiles once. Each stage function returns the stage's artifact: text,
except the bundle (bytes). Stage names: :mod:`opfuse.driver.stages`.
"""

from __future__ import annotations

import json
import tempfile
import weakref
from pathlib import Path
from typing import Sequence

from mlir import ir

from ..runtime import bundle as rb
from ..backends.gpu import bundle
from ..backends.gpu.compiler import GpuProgram, compile_module
from ..backends.options import CodegenOptions
from . import progress

_PROGRAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def program(
    module: ir.Module,
    targets: Sequence[str] = ("sm_90",),
    *,
    want_nvvm: bool = False,
    ptxas: bool | None = None,
    entry: str | None = None,
    options: CodegenOptions | None = None,
    lower: bool = True,
    isolate: bool = True,
) -> GpuProgram:
    """The GpuProgram of ``module`` for ``targets`` (compiled once per module object and
    choices). ``options``: the codegen choices (``matmul``, ``allow_tf32``); None: the
    environment's (``OPFUSE_MATMUL``, ``OPFUSE_ALLOW_TF32``) at the first compile. The
    rest are :func:`~opfuse.backends.gpu.compiler.compile_module`'s."""
    per_module = _PROGRAMS.setdefault(module, {})
    key = (tuple(targets), ptxas, entry, options, lower, isolate)
    for (k, nvvm), prog in per_module.items():
        if k == key and (nvvm or not want_nvvm):
            return prog
    choices = {} if options is None else {"matmul": options.matmul,
                                          "allow_tf32": options.allow_tf32}
    with progress.stage("gpu"):  # kernels, nvvm, ptx and cubins, built together
        prog = compile_module(module, targets=targets, entry=entry, want_nvvm=want_nvvm,
                              ptxas=ptxas, lower=lower, isolate=isolate, **choices)
    per_module[(key, want_nvvm)] = prog
    return prog


def kernels(module: ir.Module, target: str = "sm_90",
            options: CodegenOptions | None = None) -> str:
    return program(module, (target,), ptxas=False, options=options).kernels_ir


def nvvm(module: ir.Module, target: str = "sm_90",
         options: CodegenOptions | None = None) -> str:
    prog = program(module, (target,), want_nvvm=True, ptxas=False, options=options)
    return "\n".join(prog.nvvm.get(target, {}).values())


def ptx(module: ir.Module, target: str = "sm_90",
        options: CodegenOptions | None = None) -> str:
    return program(module, (target,), ptxas=False, options=options).ptx_text(target)


def cubin(module: ir.Module, target: str = "sm_90",
          options: CodegenOptions | None = None) -> str:
    """ptxas -v figures per kernel, one line each (the cubins themselves go to bundles)."""
    prog = program(module, (target,), ptxas=True, options=options)
    lines = []
    for k in prog.kernels.values():
        r = k.resources.get(target, {})
        lines.append(
            f"{k.name}: entry={k.entry} emitter={k.emitter} grid={list(k.grid)} "
            f"block={list(k.block)} registers={r.get('registers')} "
            f"spill_stores={r.get('spill_stores')} spill_loads={r.get('spill_loads')} "
            f"smem={r.get('smem')} cubin_bytes={len(k.cubin.get(target, b''))}"
        )
    return "\n".join(lines) + "\n"


def bundle_bytes(
    module: ir.Module, targets: Sequence[str] = ("sm_80", "sm_90"), report: dict | None = None,
    options: CodegenOptions | None = None,
) -> bytes:
    """The AOT bundle of ``module`` as bytes (for ``-o FILE``)."""
    manifest, files = bundle.contents(
        module, targets=targets, report=report, program=program(module, targets, options=options)
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.opfuse"
        rb.write(path, manifest, files)
        return path.read_bytes()


def summary(module: ir.Module, target: str = "sm_90") -> str:
    """A JSON summary of the kernels (for reports)."""
    return json.dumps(program(module, (target,)).report(), indent=2)


__all__ = ["bundle_bytes", "cubin", "kernels", "nvvm", "program", "ptx", "summary"]
