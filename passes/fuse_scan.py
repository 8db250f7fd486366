"""opfuse-fuse-scan: a scan (``cumsum``) absorbs the elementwise groups around it.

A scan kernel (``backends/gpu/emit/scan.py``) gives each row along the scanned axis to a team of
threads that reads every input element once and writes every running sum once, so:

* a loop group that computes the scan's input over the scan's domain (RoBERTa's position
  ids: ``(ids != pad).int()``) is evaluated in the scan's loads;
* a loop group over the same domain that reads the sums (``* mask + padding_idx``, the
  cast back to int64) is applied to them in registers before the store.

A group over another domain stays apart (it would need elements other than a thread's
own), and so does any group with a root of its own (a reduction, a matmul, a
convolution, another scan). Every merge asks the cost guard. Runs after
opfuse-fuse-reduction (a scan is not a reduction: that pass leaves it alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind

from .common import FusionOptions, candidate_pairs, plan_each_function, shape_str

NAME = "opfuse-fuse-scan"


@dataclass(frozen=True)
class Options(FusionOptions):
    """Only the guard's thresholds."""


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_each_function(module, NAME, options, _plan)


def _has_scan(g: Group) -> bool:
    return OpKind.SCAN in g.kinds


def _why_not(p: Group, c: Group) -> str | None:
    """None when ``p`` may join ``c`` (one of them holds the scan); otherwise why not."""
    scan, other = (p, c) if _has_scan(p) else (c, p)
    if _has_scan(other):
        return "two scans: one scan per kernel"
    if not other.is_loop:
        return f"a '{other.kind}' group is not fused with a scan"
    if other.domain != scan.domain:
        side = "producer" if other is p else "consumer"
        return (f"{side} iterates over {shape_str(other.domain)}, the scan over "
                f"{shape_str(scan.domain)}")
    return None


def _plan(planner: Planner) -> None:
    for p, c in candidate_pairs(planner, lambda p, c: _has_scan(p) or _has_scan(c)):
        why_not = _why_not(p, c)
        if why_not is not None:
            planner.refuse(p, c, why_not)
            continue
        planner.try_merge(p, c, why="into scan" if _has_scan(c) else "after scan")
