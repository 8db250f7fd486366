"""The fusion report: totals before and after, the fused kernels, and every decision.

The report is a plain dict (JSON-ready), rendered by :mod:`opfuse.report.render`::

    {
      "totals": {
        "before": {"kernels": 8, "bytes": 12582912, "flops": 1048576},
        "after":  {"kernels": 1, "bytes": 4194304, "flops": 1048576},
        "launches_saved": 7,
        "bytes_saved": 8388608
      },
      "kernels": [{"name": ..., "kind": ..., "members": ..., "flops": ..., "bytes": ...,
                   "ai": ..., "regs": ...}, ...],           # cost.kernel_rows(after)
      "decisions": [Decision.to_json(), ...]                # in ledger order
    }
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir

from .ledger import Ledger

TOTAL_KEYS = ("kernels", "bytes", "flops")


def build_report(
    before_module: ir.Module, after_module: ir.Module, ledger: Ledger
) -> dict[str, Any]:
    """The report of one pipeline run.

    Args:
        before_module: the input, before any pass ran (every op its own kernel).
        after_module: the module after the pipeline.
        ledger: the run's decisions.
    """
    from .. import cost  # noqa: PLC0415  (the cost model imports the analysis stack)

    before = _totals(cost.module_totals(before_module))
    after = _totals(cost.module_totals(after_module))
    return {
        "totals": {
            "before": before,
            "after": after,
            "launches_saved": before["kernels"] - after["kernels"],
            "bytes_saved": before["bytes"] - after["bytes"],
        },
        "kernels": [dict(row) for row in cost.kernel_rows(after_module)],
        "decisions": ledger.to_json(),
    }


def _totals(totals: Any) -> dict[str, int]:
    values = dataclasses.asdict(totals) if dataclasses.is_dataclass(totals) else dict(totals)
    return {key: int(values[key]) for key in TOTAL_KEYS}
