"""The GPU stages for the tools (``fuse-opt --emit=kernels|nvvm|ptx|cubin|bundle``).

Each function takes the fused module and returns the stage's artifact: text, except the
bundle (bytes). They share one compilation per (module, targets) through
:func:`program`, so asking for several stages of one input compiles once.
"""

from __future__ import annotations

import json
import tempfile
import weakref
from pathlib import Path
from typing import Sequence

from mlir import ir

from ..runtime import bundle as rb
from . import bundle
from .gpu import GpuProgram, compile_module

#: Stage name -> one-line help (fuse-opt --help lists them).
HELP = {
    "kernels": "one gpu.launch per fused kernel, before outlining (GPU codegen)",
    "nvvm": "the kernels lowered to the NVVM/LLVM dialect",
    "ptx": "PTX of every kernel",
    "cubin": "ptxas -v figures per kernel (cubins go into bundles)",
    "bundle": "AOT bundle (zip: kernels, host schedule, CPU library); needs -o FILE",
}

_PROGRAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def program(
    module: ir.Module,
    targets: Sequence[str] = ("sm_90",),
    *,
    want_nvvm: bool = False,
    ptxas: bool | None = None,
) -> GpuProgram:
    """The GpuProgram of ``module`` for ``targets`` (compiled once per module object)."""
    per_module = _PROGRAMS.setdefault(module, {})
    key = (tuple(targets), want_nvvm, ptxas)
    for (t, nvvm, px), prog in per_module.items():
        if t == key[0] and (nvvm or not want_nvvm) and px == ptxas:
            return prog
    prog = compile_module(module, targets=targets, want_nvvm=want_nvvm, ptxas=ptxas)
    per_module[key] = prog
    return prog


def kernels(module: ir.Module, target: str = "sm_90") -> str:
    return program(module, (target,), ptxas=False).kernels_ir


def nvvm(module: ir.Module, target: str = "sm_90") -> str:
    prog = program(module, (target,), want_nvvm=True, ptxas=False)
    return "\n".join(prog.nvvm.get(target, {}).values())


def ptx(module: ir.Module, target: str = "sm_90") -> str:
    return program(module, (target,), ptxas=False).ptx_text(target)


def cubin(module: ir.Module, target: str = "sm_90") -> str:
    """ptxas -v figures per kernel, one line each (the cubins themselves go to bundles)."""
    prog = program(module, (target,), ptxas=True)
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
    module: ir.Module, targets: Sequence[str] = ("sm_80", "sm_90"), report: dict | None = None
) -> bytes:
    """The AOT bundle of ``module`` as bytes (for ``-o FILE``)."""
    manifest, files = bundle.contents(
        module, targets=targets, report=report, program=program(module, targets)
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.opfuse"
        rb.write(path, manifest, files)
        return path.read_bytes()


def summary(module: ir.Module, target: str = "sm_90") -> str:
    """A JSON summary of the kernels (for reports)."""
    return json.dumps(program(module, (target,)).report(), indent=2)


__all__ = ["HELP", "bundle_bytes", "cubin", "kernels", "nvvm", "program", "ptx", "summary"]
