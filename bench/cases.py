"""What the benchmark runs: the G graphs at their scale, and ``.mlir`` files.

A :class:`Case` carries the MLIR text opfuse compiles, how to make its inputs, and, for
the G graphs, the builder graph (whose float64 ``reference`` checks every contender) and
the peers' version of it (:mod:`bench.peers.models`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from opfuse.frontends.builder.graphs import example_inputs, graphs
from opfuse.runtime.signature import Signature
from opfuse.runtime.schedule import float32_to_bf16_bits

from .peers.models import MODELS

#: Per-graph default scale (every size divided by it, head counts kept), chosen so that the
#: default CPU run of G1–G8 with every peer stays under ~10 min on 2 cores. Full size (1)
#: where one call of the unfused program takes well under a second; G5/G6 (attention;
#: 1.8 s and 2.6 s per fused call at full size) and G7 (~70 GFLOP of matmuls: ~10 s per
#: call at full size) at 2. ``--scale`` overrides them.
DEFAULT_SCALES = {"g5_attention": 2, "g6_encoder_layer": 2, "g7_rmsnorm_swiglu": 2}

#: ``--quick``: one small graph, seconds end to end.
QUICK_GRAPH, QUICK_SCALE = "g2_elementwise_chain", 64


@dataclass
class Case:
    """One graph to benchmark."""

    name: str
    text: str
    source: str  # "builder" or the file's path
    scale: int | None
    doc: str
    graph: Any = None  # opfuse.builder.Graph for the G graphs
    model: Callable[..., Any] | None = None

    def inputs(self, signature: Signature) -> list[np.ndarray]:
        """The G graph's example inputs, else uniform [-1, 1) per the signature."""
        if self.graph is not None:
            return list(example_inputs(self.graph).values())
        return uniform_inputs(signature)

    def reference(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """The builder's float64-then-rounded reference, or None for a file."""
        return None if self.graph is None else self.graph.reference(*arrays)


def uniform_inputs(signature: Signature) -> list[np.ndarray]:
    """Seeded inputs per the signature: uniform [-1, 1) floats, integers in [-8, 8)."""
    rng = np.random.default_rng(0)
    arrays = []
    for spec in signature.inputs:
        values = rng.uniform(-1, 1, spec.shape)
        if spec.element_type == "bf16":
            arrays.append(float32_to_bf16_bits(values.astype(np.float32)))
        elif spec.dtype.kind == "i":
            arrays.append(rng.integers(-8, 8, spec.shape).astype(spec.dtype))
        else:
            arrays.append(values.astype(spec.dtype))
    return arrays


def resolve_names(selection: str | None) -> list[str]:
    """``g1,g3_softmax`` -> full G graph names (a prefix matches); None -> all eight.

    Raises:
        ValueError: a name that matches no graph or several.
    """
    names = list(MODELS)
    if not selection:
        return names
    out = []
    for part in filter(None, (p.strip() for p in selection.split(","))):
        hits = [n for n in names if n == part or n.startswith(part + "_")]
        if len(hits) != 1:
            raise ValueError(f"--graphs: {part!r} matches {hits or 'no graph'} (have {names})")
        out.append(hits[0])
    return out


def parse_scales(text: str | None) -> tuple[int | None, dict[str, int]]:
    """``--scale``: ``N`` (every graph) or ``g5=1,g7=4`` (per graph, prefixes allowed)."""
    if not text:
        return None, {}
    if "=" not in text:
        return int(text), {}
    per = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        per[resolve_names(key.strip())[0]] = int(value)
    return None, per


def builder_cases(names: Sequence[str], every: int | None, per: dict[str, int]) -> list[Case]:
    """The named G graphs at their scale (``per`` > ``every`` > :data:`DEFAULT_SCALES`)."""
    cases = []
    by_scale: dict[int, dict[str, Any]] = {}
    for name in names:
        scale = per.get(name, every if every is not None else DEFAULT_SCALES.get(name, 1))
        if scale not in by_scale:
            by_scale[scale] = graphs(scale=scale)
        g = by_scale[scale][name]
        cases.append(Case(name, g.to_mlir(), "builder", scale, g.doc or name, g, MODELS[name]))
    return cases


def file_case(path: str) -> Case:
    """A ``.mlir`` file from the command line: opfuse only (no peer version, no reference)."""
    p = Path(path)
    return Case(p.stem, p.read_text(), str(p), None, f"{p.name} (from the command line)")
