"""Build AOT bundles (see :mod:`opfuse.runtime.bundle` for the format and the reader)."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from mlir import ir

from ...version import __version__
from ...errors import OpfuseError
from ...runtime import bundle as rb
from ...runtime.cache import KernelCache
from ..cpu import library as cpu_library
from .lower import nvptx
from .compiler import GpuProgram, compile_module, outlined


def contents(
    module: ir.Module,
    *,
    targets: Sequence[str] = ("sm_80", "sm_90"),
    entry: str | None = None,
    ptxas: bool | None = None,
    cpu: bool | None = None,
    cache: KernelCache | None = None,
    program: GpuProgram | None = None,
    report: dict | None = None,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and files of the bundle of fused ``module``.

    Args:
        targets: chips to include PTX (and cubins, with ptxas) for.
        ptxas: as for :func:`~opfuse.backends.gpu.compiler.compile_module`.
        cpu: include the native CPU library: True (error without the LLVM tools and a C
            compiler), None (when they are there; the manifest says why not), False.
        program: an already compiled GpuProgram of ``module`` (skips recompiling).
        report: the fusion report, stored as is.
    """
    module = outlined(module)
    prog = program or compile_module(module, targets=targets, entry=entry, ptxas=ptxas, cache=cache)
    files: dict[str, bytes] = {}
    kernels = {}
    for name, spec in prog.kernels.items():
        k = spec.to_json()
        k["ptx_files"], k["cubin_files"] = {}, {}
        for chip, text in spec.ptx.items():
            f = f"kernels/{name}.{chip}.ptx"
            files[f] = text.encode()
            k["ptx_files"][chip] = f
        for chip, data in spec.cubin.items():
            f = f"kernels/{name}.{chip}.cubin"
            files[f] = data
            k["cubin_files"][chip] = f
        kernels[name] = k
    consts = {}
    for bid, data in prog.schedule.consts.items():
        f = f"consts/{bid}.npy"
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(data), allow_pickle=False)
        files[f] = buf.getvalue()
        consts[str(bid)] = f
    sched = prog.schedule
    manifest: dict[str, Any] = {
        "entry": sched.entry,
        "signature": {
            "inputs": [
                [list(sched.buffers[b].shape), sched.buffers[b].element_type] for b in sched.inputs
            ],
            "outputs": [
                [list(sched.buffers[b].shape), sched.buffers[b].element_type] for b in sched.outputs
            ],
        },
        "schedule": sched.to_json(),
        "consts": consts,
        "kernels": kernels,
        "targets": list(prog.targets),
        "notes": prog.notes,
        "created_by": {
            "opfuse": __version__,
            "toolchain": nvptx.toolchain_version(),
            "ptxas": _ptxas_version(prog.ptxas),
        },
    }
    if cpu is not False:
        calls = sorted({c.func for c in sched.calls()})
        try:
            with tempfile.TemporaryDirectory(prefix="opfuse-bundle-cpu-") as tmp:
                lib = Path(tmp) / "program.so"
                cpu_library.build(module, calls, lib)
                files["cpu/program.so"] = lib.read_bytes()
        except OpfuseError as e:
            if cpu:
                raise
            manifest["cpu_missing"] = str(e)
            return _finish(manifest, files, report)
        manifest["cpu"] = {
            "library": "cpu/program.so",
            "platform": rb.host_platform(),
            "symbols": {c: cpu_library.symbol(c) for c in calls},
        }
    return _finish(manifest, files, report)


def _finish(manifest: dict, files: dict, report: dict | None) -> tuple[dict, dict]:
    if report is not None:
        manifest["report"] = report
    return manifest, files


def write(path: str | os.PathLike, module: ir.Module, **options: Any) -> Path:
    """Build the bundle of fused ``module`` and write it to ``path``."""
    manifest, files = contents(module, **options)
    rb.write(path, manifest, files)
    return Path(path)


def _ptxas_version(exe: str | None) -> str | None:
    if exe is None:
        return None
    from .lower.ptxas import version

    try:
        return version(exe)
    except OpfuseError:
        return None
