"""Compile time per stage: parse (import), fusion, codegen, JIT, ptxas.

The stages are the ones ``opfuse.compile`` + the CPU backend run, called one by one:

* ``parse_s``: MLIR text -> verified module (``opfuse.ir.parse_module``, a fresh context);
* ``fusion_s``: the pipeline (``Pipeline.default()``, or ``opfuse-outline`` alone for the
  unfused baseline), which verifies after every step;
* ``codegen_s``: ``opfuse.backends.cpu.lower.lower_to_llvm`` (fused module -> LLVM dialect);
* ``jit_s``: ``CpuProgram`` (ExecutionEngine creation at -O3 + symbol lookup: LLVM
  compiles the whole module here);
* ``ptxas``: not measured on the CPU backend (see :func:`ptxas_figure`).

Cold and warm: opfuse has no kernel cache yet, so "cold" is the first compile of this
graph in this process (after a process warm-up on a tiny graph, reported separately as
``process_init_s``, so that loading MLIR/LLVM is not charged to the first graph), and
"warm" is the second compile of the same graph in the same process: it only benefits from
in-process effects (allocator, Python and LLVM internal caches), not from a cache of
compiled kernels.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from typing import Any

from opfuse import ir as oir
from opfuse.api import UNFUSED_PIPELINE
from opfuse.backends.cpu.lower import lower_to_llvm
from opfuse.pipeline import Pipeline
from opfuse.runtime.cpu import CpuProgram
from opfuse.ir import find_entry
from opfuse.runtime.signature import signature_of

from .peers import not_available

STAGES = ("parse_s", "fusion_s", "codegen_s", "jit_s")

MEANING = (
    "cold = first compile of the graph in this process (after a process warm-up on a tiny "
    "graph, see process_init_s); warm = second compile of the same graph in the same "
    "process. opfuse has no kernel cache yet, so warm only reflects in-process effects, "
    "not cached kernels."
)

# The GPU backend's lowering modules (docs/architecture.md: emitters -> NVVM -> PTX).
_PTX_MODULES = ("opfuse.backends.gpu.lower.nvptx", "opfuse.backends.gpu.lower.ptxas")


def ptxas_figure() -> dict[str, str]:
    """Why the ptxas stage has no figure in this (CPU backend) run."""
    found = [m for m in _PTX_MODULES if _has_module(m)]
    if not found:
        return not_available("no GPU codegen yet (opfuse.backends.gpu has no PTX path)")
    where = shutil.which("ptxas")
    return not_available(
        "CPU backend run: ptxas is not on the CPU compile path (GPU codegen modules "
        f"present: {', '.join(found)}; ptxas {'at ' + where if where else 'not on PATH'}); "
        "the bench times it once opfuse.compile drives the PTX path (not yet)"
    )


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def stage_times(text: str, filename: str, *, fusion: bool) -> dict[str, Any]:
    """Run every stage once on ``text`` and time each one (module docstring)."""
    t = [time.perf_counter()]
    module = oir.parse_module(text, filename=filename)
    t.append(time.perf_counter())
    pipeline = Pipeline.default() if fusion else Pipeline.parse(UNFUSED_PIPELINE)
    pipeline.run(module)
    t.append(time.perf_counter())
    signature = signature_of(find_entry(module))
    llvm = lower_to_llvm(module)
    t.append(time.perf_counter())
    CpuProgram(llvm, signature)
    t.append(time.perf_counter())
    figures: dict[str, Any] = {s: t[i + 1] - t[i] for i, s in enumerate(STAGES)}
    figures["ptxas"] = ptxas_figure()
    figures["total_s"] = t[-1] - t[0]
    return figures


def cold_and_warm(text: str, filename: str) -> dict[str, Any]:
    """``{"fused": {"cold", "warm"}, "unfused": {"cold", "warm"}}`` (cold ones first)."""
    out: dict[str, Any] = {"fused": {}, "unfused": {}}
    for phase in ("cold", "warm"):
        for mode in ("fused", "unfused"):
            out[mode][phase] = stage_times(text, filename, fusion=mode == "fused")
    return out


def process_init(text: str) -> float:
    """Seconds to push a tiny graph through every stage once (loads MLIR and LLVM)."""
    t0 = time.perf_counter()
    stage_times(text, "warmup.mlir", fusion=True)
    return time.perf_counter() - t0
