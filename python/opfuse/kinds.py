"""The group kinds: the one list of the kernels a fusion group can become.

A group's kind says what its kernel is built around: a ``loop`` kernel is elementwise, an
``input`` kernel is a reduction root with its producers, an ``output`` kernel a matmul with
its epilogue, and so on. Everything that depends on the kind reads it from here: the
planner (how a kind is derived from the op classes in the group, which op carries the
``opfuse.kind`` attribute), the cost model (which register model prices it), the GPU
backend (its emitters, in order of preference), the report (the legend, the colours, the
JSON schema's enum). docs/adding-a-kernel-kind.md walks through adding one.

This module is data only: it sits at the bottom of the layers and imports nothing of
opfuse. Op classes are named by their ``OpKind`` value (``"contraction"``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One group kind.

    Attributes:
        name: the kind as written in ``opfuse.kind`` and in kernel names
            (``fusion_<N>_<name>``).
        label: what the kernel is, for the report's legend.
        fill, stroke: the report's colours (light fill, dark stroke).
        root: the op class (``OpKind`` value) of the op that carries the group's
            ``opfuse.kind``; None: the group's last op.
        derived_from: the op class whose presence makes a group this kind, for the kinds
            the planner derives from the ops (checked in ``DERIVATION`` order); None for the
            default kind and for kinds only a pass can give (``forced``).
        forced: only the pass that formed the group can tell (kept in ``opfuse.kind``).
        registers: the register model of :func:`opfuse.cost.estimate_registers`
            (``loop``, ``row``, ``matmul``, ``conv``; ``attention``: the tile's).
        emitters: the GPU emitters that may build it, most preferred first (each may
            decline; ``fallback`` is the one-thread-per-element last resort).
    """

    name: str
    label: str
    fill: str
    stroke: str
    root: str | None = None
    derived_from: str | None = None
    forced: bool = False
    registers: str = "loop"
    emitters: tuple[str, ...] = ("fallback",)


#: Every kind, in the report's order.
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("loop", "elementwise / injective", "#dbeafe", "#1d4ed8",
         emitters=("loop", "fallback")),
    # "loop" takes the input groups that are elementwise ops and the column sums they
    # feed (opfuse-fuse-column-sums), added atomically; it refuses any other reduction
    Kind("input", "reduction root", "#dcfce7", "#15803d", root="reduction",
         derived_from="reduction", registers="row", emitters=("rows", "loop", "fallback")),
    Kind("output", "matmul root + epilogue", "#ffedd5", "#c2410c", root="contraction",
         derived_from="contraction", registers="matmul",
         emitters=("wgmma", "mma", "matmul", "fallback")),
    Kind("attention", "Q·Kᵀ → softmax → P·V, S on chip", "#fae8ff", "#a21caf",
         root="contraction", forced=True, registers="attention",
         emitters=("attention_mma", "attention", "fallback")),
    Kind("conv", "convolution root + epilogue", "#fce7f3", "#be185d", root="convolution",
         derived_from="convolution", registers="conv", emitters=("conv", "fallback")),
    Kind("scan", "running sum (cumsum)", "#fef9c3", "#a16207", root="scan",
         derived_from="scan", registers="row", emitters=("scan", "fallback")),
    # a one-hot reduction (analysis/scatter.py) visits each element once and adds it into
    # the row its index picks: atomics on the GPU, in order on the CPU; one that joined a
    # loop kernel (opfuse-fuse-column-sums) is added by the loop emitter
    Kind("scatter", "scatter-add: rows picked by an index", "#ffe4e6", "#be123c",
         root="scatter", derived_from="scatter", registers="loop",
         emitters=("scatter", "loop", "fallback")),
    Kind("columns", "column reduction + consumers", "#ccfbf1", "#0f766e", root="reduction",
         forced=True, registers="row", emitters=("columns", "fallback")),
    # siblings over one LHS (opfuse-fuse-horizontal) or independent matmuls that read one
    # tensor in different roles (opfuse-fuse-grouped): blocks split between the problems
    Kind("horizontal", "sibling matmuls in one launch", "#fef3c7", "#b45309",
         root="contraction", forced=True, registers="matmul",
         emitters=("horizontal_wgmma", "horizontal_mma", "horizontal", "fallback")),
    Kind("opaque", "not fusible", "#e5e7eb", "#4b5563", derived_from="opaque"),
)}

#: The kind of a group no other kind claims.
DEFAULT = "loop"

#: The kind of an op nothing fuses with, and of a kernel with no recorded kind.
OPAQUE = "opaque"

#: The kind whose kernels carry the attention figures in the report.
ATTENTION = "attention"

#: Derived kinds, strongest first: a group with an opaque op is ``opaque`` whatever else it
#: holds, then a scan makes it ``scan``, a convolution ``conv``, a contraction ``output``,
#: a reduction ``input``, a scatter-add ``scatter`` (a row kernel a scatter-add joined
#: stays a row kernel: opfuse-fuse-column-sums).
DERIVATION: tuple[str, ...] = ("opaque", "scan", "conv", "output", "input", "scatter")

#: The kinds only a pass can give.
FORCED: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.forced)


def derive(op_classes) -> str:
    """The kind of a group holding ops of ``op_classes`` (``OpKind`` values), with no kind
    forced on it by a pass."""
    for name in DERIVATION:
        if KINDS[name].derived_from in op_classes:
            return name
    return DEFAULT


def get(name: str) -> Kind:
    """The kind called ``name``; KeyError names the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown group kind {name!r} (known: {', '.join(KINDS)})") from None


__all__ = ["ATTENTION", "DEFAULT", "OPAQUE", "DERIVATION", "FORCED", "KINDS", "Kind", "derive", "get"]
