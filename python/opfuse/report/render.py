"""Render a fusion report (see :mod:`opfuse.report.summary`) as text, JSON or HTML.

Text, one fact per line so lit tests can FileCheck it (lines whose figures the report
lacks are left out)::

    kernels: 8 -> 1 (7 launches saved)
    bytes: 12.0 MiB -> 4.0 MiB (-66.7%)
    flops: 1.05 MFLOP -> 1.05 MFLOP
    ops: 8 in 1 function; decisions: 7 (7 fused, 0 refused)
    t_saved: 22.8 us = 7 launches x T_launch 3 us + 8.0 MiB / B_mem 4.8 TB/s (sm_90)
    kernel fusion_0_loop: kind=loop members=3 flops=1.05 MFLOP bytes=4.0 MiB ai=0.25 regs=19 ...
    decision in.mlir:4:8: fused #1 [fuse-elementwise] %0 -> %1: saving 0.50 > delta 0.10
    decision in.mlir:5:8: not fused [fuse-elementwise] %1 -> %2: R_fused 140 >= R_limit 128 ...

HTML (:mod:`opfuse.report.html`): one self-contained page, the graph before and after
fusion and the savings as charts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from ..errors import OpfuseError

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_FLOP_UNITS = ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP")


def human_bytes(n: float) -> str:
    """``512 B``, ``4.0 KiB``, ``12.0 MiB`` (binary units)."""
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {_BYTE_UNITS[unit]}"


def human_flops(n: float) -> str:
    """``900 FLOP``, ``1.05 MFLOP`` (decimal units, three significant digits)."""
    value, unit = float(n), 0
    while abs(value) >= 1000 and unit < len(_FLOP_UNITS) - 1:
        value, unit = value / 1000, unit + 1
    return f"{int(value)} FLOP" if unit == 0 else f"{value:.3g} {_FLOP_UNITS[unit]}"


def _change(before: float, after: float) -> str:
    if before == 0:
        return "n/a" if after else "0.0%"
    return f"{(after - before) / before * 100:+.1f}%"


def human_seconds(t: float) -> str:
    """``850 ns``, ``22.8 us``, ``1.5 ms``, ``2.0 s``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(t) >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def human_rate(bytes_per_s: float) -> str:
    """``4.8 TB/s`` (decimal units, as datasheets give bandwidth)."""
    value, unit = float(bytes_per_s), 0
    units = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s")
    while abs(value) >= 1000 and unit < len(units) - 1:
        value, unit = value / 1000, unit + 1
    return f"{value:.3g} {units[unit]}"


def _header(totals: dict[str, Any]) -> list[str]:
    before, after = totals["before"], totals["after"]
    saved = before["kernels"] - after["kernels"]
    launches = f"{saved} launches saved" if saved >= 0 else f"{-saved} more launches"
    return [
        f"kernels: {before['kernels']} -> {after['kernels']} ({launches})",
        f"bytes: {human_bytes(before['bytes'])} -> {human_bytes(after['bytes'])} "
        f"({_change(before['bytes'], after['bytes'])})",
        f"flops: {human_flops(before['flops'])} -> {human_flops(after['flops'])}",
    ] + _copies_line(after)


def _copies_line(after: dict[str, Any]) -> list[str]:
    """Input copies, when the program makes any (the caller's arrays are read-only)."""
    if not after.get("copy_bytes"):
        return []
    return [f"input copies: {human_bytes(after['copy_bytes'])} on the cpu backend "
            "(arguments written after being read; GPU kernels write fresh buffers)"]


def overview_line(o: dict[str, Any]) -> str:
    funcs = f"{o['functions']} function{'s' if o['functions'] != 1 else ''}"
    return (f"ops: {o['ops']} in {funcs}; decisions: {o['decisions']} "
            f"({o['fused']} fused, {o['refused']} refused)")


def estimate_line(e: dict[str, Any]) -> str:
    """``t_saved: ... = N launches x T_launch ... + B / B_mem ... (target)``."""
    return (f"t_saved: {human_seconds(e['t_saved_s'])} = {e['launches_saved']} launches x "
            f"T_launch {human_seconds(e['t_launch_s'])} + {human_bytes(e['bytes_saved'])} / "
            f"B_mem {human_rate(e['b_mem_bytes_per_s'])} ({e['target']})")


def ptxas_line(p: dict[str, Any]) -> str:
    return (f"ptxas: {p['kernels_measured']} kernels measured ({p.get('arch') or '?'}), "
            f"max {p['registers_max']} registers, {human_bytes(p['spill_bytes'])} spilled")


def _kernel_line(row: dict[str, Any]) -> str:
    members = row.get("members")
    if isinstance(members, (list, tuple)):
        members = len(members)
    fields = [f"kind={row.get('kind', '?')}", f"members={members}"]
    if "flops" in row:
        fields.append(f"flops={human_flops(row['flops'])}")
    if "bytes" in row:
        fields.append(f"bytes={human_bytes(row['bytes'])}")
    if row.get("ai") is not None:
        fields.append(f"ai={row['ai']:.3g}")
    if row.get("regs") is not None:
        fields.append(f"regs={row['regs']}")
    if row.get("registers") is not None:
        fields.append(f"regs={row['registers']}")
    if row.get("registers_measured") is not None:
        fields.append(f"regs_ptxas={row['registers_measured']}")
    if row.get("bytes_saved") is not None:
        fields.append(f"saved={human_bytes(row['bytes_saved'])}")
    return f"kernel {row.get('name', '?')}: {' '.join(fields)}"


def attention_line(a: dict[str, Any]) -> str:
    """An attention kernel's bytes in the seed's terms (Q_unfused = Q_QK + Q_S + Q_PV)."""
    causal = a.get("causal_offset")
    skip = ", causal: key tiles above the diagonal skipped" if causal is not None else ""
    return (f"  attention: Q_fused = Q_QK + Q_PV = {human_bytes(a['q_fused'])} (Q, K, V, masks "
            f"read, O written); Q_S = {human_bytes(a['q_s'])} saved (S and P stay on chip; "
            f"Q_unfused {human_bytes(a['q_unfused'])}){skip}")


def decision_line(d: dict[str, Any]) -> str:
    """``Decision.remark()``, shorter: no ``remark:``, no ``opfuse-`` prefix on the pass."""
    verdict = "fused" if d["fused"] else "not fused"
    if d["fused"] and d.get("step"):
        verdict += f" #{d['step']}"
    pass_name = d["pass_name"].removeprefix("opfuse-")
    action = " (duplicate)" if d.get("action") == "duplicate" else ""
    text = (
        f"decision {d['location']}: {verdict}{action} [{pass_name}] "
        f"{d['producer']} -> {d['consumer']}: {d['reason']}"
    )
    if d.get("would_fuse_with"):
        text += f" (would fuse with {d['would_fuse_with']})"
    return text


def render_text(report: dict[str, Any]) -> str:
    """The report as lines of text (ends with a newline)."""
    lines = _header(report["totals"])
    if report.get("overview"):
        lines.append(overview_line(report["overview"]))
    if report.get("estimate"):
        lines.append(estimate_line(report["estimate"]))
    if report.get("ptxas"):
        lines.append(ptxas_line(report["ptxas"]))
    for row in report.get("kernels", []):
        lines.append(_kernel_line(row))
        if row.get("attention"):
            lines.append(attention_line(row["attention"]))
    lines += [decision_line(d) for d in report.get("decisions", [])]
    return "\n".join(lines) + "\n"


def render_json(report: dict[str, Any]) -> str:
    """The report as JSON (sorted keys, ends with a newline)."""
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def render_html(report: dict[str, Any] | list[dict[str, Any]]) -> str:
    """The report (or several, one section each) as one self-contained HTML page."""
    from . import html  # noqa: PLC0415  (graph drawing: only loaded when asked for)

    return html.render_html(report)


FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {
    "text": render_text,
    "json": render_json,
    "html": render_html,
}


def render(report: dict[str, Any], fmt: str = "text") -> str:
    """Render with one of ``FORMATS`` (``text``, ``json``, ``html``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format '{fmt}' (formats: {', '.join(FORMATS)})")
    return FORMATS[fmt](report)


#: The files of a report folder (``fuse-run --report DIR``, ``CompiledModule.write_report``).
REPORT_FILES = {"report.html": "html", "report.json": "json", "report.txt": "text"}


def write_report_dir(folder: str | os.PathLike, report: dict[str, Any]) -> Path:
    """``report.html``, ``report.json`` and ``report.txt`` in ``folder`` (created);
    returns the HTML file's path."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, fmt in REPORT_FILES.items():
            (folder / name).write_text(render(report, fmt), encoding="utf-8")
    except OSError as e:
        raise OpfuseError(f"cannot write the report under {folder}: {e.strerror or e}") from None
    return folder / "report.html"
