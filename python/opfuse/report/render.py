"""Render a fusion report (see :mod:`opfuse.report.summary`) as text or JSON.

Text, one fact per line so lit tests can FileCheck it::

    kernels: 8 -> 1 (7 launches saved)
    bytes: 12.0 MiB -> 4.0 MiB (-66.7%)
    flops: 1.05 MFLOP -> 1.05 MFLOP
    kernel fusion_0_loop: kind=loop members=3 flops=1.05 MFLOP bytes=4.0 MiB ai=0.25 regs=19
    decision in.mlir:4:8: fused [fuse-elementwise] %0 -> %1: saving 0.50 > delta 0.10
"""

from __future__ import annotations

import json
from typing import Any, Callable

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


def _header(totals: dict[str, Any]) -> list[str]:
    before, after = totals["before"], totals["after"]
    saved = before["kernels"] - after["kernels"]
    launches = f"{saved} launches saved" if saved >= 0 else f"{-saved} more launches"
    return [
        f"kernels: {before['kernels']} -> {after['kernels']} ({launches})",
        f"bytes: {human_bytes(before['bytes'])} -> {human_bytes(after['bytes'])} "
        f"({_change(before['bytes'], after['bytes'])})",
        f"flops: {human_flops(before['flops'])} -> {human_flops(after['flops'])}",
    ]


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
    return f"kernel {row.get('name', '?')}: {' '.join(fields)}"


def decision_line(d: dict[str, Any]) -> str:
    """``Decision.remark()``, shorter: no ``remark:``, no ``opfuse-`` prefix on the pass."""
    verdict = "fused" if d["fused"] else "not fused"
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
    lines += [_kernel_line(row) for row in report.get("kernels", [])]
    lines += [decision_line(d) for d in report.get("decisions", [])]
    return "\n".join(lines) + "\n"


def render_json(report: dict[str, Any]) -> str:
    """The report as JSON (sorted keys, ends with a newline)."""
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {"text": render_text, "json": render_json}


def render(report: dict[str, Any], fmt: str = "text") -> str:
    """Render with one of ``FORMATS`` (``text``, ``json``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format '{fmt}' (formats: {', '.join(FORMATS)})")
    return FORMATS[fmt](report)
