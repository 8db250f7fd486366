"""Compile-time scaling: fusion planning and outlining on synthetic graphs of n ops.

Two families, built with ``opfuse.builder.Graph`` on a small [8, 64] f32 tensor (the
passes' work depends on the op count, not on the shapes):

* ``chain``: a linear chain of elementwise ops (``*b``, ``tanh``, ``+b``, ``relu``) with
  ``y - mean(y, axis=-1, keepdims=True)`` every block: reductions on the chain;
* ``dag``: fan-out and fan-in (``tanh(y) + y*b``), a softmax every other block and
  ``y - mean(y)`` every third: a DAG with reductions and shared producers.

"ops" is the number of ``linalg.*`` ops in the function (``linalg.fill`` inits included),
counted on the parsed module. Planning is the three fusion passes in one pipeline run
(:data:`PLANNING_PIPELINE`), outlining is ``opfuse-outline`` run afterwards on the planned
module; parsing is not timed. Each size is measured ``repeat`` times (a fresh parse each
time) and the median kept; the exponent is the slope of a least-squares line through
(log ops, log seconds). Both are recorded as wall time (the issue's figure) and as this
process's CPU time (``time.process_time``), which a busy shared machine inflates less: a
wall figure far above its CPU figure means the run was starved, not slow.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

from opfuse import ir as oir
from opfuse.builder import Graph, Tensor
from opfuse.pipeline import Pipeline

PLANNING_PIPELINE = (
    "builtin.module(opfuse-fuse-elementwise,opfuse-fuse-producer-consumer,"
    "opfuse-fuse-reduction)"
)
OUTLINE_PIPELINE = "builtin.module(opfuse-outline)"
SIZES = (100, 1_000, 10_000)
SHAPE = (8, 64)


def _centered(g: Graph, y: Tensor) -> Tensor:
    return y - g.mean(y, axis=-1, keepdims=True)


def chain(n: int) -> Graph:
    """A chain of about ``n`` linalg ops: 4 elementwise ops + a mean-centering per block."""
    g = Graph(f"chain_{n}")
    y = g.input("x", SHAPE)
    b = g.input("b", SHAPE[-1:])
    for _ in range(max(1, n // 8)):  # 8 linalg ops per block (mean: fill + sum + scale)
        y = g.relu(g.tanh(y * b) + b)
        y = _centered(g, y)
    g.output(y)
    return g


def dag(n: int) -> Graph:
    """A DAG of about ``n`` linalg ops with fan-out, fan-in, softmaxes and means."""
    g = Graph(f"dag_{n}")
    y = g.input("x", SHAPE)
    b = g.input("b", SHAPE[-1:])
    ops, block = 0, 0
    while ops < n:
        y = g.tanh(y) + y * b  # y feeds two branches that meet again
        ops += 3
        if block % 2 == 0:
            y = g.softmax(y)  # max (+fill), sub, exp, sum (+fill), div
            ops += 7
        if block % 3 == 0:
            y = _centered(g, y)
            ops += 4
        block += 1
    g.output(y)
    return g


FAMILIES: dict[str, Callable[[int], Graph]] = {"chain": chain, "dag": dag}


def count_linalg_ops(module: Any) -> int:
    """``linalg.*`` ops directly in the body of the module's functions."""
    n = 0
    for func in module.body.operations:
        for block in func.operation.regions[0].blocks:
            n += sum(1 for op in block.operations if op.operation.name.startswith("linalg."))
    return n


def measure_one(text: str, repeat: int) -> dict[str, Any]:
    """Median planning and outlining seconds over ``repeat`` fresh parses of ``text``."""
    wall: dict[str, list[float]] = {"planning": [], "outline": []}
    cpu: dict[str, list[float]] = {"planning": [], "outline": []}
    ops = 0
    for _ in range(repeat):
        module = oir.parse_module(text, filename="scaling.mlir")
        ops = count_linalg_ops(module)
        for step, pipeline in (("planning", PLANNING_PIPELINE), ("outline", OUTLINE_PIPELINE)):
            w0, c0 = time.perf_counter(), time.process_time()
            Pipeline.parse(pipeline).run(module)
            wall[step].append(time.perf_counter() - w0)
            cpu[step].append(time.process_time() - c0)
    return {
        "ops": ops,
        "planning_s": statistics.median(wall["planning"]),
        "outline_s": statistics.median(wall["outline"]),
        "planning_cpu_s": statistics.median(cpu["planning"]),
        "outline_cpu_s": statistics.median(cpu["outline"]),
        "repeat": repeat,
    }


def fit_exponent(ops: list[int], seconds: list[float]) -> float:
    """Slope of the least-squares line through (log ops, log seconds)."""
    return float(np.polyfit(np.log(ops), np.log(seconds), 1)[0])


def run(sizes: tuple[int, ...] = SIZES, repeat_small: int = 5, repeat_large: int = 2,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``scaling`` section of the JSON (SCHEMA.md)."""
    families = {}
    for name, make in FAMILIES.items():
        points = []
        for n in sizes:
            text = make(n).to_mlir()
            repeat = repeat_small if n <= 1000 else repeat_large
            point = {"target_ops": n, **measure_one(text, repeat)}
            log(f"  scaling {name} {point['ops']} ops: planning {point['planning_s']:.3f} s, "
                f"outline {point['outline_s']:.3f} s")
            points.append(point)
        ops = [p["ops"] for p in points]
        families[name] = {
            "points": points,
            "planning_exponent": fit_exponent(ops, [p["planning_s"] for p in points]),
            "outline_exponent": fit_exponent(ops, [p["outline_s"] for p in points]),
            "planning_cpu_exponent": fit_exponent(ops, [p["planning_cpu_s"] for p in points]),
        }
    largest = max(sizes)
    return {
        "pipelines": {"planning": PLANNING_PIPELINE, "outline": OUTLINE_PIPELINE},
        "sizes": list(sizes),
        "families": families,
        # the headline figures: the worse family decides
        "largest_target_ops": largest,
        "planning_largest_s": max(f["points"][-1]["planning_s"] for f in families.values()),
        "planning_largest_cpu_s": max(
            f["points"][-1]["planning_cpu_s"] for f in families.values()
        ),
        "planning_exponent": max(f["planning_exponent"] for f in families.values()),
        "outline_exponent": max(f["outline_exponent"] for f in families.values()),
    }
