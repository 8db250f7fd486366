"""The report's kernel table: one row per kernel of a module, and the module's totals.

The rows come from the outlined ``fusion_*`` functions when the module has them, else from
the groups the planner records in the IR; the figures are the cost model's
(:mod:`opfuse.cost`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.graph import FuncGraph, functions, op_label
from ..analysis.groups import Planner
from ..cost import GuardOptions, arithmetic_intensity


@dataclass(frozen=True)
class Totals:
    """Kernels, device bytes and flops of a whole module."""

    kernels: int
    bytes: int
    flops: int


def kernel_rows(module, options: GuardOptions | None = None) -> list[dict]:
    """One row per kernel: outlined ``fusion_*`` functions if the module has them, otherwise
    the groups recorded in the IR (an op in no group is a kernel of its own).

    Each row: name, kind, members (op labels), ops, flops, bytes_read, bytes_written,
    bytes, ai, registers.
    """
    rows: list[dict] = []
    kernels = [op.operation for op in module.body.operations
               if op.operation.name == "func.func" and "opfuse.kernel" in op.operation.attributes]
    if kernels:
        for k in kernels:
            a = k.attributes
            read, written = (int(a[n].value) for n in ("opfuse.bytes_read", "opfuse.bytes_written"))
            flops = int(a["opfuse.flops"].value)
            body = [o.operation for o in k.regions[0].blocks[0].operations]
            members = [op_label(o) for o in body if o.name not in
                       ("func.return", "arith.constant", "tensor.empty", "linalg.fill")]
            rows.append(_row(k.attributes["sym_name"].value, a["opfuse.kind"].value, members,
                             flops, read, written, int(a["opfuse.registers"].value)))
        return rows
    options = options or GuardOptions()
    for func_op in functions(module):
        planner = Planner(FuncGraph(func_op), "report", options)
        for i, g in enumerate(planner.groups()):
            members = [planner.graph.nodes[m].label for m in sorted(g.members)]
            rows.append(_row(f"{func_op.attributes['sym_name'].value}#{i}", g.kind, members,
                             g.flops, sum(g.reads.values()), sum(g.outputs.values()), g.registers()))
    return rows


def _row(name: str, kind: str, members: list[str], flops: int, read: int, written: int,
         registers: int) -> dict:
    q = read + written
    return {"name": name, "kind": kind, "members": members, "ops": len(members), "flops": flops,
            "bytes_read": read, "bytes_written": written, "bytes": q,
            "ai": round(arithmetic_intensity(flops, q), 4) if q else None, "registers": registers}


def module_totals(module, options: GuardOptions | None = None) -> Totals:
    """Kernels, bytes and flops of ``module`` as it stands (see ``kernel_rows``)."""
    rows = kernel_rows(module, options)
    return Totals(len(rows), sum(r["bytes"] for r in rows), sum(r["flops"] for r in rows))
