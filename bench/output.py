"""Writing a run: the JSON document, a markdown table and PNG charts, side by side.

File names are fixed (``bench.json``, ``bench.md``, ``times.png``, ``kernels.png``,
``compile.png``, ``scaling.png``) so the latest run replaces the previous one. Charts
need matplotlib (the ``bench`` extra); without it ``files.charts`` says so.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .peers import PEERS, not_available

JSON_NAME, MD_NAME = "bench.json", "bench.md"
PEER_LABELS = {"numpy": "numpy", "torch_eager": "torch eager",
               "torch_compile": "torch.compile", "jax_jit": "jax.jit",
               "iree_st": "IREE 1 thread", "iree_mt": "IREE threads"}


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temp file + ``os.replace``: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for everyone
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_table(out: Path, stem: str, doc: dict[str, Any], table: str) -> None:
    """``<stem>.json`` (``doc``) and ``<stem>.md`` (``table``) in ``out``: what the zoo,
    decode and training benchmarks write."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{stem}.json", (json.dumps(doc, indent=1) + "\n").encode())
    write_atomic(out / f"{stem}.md", table.encode())


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_all(doc: dict[str, Any], out: Path) -> None:
    """Charts, then the markdown table, then the JSON (which lists the other files)."""
    out.mkdir(parents=True, exist_ok=True)
    doc["files"] = {"json": JSON_NAME, "markdown": MD_NAME, "charts": charts(doc, out)}
    write_atomic(out / MD_NAME, markdown(doc).encode())
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    write_atomic(out / JSON_NAME, text.encode())


# --- markdown -------------------------------------------------------------------------


def _na(v: Any) -> bool:
    return isinstance(v, dict) and "not_available" in v


def _ms(fig: Any) -> str:
    return "n/a" if _na(fig) else f"{fig['median_s'] * 1e3:.2f}"


def _fused_over(peer: Any) -> str:
    """fused / peer time (median of the per-round ratios): < 1 means opfuse is faster."""
    return "n/a" if _na(peer) else f"{1 / peer['ratio_to_fused']['median']:.2f}"


def _num(v: Any, fmt: str = "{}") -> str:
    return "n/a" if _na(v) else fmt.format(v)


def markdown(doc: dict[str, Any]) -> str:
    """The run as markdown: header, run-time table, compile-time table, scaling table."""
    return "\n".join(
        _header(doc) + _run_table(doc) + _compile_table(doc) + _scaling(doc) + _gpu(doc)
    ) + "\n"


def _gpu(doc: dict[str, Any]) -> list[str]:
    from . import gpu_estimate

    section = doc.get("gpu_estimate")
    if section is None:
        return []
    if _na(section):
        return ["## GPU matmul and attention kernels (estimates)", "", f"n/a: {section['not_available']}", ""]
    return ["## GPU matmul and attention kernels (estimates)", ""] + gpu_estimate.markdown(section) + [""]


def _header(doc: dict[str, Any]) -> list[str]:
    m, s = doc["machine"], doc["settings"]
    found = [f"{PEER_LABELS[n]} {p['version']}" for n, p in doc["peers"].items() if not _na(p)]
    missing = [f"{PEER_LABELS[n]} ({p['not_available']})"
               for n, p in doc["peers"].items() if _na(p)]
    title = "opfuse benchmark" + (" (--quick smoke run)" if doc["quick"] else "")
    return [
        f"# {title}",
        "",
        f"{doc['created_utc']} · {m['platform']} · {m['cpus']} CPUs · "
        f"backend `{m['backend']}` · "
        f"peers limited to {s['threads'] or 'default'} thread(s) · total run "
        f"{doc['total_run_s']:.0f} s · `{' '.join(doc['command'])}`",
        "",
        f"Peers found: {', '.join(found) or 'none'}."
        + (f" Not found: {'; '.join(missing)}." if missing else ""),
        "",
        "Reproduce: `pip install -e '.[bench]'` then `python -m bench` (writes bench/results/; "
        "`python -m bench --help` for graphs, scales and files).",
        "",
    ]


def _run_table(doc: dict[str, Any]) -> list[str]:
    head = ("| graph | scale | kernels unfused → fused | Inductor | XLA | IREE cpu (sm_80) | MB unfused → "
            "fused | unfused ms | fused ms | speedup (min–max) | of medians | "
            + " | ".join(f"{PEER_LABELS[p]} ms" for p in PEERS) + " | fused / IREE 1 thread | same, thread CPU |")
    rows = [head, "|" + "---|" * (13 + len(PEERS))]
    for g in doc["graphs"]:
        k, b, t = g["kernels"], g["bytes"], g["time"]
        sp = t["speedup"]
        bad = [n for n, c in g["correctness"].items()
               if isinstance(c, dict) and c.get("ok") is False]
        name = g["name"] + (f" ⚠ mismatch: {', '.join(bad)}" if bad else "")
        rows.append(
            f"| {name} | {_num(g['scale'])} | {k['before']} → {k['after']} "
            f"| {_num(k['inductor'])} "
            f"| {_num(k['xla'])} | {_num(k['iree'])} ({_num(k.get('iree_cuda'))}) "
            f"| {b['before'] / 1e6:.1f} → {b['after'] / 1e6:.1f} "
            f"| {_ms(t['unfused'])} | {_ms(t['fused'])} "
            f"| **{sp['median']:.2f}×** ({sp['min']:.2f}–{sp['max']:.2f}) "
            f"| {sp['of_medians']:.2f}× | "
            + " | ".join(_ms(t["peers"][p]) for p in PEERS)
            + f" | {_fused_over(t['peers']['iree_st'])} "
            f"| {_fused_over(t['thread_cpu'].get('contenders', {}).get('iree_st', {'not_available': ''}))} |"
        )
    rows.append("")
    for s in doc["skipped"]:
        rows.append(f"Skipped: {s['name']} ({s['reason'].splitlines()[0]}).")
    if doc["skipped"]:
        rows.append("")
    return ["## Run time and kernels", ""] + rows + [
        "Speedup = unfused / fused time through the same backend: median over interleaved "
        "rounds of the per-round ratio; 'of medians' = ratio of the two median times (far "
        "apart: a noisy run). Times are medians of all calls (shared, noisy "
        "machine: compare ratios, not absolute times). MB = device bytes read + written, "
        "from opfuse's cost model. Kernel counting for Inductor and XLA: bench/peers/kernels.py; "
        "IREE: dispatches (bench/peers/iree.py), compiled from the same .mlir for llvm-cpu "
        "(host), and in parentheses for CUDA sm_80 (compile only; IREE 3.13 has no sm_90).",
        "",
        _iree_summary(doc),
        "",
    ] + _fusion_win(doc)


def _fusion_win(doc: dict[str, Any]) -> list[str]:
    """Issue 13's fusion-win lines, each with the contraction floor beside it."""
    r = doc["summary"].get("fusion_win")
    if r is None:
        return []
    if _na(r):
        return [f"Fused ≥ 1.5× unfused (issue 13): n/a ({r['not_available']}).", ""]
    lines = [f"Fused ≥ {r['target_min']}× unfused through the same backend (issue 13), with "
             "unfused / the graph's contractions alone beside it (about the most fusion can "
             "reach with the same matmul code; bench/contractions.py):", ""]
    for name, g in r["per_graph"].items():
        floor = g["unfused_over_contractions"]
        lines.append(f"- {name}: {g['speedup']:.2f}× — {'met' if g['met'] else 'NOT met'}"
                     + ("" if _na(floor) else f"; unfused / contractions alone {floor:.2f}×"))
    return lines + [""]


def _iree_summary(doc: dict[str, Any]) -> str:
    r = doc["summary"].get("fused_over_iree_st")
    if r is None or _na(r):
        return "opfuse fused / IREE 1 thread: " + ("n/a" if r is None else r["not_available"])
    c = r["thread_cpu"]
    cpu = ("" if _na(c) else f" Thread CPU time: geometric mean **{c['geomean']:.2f}**, worst "
           f"{c['worst']:.2f} ({c['worst_graph']}).")
    return (f"opfuse fused / IREE 1 thread over {r['graphs']} graphs, wall time: geometric "
            f"mean **{r['geomean']:.2f}**, worst {r['worst']:.2f} ({r['worst_graph']}); "
            f"targets ≤ {r['target_geomean']} and ≤ {r['target_worst']}.{cpu}")


def _compile_table(doc: dict[str, Any]) -> list[str]:
    rows = ["| graph | parse | fusion | codegen | JIT | total cold | total warm | unfused cold "
            "| torch.compile | jax.jit | IREE |", "|" + "---|" * 11]
    ptxas = None
    for g in doc["graphs"]:
        c = g["compile"]
        cold, warm, ucold = c["fused"]["cold"], c["fused"]["warm"], c["unfused"]["cold"]
        if _na(cold):
            stages = ["n/a"] * 5
        else:
            stages = [f"{cold[s]:.3f}" for s in ("parse_s", "fusion_s", "codegen_s", "jit_s",
                                                 "total_s")]
            ptxas = cold["ptxas"]
        rows.append(
            f"| {g['name']} | " + " | ".join(stages)
            + f" | {_num(warm if _na(warm) else warm['total_s'], '{:.3f}')}"
            + f" | {_num(ucold if _na(ucold) else ucold['total_s'], '{:.3f}')}"
            + f" | {_num(c['peers']['torch_compile'], '{:.2f}')}"
            + f" | {_num(c['peers']['jax_jit'], '{:.2f}')}"
            + f" | {_num(c['peers']['iree_st'], '{:.2f}')} |"
        )
    note = f"ptxas: not available: {ptxas['not_available']}." if _na(ptxas) else ""
    return ["## Compile time (s, fused pipeline unless stated)", ""] + rows + [
        "",
        f"{doc['compile_time']['meaning']} Process warm-up: "
        f"{doc['compile_time']['process_init_s']:.2f} s. {note}",
        "",
    ]


def _scaling(doc: dict[str, Any]) -> list[str]:
    s, summ = doc["scaling"], doc["summary"]
    rows = ["| family | ops | planning s (CPU s) | outline s (CPU s) |", "|---|---|---|---|"]
    for name, fam in s["families"].items():
        for p in fam["points"]:
            rows.append(f"| {name} | {p['ops']} "
                        f"| {p['planning_s']:.3f} ({p['planning_cpu_s']:.3f}) "
                        f"| {p['outline_s']:.3f} ({p['outline_cpu_s']:.3f}) |")
    exps = "; ".join(
        f"{n}: planning {f['planning_exponent']:.2f} (CPU time {f['planning_cpu_exponent']:.2f}), "
        f"outline {f['outline_exponent']:.2f}"
        for n, f in s["families"].items()
    )
    t, met = summ["targets"], summ["met"]

    def mark(ok: Any) -> str:
        return "n/a" if _na(ok) else ("met" if ok else "NOT met")

    g2 = summ["g2_speedup"]
    return ["## Fusion planning scaling", "", "Wall seconds, this process's CPU seconds in "
            "parentheses (a wall figure far above the CPU one means a starved run).", ""] + rows + [
        "",
        f"Fitted exponents (log-log least squares): {exps}.",
        "",
        "## Targets (issue 6)",
        "",
        f"- G2 fused ≥ {t['g2_speedup_min']}× faster than unfused: "
        f"{_num(g2, '{:.2f}×')} at scale {_num(summ['g2_scale'])} — {mark(met['g2_speedup'])}",
        f"- planning of the {s['largest_target_ops']}-op graph < {t['planning_largest_s_max']} s: "
        f"{s['planning_largest_s']:.2f} s wall, {s['planning_largest_cpu_s']:.2f} s CPU (worse "
        f"family) — {mark(met['planning_largest'])} (judged on wall time)",
        f"- planning exponent ≤ {t['planning_exponent_max']}: {s['planning_exponent']:.2f} "
        f"(worse family) — {mark(met['planning_exponent'])}",
    ]


# --- charts ---------------------------------------------------------------------------


def charts(doc: dict[str, Any], out: Path) -> list[str] | dict[str, str]:
    """The four PNGs; their names, or why there are none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return not_available("matplotlib not installed (pip install '.[bench]')")
    names = []
    for name, draw in (("times.png", _times_chart), ("kernels.png", _kernels_chart),
                       ("compile.png", _compile_chart), ("scaling.png", _scaling_chart)):
        fig = draw(plt, doc)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def _short(name: str) -> str:
    return name.split("_")[0].upper() if name[:1] == "g" and name[1:2].isdigit() else name


def _grouped(ax, labels: list[str], series: dict[str, list[float | None]]) -> None:
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [j + i * width for j, v in enumerate(values) if v is not None]
        ax.bar(xs, [v for v in values if v is not None], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # never over a bar


def _times_chart(plt, doc):
    graphs = doc["graphs"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    series: dict[str, list[float | None]] = {"opfuse fused": []}
    series.update({PEER_LABELS[p]: [] for p in PEERS})
    for g in graphs:
        base = g["time"]["unfused"]["median_s"]
        series["opfuse fused"].append(g["time"]["fused"]["median_s"] / base)
        for p in PEERS:
            fig_p = g["time"]["peers"][p]
            series[PEER_LABELS[p]].append(None if _na(fig_p) else fig_p["median_s"] / base)
    _grouped(ax, [_short(g["name"]) for g in graphs], series)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("time / opfuse unfused (lower is faster)")
    ax.set_title(f"Run time relative to opfuse unfused ({doc['machine']['backend']})")
    return fig


def _kernels_chart(plt, doc):
    graphs = doc["graphs"]
    fig, ax = plt.subplots(figsize=(10, 4))
    keys = {"opfuse unfused": "before", "opfuse fused": "after", "Inductor": "inductor",
            "XLA": "xla", "IREE": "iree"}
    series = {label: [None if _na(g["kernels"][k]) else g["kernels"][k] for g in graphs]
              for label, k in keys.items()}
    _grouped(ax, [_short(g["name"]) for g in graphs], series)
    ax.set_ylabel("kernels")
    ax.set_title("Kernels per graph")
    return fig


def _compile_chart(plt, doc):
    graphs = [g for g in doc["graphs"] if not _na(g["compile"]["fused"]["cold"])]
    fig, ax = plt.subplots(figsize=(10, 4))
    labels = [_short(g["name"]) for g in graphs]
    bottom = [0.0] * len(graphs)
    for stage in ("parse_s", "fusion_s", "codegen_s", "jit_s"):
        vals = [g["compile"]["fused"]["cold"][stage] for g in graphs]
        ax.bar(labels, vals, bottom=bottom, label=stage[:-2] + " (cold)")
        bottom = [b + v for b, v in zip(bottom, vals)]
    warm = [g["compile"]["fused"]["warm"] for g in graphs]
    ax.plot(labels, [None if _na(w) else w["total_s"] for w in warm], "kD", label="total (warm)")
    ax.set_ylabel("seconds")
    ax.set_title("opfuse compile time per stage (fused pipeline)")
    ax.legend(fontsize=8)
    return fig


def _scaling_chart(plt, doc):
    s = doc["scaling"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, fam) in enumerate(s["families"].items()):
        ops = [p["ops"] for p in fam["points"]]
        ax.plot(ops, [p["planning_s"] for p in fam["points"]], "o-", color=f"C{i}",
                label=f"{name} planning (k={fam['planning_exponent']:.2f})")
        ax.plot(ops, [p["outline_s"] for p in fam["points"]], "s:", color=f"C{i}",
                label=f"{name} outline (k={fam['outline_exponent']:.2f})")
    ax.axhline(doc["summary"]["targets"]["planning_largest_s_max"], color="r", lw=0.8,
               label="planning target at the largest size")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("linalg ops")
    ax.set_ylabel("seconds")
    ax.set_title("Fusion planning and outlining time vs graph size")
    ax.legend(fontsize=8)
    return fig
