"""fuse-run's summary of a run: the comparison table as text and every figure as JSON."""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from typing import Any

from opfuse.report import render as render_mod
from opfuse.runtime.signature import Signature

from .compare import Comparison
from opfuse.driver.executable import Executable
from .programs import Program


@dataclass
class Result:
    """Everything fuse-run measured, for the table and for --json."""

    args: argparse.Namespace
    filename: str
    signature: Signature
    inputs_from: str
    unfused: Program
    fused: Program
    checks: list[Comparison]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def summary_lines(result: Result) -> list[str]:
    """The human-readable summary: a header line, the comparison table, the checks."""
    u, f = result.unfused, result.fused
    lines = [
        f"fuse-run: {result.filename} @{result.signature.name} on {_where(f.exe)}",
        f"inputs: {result.inputs_from}",
        "",
    ]
    rows = [
        ["", "unfused", "fused", "change"],
        ["kernels", str(u.totals["kernels"]), str(f.totals["kernels"]),
         _delta(f.totals["kernels"] - u.totals["kernels"])],
        ["device bytes", _bytes(u.totals["bytes"]), _bytes(f.totals["bytes"]),
         _percent(u.totals["bytes"], f.totals["bytes"])],
        ["flops", render_mod.human_flops(u.totals["flops"]),
         render_mod.human_flops(f.totals["flops"]),
         _percent(u.totals["flops"], f.totals["flops"])],
    ]
    if f.totals.get("copy_bytes") and f.exe.backend == "cpu":
        # arguments the program writes after reading them: copied, the caller's are read-only
        rows.append(["input copies", _bytes(u.totals.get("copy_bytes", 0)),
                     _bytes(f.totals["copy_bytes"]), ""])
    rows += [
        ["compile + JIT", _seconds(u.compile_s), _seconds(f.compile_s), ""],
    ]
    if result.args.repeat:
        for name, stat in (("median", statistics.median), ("min", min)):
            tu, tf = stat(u.times), stat(f.times)
            rows.append([f"time {name}", _seconds(tu), _seconds(tf), _speedup(tu, tf)])
    lines += _table(rows)
    if result.args.repeat:
        warmup = result.args.warmup
        extra = f" and {warmup} warm-up call{'s' if warmup != 1 else ''}" if warmup else ""
        repeat = result.args.repeat
        calls = f"{repeat} call{'s' if repeat != 1 else ''}"
        lines.append(f"timing: {calls} of each, fused and unfused interleaved, "
                     f"after the checked run{extra}")
    else:
        lines.append("timing: skipped (--repeat 0)")
    lines.append("")
    rows = [["output", "type", "max abs", "max rel", "rtol", "atol", "check"]]
    for i, (c, spec) in enumerate(zip(result.checks, result.signature.outputs)):
        check = "ok" if c.ok else f"MISMATCH ({c.mismatches} of {c.elements})"
        rows.append([f"#{i}", str(spec), _num(c.max_abs), _num(c.max_rel), f"{c.rtol:g}",
                     f"{c.atol:g}", check])
    return lines + _table(rows)


def summary_json(result: Result) -> dict[str, Any]:
    """Every figure of the run, machine-readable (times in seconds, bytes exact)."""
    args, u, f = result.args, result.unfused, result.fused

    def program(p: Program) -> dict[str, Any]:
        out: dict[str, Any] = {**p.totals, "compile_s": p.compile_s, "times_s": p.times}
        if p.times:
            out.update(median_s=statistics.median(p.times), min_s=min(p.times))
        return out

    doc: dict[str, Any] = {
        "file": result.filename,
        "entry": result.signature.name,
        "signature": str(result.signature),
        "backend": f.exe.backend,
        "threads": f.exe.threads if f.exe.backend == "cpu" else None,
        "threaded_kernels": list(f.exe.threaded_kernels) if f.exe.backend == "cpu" else None,
        "target": args.target,
        "pipeline": f.exe.report.get("pipeline"),
        "inputs": {"from": "files" if args.inputs is not None else "random",
                   "seed": None if args.inputs is not None else args.seed,
                   "description": result.inputs_from},
        "repeat": args.repeat,
        "warmup": args.warmup,
        "unfused": program(u),
        "fused": program(f),
        "outputs": [
            {"index": i, "type": str(spec), "max_abs": c.max_abs, "max_rel": c.max_rel,
             "rtol": c.rtol, "atol": c.atol, "mismatches": c.mismatches,
             "elements": c.elements, "ok": c.ok,
             "worst": None if c.worst is None else
             {"index": list(c.worst[0]), "fused": c.worst[1], "unfused": c.worst[2]}}
            for i, (c, spec) in enumerate(zip(result.checks, result.signature.outputs))
        ],
        "ok": result.ok,
    }
    if f.times:
        doc["speedup"] = {"median": statistics.median(u.times) / statistics.median(f.times),
                          "min": min(u.times) / min(f.times)}
    if args.report == "json":
        doc["report"] = f.exe.report
    elif args.report:
        doc["report_dir"] = str(args.report)
    return doc


def _json_safe(value: Any) -> Any:
    """Non-finite floats as strings ("nan", "inf"), so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _where(exe: Executable) -> str:
    """``cpu, 2 threads`` (the CPU backend's thread count), or the backend's name."""
    if exe.backend != "cpu":
        return exe.backend
    label = f"cpu, {exe.threads} thread{'s' if exe.threads != 1 else ''}"
    if exe.threads > 1:
        threaded, kernels = exe.threaded_kernels
        if threaded < kernels:
            label += (f" ({threaded} of {kernels} kernels threaded; the others are under "
                      "OPFUSE_CPU_PARALLEL_MIN_US)")
    return label


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _delta(n: int) -> str:
    return f"{n:+d}" if n else "0"


def _bytes(n: int) -> str:
    return f"{render_mod.human_bytes(n)} ({n} B)" if n >= 1024 else f"{n} B"


def _percent(before: float, after: float) -> str:
    if before == after:
        return "0%"
    return f"{(after - before) / before * 100:+.1f}%" if before else "n/a"


def _seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.1f} ms"
    return f"{t * 1e6:.1f} us"


def _speedup(unfused: float, fused: float) -> str:
    if fused <= 0:
        return "n/a"
    ratio = unfused / fused
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{ratio:.2f}x (slower)"


def _num(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"
