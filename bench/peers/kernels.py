"""Kernel counts of the peers' compilers, read from the code they generate.

Both counters are static: they count kernel *call sites* in the program the compiler
emitted for one call of the graph (a call site inside a loop would count once; neither
compiler emits loops of launches for these graphs).

Inductor (torch.compile): the output code's wrapper calls three kinds of kernels:
    * generated: ``cpp_fused_*(...)`` (one C++ loop nest each; Inductor's fused kernels);
    * extern: ``extern_kernels.*(...)`` (library calls: ``mm``, ``addmm``, ``bmm``, ...);
    * fallback: ``torch.ops.*(...)`` / ``aten.*(...)`` (ATen ops Inductor did not lower,
      e.g. the CPU flash-attention kernel behind scaled_dot_product_attention).
  count = generated + extern + fallback. ``torch._inductor.metrics.generated_kernel_count``
  is recorded beside it as a cross-check of the generated part.

XLA (jax.jit): the optimized HLO module (``jax.jit(f).lower(...).compile().as_text()``);
every instruction of the ENTRY computation is one step of the executable (one kernel or
library call on the CPU backend), except the bookkeeping opcodes in
:data:`XLA_FREE_OPCODES`, which generate no code. ``fusion`` instructions are XLA's fused
kernels (detail by fusion kind: kLoop, kInput, kOutput, kCustom); ``dot``/``custom-call``
are library calls; anything else (``copy``, ``transpose``, ``reduce``, ...) is a
standalone kernel. A kCustom fusion is one call into a library subgraph — on XLA's CPU
backend ``__ynn_fusion`` (YNNPACK), which may run several operators inside (jax 0.10
hands G5's whole attention to one); ``custom_fusion_kinds`` counts them by kind.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

_INDUCTOR_CALL = re.compile(
    r"^\s+(?:[\w, ]+ = )?(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.[\w.]+|aten\.[\w.]+)\("
)

#: HLO opcodes that produce no kernel: arguments, literals and pointer plumbing.
XLA_FREE_OPCODES = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})

# "%name = <type> opcode(" where <type> may be a tuple type "(f32[..], f32[..])"
_HLO_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%[\w.-]+\s*=\s*(?:\([^=]*?\)|\S+)\s+([a-z][\w-]*)\("
)
_FUSION_KIND = re.compile(r"kind=(k\w+)")
_CUSTOM_KIND = re.compile(r'"fusion_config":\{"kind":"(\w+)"')

INDUCTOR_METHOD = (
    "call sites in Inductor's output code (torch._inductor.utils.run_and_get_code): "
    "cpp_fused_* (generated) + extern_kernels.* (library) + torch.ops/aten.* (fallback)"
)
XLA_METHOD = (
    "instructions of the ENTRY computation of the optimized HLO "
    "(jax.jit(f).lower(...).compile().as_text()), minus parameter/constant/tuple/"
    "get-tuple-element/bitcast"
)


def count_inductor(codes: Iterable[str]) -> dict[str, Any]:
    """Kernel call sites in Inductor output code (one string per compiled graph).

    Returns:
        ``{"count", "generated", "extern", "fallback", "graphs", "calls": {name: n}}``.
    """
    calls: Counter[str] = Counter()
    graphs = 0
    for code in codes:
        graphs += 1
        for line in code.splitlines():
            m = _INDUCTOR_CALL.match(line)
            if m:
                calls[m.group(1)] += 1
    generated = sum(n for c, n in calls.items() if c.startswith("cpp_fused_"))
    extern = sum(n for c, n in calls.items() if c.startswith("extern_kernels."))
    fallback = sum(calls.values()) - generated - extern
    return {
        "count": generated + extern + fallback,
        "generated": generated,
        "extern": extern,
        "fallback": fallback,
        "graphs": graphs,
        "calls": dict(sorted(calls.items())),
    }


def entry_computation(hlo_text: str) -> list[str]:
    """The instruction lines of the ENTRY computation of an HLO module's text."""
    lines = hlo_text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("ENTRY ")), None)
    if start is None:
        raise ValueError("no ENTRY computation in the HLO text")
    body = []
    for line in lines[start + 1 :]:
        if line.startswith("}"):
            break
        body.append(line)
    return body


def count_xla(hlo_text: str) -> dict[str, Any]:
    """Kernels of an optimized HLO module (see the module docstring).

    Returns:
        ``{"count", "fusions", "library_calls", "other", "opcodes": {op: n},
        "fusion_kinds": {kind: n}, "custom_fusion_kinds": {kind: n}}``.
    """
    opcodes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    custom: Counter[str] = Counter()
    for line in entry_computation(hlo_text):
        m = _HLO_INSTRUCTION.match(line)
        if not m or m.group(1) in XLA_FREE_OPCODES:
            continue
        opcodes[m.group(1)] += 1
        if m.group(1) == "fusion":
            k = _FUSION_KIND.search(line)
            kinds[k.group(1) if k else "unknown"] += 1
            c = _CUSTOM_KIND.search(line)
            if c:
                custom[c.group(1)] += 1
    fusions = opcodes.get("fusion", 0)
    library = opcodes.get("dot", 0) + opcodes.get("custom-call", 0)
    total = sum(opcodes.values())
    return {
        "count": total,
        "fusions": fusions,
        "library_calls": library,
        "other": total - fusions - library,
        "opcodes": dict(sorted(opcodes.items())),
        "fusion_kinds": dict(sorted(kinds.items())),
        "custom_fusion_kinds": dict(sorted(custom.items())),
    }
