"""The fusion report: totals before and after, the fused kernels, every decision, the graph.

The report is a plain dict (JSON-ready), documented by ``report.schema.json`` next to this
file and rendered by :mod:`opfuse.report.render` (text, JSON) and :mod:`opfuse.report.html`::

    {
      "schema": "opfuse-report/1",
      "totals": {                                  # the unfused program vs the fused one
        "before": {"kernels": 8, "bytes": 12582912, "flops": 1048576},
        "after":  {"kernels": 1, "bytes": 4194304, "flops": 1048576},
        "launches_saved": 7,
        "bytes_saved": 8388608
      },
      "overview": {"functions": 1, "ops": 8, "decisions": 7, "fused": 7, "refused": 0},
      "estimate": {"target": "sm_90", "t_launch_s": 3e-06, "b_mem_bytes_per_s": 4.8e12,
                   "launches_saved": 7, "bytes_saved": 8388608, "t_saved_s": 2.2e-05},
      "ptxas": null,                               # or measured figures, see attach_measured
      "kernels": [{"name": ..., "kind": ..., "members": [...], "flops": ..., "bytes": ...,
                   "ai": ..., "registers": ..., "bytes_saved": ...,
                   "attention": {"q_fused": ..., "q_s": ..., ...}   # attention kernels
                  }, ...],
      "decisions": [Decision.to_json(), ...],      # in ledger order
      "graph": {"nodes": [...], "edges": [[from, to], ...]}   # the op graph before fusion
    }

``graph`` is what the HTML view draws: every op of the input (and every function argument)
as a node, with ``kernel_ids``, the indices into ``kernels`` of the kernels it ended up in
(matched by op label; an op duplicated into several kernels has several).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Mapping

from mlir import ir

# Bound at import, not looked up per call: target presets are data, not the cost model
# a caller may substitute (tests replace ``opfuse.report.tables`` to check which figures it
# gives).
from .. import kinds
from ..analysis.inplace import input_copies
from ..cost import get_target
from ..analysis.ledger import Ledger

SCHEMA_ID = "opfuse-report/1"
TOTAL_KEYS = ("kernels", "bytes", "flops")
DEFAULT_TARGET = "sm_90"


def build_report(
    before_module: ir.Module,
    after_module: ir.Module,
    ledger: Ledger,
    *,
    target: str = DEFAULT_TARGET,
    measured: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report of one pipeline run.

    Args:
        before_module: the input, before any pass ran (every op its own kernel).
        after_module: the module after the pipeline.
        ledger: the run's decisions.
        target: the GPU whose T_launch and B_mem price the saving (``estimate``).
        measured: ``ptxas -v`` figures per kernel name (see :func:`attach_measured`).
    """
    from . import tables  # noqa: PLC0415  (the tables import the planner)

    before = _totals(tables.module_totals(before_module))
    after = _totals(tables.module_totals(after_module))
    copies = [c.to_json() for c in input_copies(before_module)]
    if copies:
        before["copy_bytes"] = after["copy_bytes"] = sum(c["bytes"] for c in copies)
    totals = {
        "before": before,
        "after": after,
        "launches_saved": before["kernels"] - after["kernels"],
        "bytes_saved": before["bytes"] - after["bytes"],
    }
    kernels = [dict(row) for row in tables.kernel_rows(after_module)]
    _add_bytes_saved(kernels, tables.kernel_rows(before_module))
    decisions = ledger.to_json()
    _add_attention(kernels, decisions)
    graph = build_graph(before_module, kernels)
    report = {
        "schema": SCHEMA_ID,
        "totals": totals,
        **({"input_copies": copies} if copies else {}),
        "overview": {
            "functions": graph["functions"],
            "ops": sum(1 for n in graph["nodes"] if n["op"] != "argument"),
            "decisions": len(decisions),
            "fused": sum(1 for d in decisions if d["fused"]),
            "refused": sum(1 for d in decisions if not d["fused"]),
        },
        "estimate": estimate(totals, target),
        "ptxas": None,
        "kernels": kernels,
        "decisions": decisions,
        "graph": graph,
    }
    if measured:
        attach_measured(report, measured)
    return report


def estimate(totals: Mapping[str, Any], target: str = DEFAULT_TARGET) -> dict[str, Any]:
    """The seed's T_saved for the whole program, with the target figures it uses:
    ``T_saved = launches_saved * T_launch + bytes_saved / B_mem``."""
    t = get_target(target)
    launches, saved = int(totals["launches_saved"]), int(totals["bytes_saved"])
    return {
        "target": t.name,
        "t_launch_s": t.t_launch_s,
        "b_mem_bytes_per_s": t.b_mem,
        "launches_saved": launches,
        "bytes_saved": saved,
        "t_saved_s": launches * t.t_launch_s + saved / t.b_mem,
    }


def set_target(report: dict[str, Any], target: str) -> None:
    """Re-price ``report["estimate"]`` for ``target`` (a report built for another GPU)."""
    report["estimate"] = estimate(report["totals"], target)


def attach_measured(report: dict[str, Any], measured: Mapping[str, Mapping[str, Any]]) -> None:
    """Add ``ptxas -v`` figures: ``measured[kernel name]`` holds at least ``registers``
    (and optionally ``spill_stores``, ``spill_loads``, ``smem``, ``arch``). Each matching
    kernel row gets ``registers_measured`` and ``spill_bytes``; ``report["ptxas"]`` the
    totals over the measured kernels."""
    hits = []
    for row in report["kernels"]:
        m = measured.get(row.get("name", ""))
        if m is None:
            continue
        row["registers_measured"] = int(m["registers"])
        row["spill_bytes"] = int(m.get("spill_stores", 0)) + int(m.get("spill_loads", 0))
        hits.append((row, m))
    if not hits:
        return
    report["ptxas"] = {
        "arch": str(hits[0][1].get("arch", "")),
        "kernels_measured": len(hits),
        "registers_max": max(r["registers_measured"] for r, _ in hits),
        "spill_bytes": sum(r["spill_bytes"] for r, _ in hits),
        "estimate_error_max": max(
            abs(r["registers_measured"] - r["registers"])
            for r, _ in hits
            if isinstance(r.get("registers"), int)
        )
        if any(isinstance(r.get("registers"), int) for r, _ in hits)
        else None,
    }


def _totals(totals: Any) -> dict[str, int]:
    values = dataclasses.asdict(totals) if dataclasses.is_dataclass(totals) else dict(totals)
    return {key: int(values[key]) for key in TOTAL_KEYS}


def _members(row: Mapping[str, Any]) -> list[str]:
    members = row.get("members")
    return list(members) if isinstance(members, (list, tuple)) else []


def _add_bytes_saved(kernels: list[dict[str, Any]], before_rows: list[dict[str, Any]]) -> None:
    """``bytes_saved`` per kernel: what its member ops moved unfused, minus what it moves.

    An op's unfused bytes are shared equally among its copies (a producer duplicated into
    three kernels gives each a third), so the column sums to ``totals.bytes_saved`` when
    every op of the input is in some kernel.
    """
    unfused: dict[str, float] = {}
    for row in before_rows:
        members = _members(row)
        for m in members:
            unfused[m] = unfused.get(m, 0.0) + float(row.get("bytes", 0)) / len(members)
    copies = Counter(m for row in kernels for m in _members(row))
    for row in kernels:
        members = _members(row)
        if not members or "bytes" not in row:
            continue
        share = sum(unfused.get(m, 0.0) / copies[m] for m in members)
        row["bytes_saved"] = int(round(share - row["bytes"]))


ATTENTION_PASS = "opfuse-fuse-attention"


def _add_attention(kernels: list[dict[str, Any]], decisions: list[dict[str, Any]]) -> None:
    """Each attention kernel's bytes in the seed's terms: ``q_fused`` = Q_QK + Q_PV (Q, K,
    V and masks read, O written: the kernel's bytes), ``q_s`` = the S and P round trips
    the unfused kernels made (from the fusion's ledger entry), ``q_unfused`` their sum."""
    merges = [d for d in decisions if d.get("pass_name") == ATTENTION_PASS and d.get("fused")]
    for row in kernels:
        if row.get("kind") != kinds.ATTENTION:
            continue
        members = set(_members(row))
        for d in merges:
            if d.get("consumer") in members and "q_s" in d.get("numbers", {}):
                q_s = int(d["numbers"]["q_s"])
                row["attention"] = {"q_fused": int(row["bytes"]), "q_s": q_s,
                                    "q_unfused": int(row["bytes"]) + q_s,
                                    "causal_offset": d["numbers"].get("causal_offset")}
                break


# --- the op graph -----------------------------------------------------------------------


def build_graph(module: ir.Module, kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """The op graph of ``module`` (before fusion), each node tied to its kernels.

    Returns:
        ``{"functions": n, "nodes": [...], "edges": [[from id, to id], ...]}``. A node:
        ``id``, ``label``, ``op`` (``argument`` for function arguments), ``op_kind``
        (elementwise, reduction, contraction, ..., or argument), ``func``, ``type`` (of
        its first result), ``returned`` and ``kernel_ids``.
    """
    from ..analysis.graph import FuncGraph, functions  # noqa: PLC0415

    where: dict[str, list[int]] = {}
    for i, row in enumerate(kernels):
        for m in _members(row):
            ids = where.setdefault(m, [])
            if i not in ids:
                ids.append(i)
    nodes: list[dict[str, Any]] = []
    edges: list[list[str]] = []
    funcs = list(functions(module))
    for f_index, func_op in enumerate(funcs):
        fname = ir.StringAttr(func_op.attributes["sym_name"]).value
        graph = FuncGraph(func_op)
        prefix = f"f{f_index}." if len(funcs) > 1 else ""
        arg_ids: dict[ir.Value, str] = {}
        for arg in func_op.regions[0].blocks[0].arguments:
            node_id = f"{prefix}a{arg.arg_number}"
            arg_ids[arg] = node_id
            nodes.append(_node(node_id, _arg_label(arg), "argument", "argument", fname,
                               arg.type, arg in graph.returned, []))
        for node in graph.nodes:
            label = node.label
            nodes.append(_node(f"{prefix}n{node.index}", label, node.op.name, str(node.kind),
                               fname, node.results[0].type if node.results else None,
                               any(v in graph.returned for v in node.results),
                               where.get(label, [])))
            seen: set[str] = set()
            for v in node.reads:
                p = graph.producer.get(v)
                src = f"{prefix}n{p}" if p is not None else arg_ids.get(v)
                if src is not None and src not in seen:
                    seen.add(src)
                    edges.append([src, f"{prefix}n{node.index}"])
    return {"functions": len(funcs), "nodes": nodes, "edges": edges}


def _node(node_id: str, label: str, op: str, op_kind: str, func: str, type_: Any,
          returned: bool, kernel_ids: list[int]) -> dict[str, Any]:
    return {"id": node_id, "label": label, "op": op, "op_kind": op_kind, "func": func,
            "type": str(type_) if type_ is not None else "", "returned": returned,
            "kernel_ids": kernel_ids}


def _arg_label(arg: ir.BlockArgument) -> str:
    """The argument's NameLoc (``x``, ``w1``) when it has one, else ``%argN``."""
    try:
        loc = arg.location
        if loc.is_a_name():
            return loc.name_str
    except Exception:  # older bindings: no BlockArgument.location
        pass
    return f"%arg{arg.arg_number}"
