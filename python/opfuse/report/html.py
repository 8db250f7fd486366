"""The fusion report as one self-contained HTML page: the seed's three steps.

1. the op graph before fusion (every op its own kernel);
2. the same graph, same layout, with the fusion groups drawn as boxes coloured by kind
   (loop, input, output, opaque), so which ops became which kernel is read off directly;
3. what fusion saves, as bar charts: device bytes and kernel launches before and after,
   bytes saved per kernel, and the estimated time saved with T_launch and B_mem named;

then the totals, a row per kernel (kind, member ops, W, Q, AI, registers estimated and
measured, bytes saved) and a row per refused candidate with its binding reason and the
threshold that would have let it fuse.

Everything is inline (SVG, CSS, a little JavaScript for highlighting): the page needs no
network and holds no URL. The script only adds hover highlighting and, once it has checked
that the graph and charts are there, marks ``<body data-ok="1">``; a script error is
shown in the page (``#errors``) and marks ``data-error``. Headless browsers (the tests)
read those marks.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

from ..kinds import KINDS
from . import graphview
from .render import human_bytes, human_flops, human_rate, human_seconds

_MAX_MEMBERS_SHOWN = 12
_MAX_KERNEL_BARS = 16


def render_html(
    report: dict[str, Any] | Sequence[dict[str, Any]],
    *,
    engine: str = "auto",
    title: str | None = None,
) -> str:
    """The page for one report, or for several (one section each, e.g. split input).

    Args:
        engine: graph layout: ``auto`` (Graphviz dot when installed), ``dot``, ``builtin``.
        title: the page title (default: from the report's ``source``).
    """
    reports = [report] if isinstance(report, dict) else list(report)
    sections = [_section(r, i, engine) for i, r in enumerate(reports)]
    source = next((r.get("source") for r in reports if r.get("source")), None)
    title = title or ("opfuse fusion report" + (f" — {source}" if source else ""))
    return _PAGE.format(
        title=_e(title),
        css=_CSS,
        onerror=_ONERROR_JS,
        h1=_e(title),
        sections="\n".join(sections),
        script=_MAIN_JS,
    )


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


# --- one report ---------------------------------------------------------------------------


def _section(report: dict[str, Any], index: int, engine: str) -> str:
    kernels = report.get("kernels", [])
    graph = report.get("graph") or {"nodes": [], "edges": [], "functions": 0}
    drawing = graphview.draw(graph, kernels, engine)
    totals = report["totals"]
    before_k, after_k = totals["before"]["kernels"], totals["after"]["kernels"]
    ops = (report.get("overview") or {}).get("ops", len(graph["nodes"]))
    meta = [f"source: {report['source']}"] if report.get("source") else []
    if report.get("pipeline"):
        meta.append(f"pipeline: {report['pipeline']}")
    meta.append(f"graph layout: {drawing.engine}" + (f" ({drawing.note})" if drawing.note else ""))
    parts = [
        f'<section class="report" data-report="{index}">',
        f'<p class="meta">{"<br>".join(_e(m) for m in meta)}</p>',
        _cards(report),
        _legend(kernels),
        '<div class="steps">',
        _figure("before", f"1 · The op graph before fusion: {_n(ops, 'op')}, "
                f"{_n(before_k, 'kernel')} (one per op)", drawing.svg, index),
        _figure("after", f"2 · After fusion: {_n(after_k, 'kernel')} — each box is one "
                "kernel, coloured by kind", drawing.svg, index),
        "</div>",
        '<p class="hint">Same layout in both views. Hover a box, a node or a kernel row to '
        "highlight a kernel everywhere; click a graph to widen it. A node with a double "
        "border was duplicated into several kernels.</p>",
        "<h2>3 · What fusion saves</h2>",
        _charts(report),
        "<h2>Totals</h2>",
        _totals_table(report),
        f"<h2>Kernels ({len(kernels)})</h2>",
        _kernel_table(kernels),
        _refused_table(report.get("decisions", [])),
        _decisions_table(report.get("decisions", [])),
        "</section>",
    ]
    return "\n".join(parts)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _figure(view: str, caption: str, svg: str, index: int) -> str:
    return (f'<figure class="view {view}"><figcaption>{_e(caption)}</figcaption>'
            f'{svg.replace("__P__", f"r{index}-{view}")}</figure>')


def _cards(report: dict[str, Any]) -> str:
    t = report["totals"]
    b, a = t["before"], t["after"]
    cards = [
        ("kernel launches", f"{b['kernels']} → {a['kernels']}", f"{t['launches_saved']} saved"),
        ("device bytes", f"{human_bytes(b['bytes'])} → {human_bytes(a['bytes'])}",
         _percent(b["bytes"], a["bytes"])),
    ]
    est = report.get("estimate")
    if est:
        cards.append(("estimated T_saved", human_seconds(est["t_saved_s"]),
                      f"T_launch {human_seconds(est['t_launch_s'])}, "
                      f"B_mem {human_rate(est['b_mem_bytes_per_s'])} ({est['target']})"))
    o = report.get("overview")
    if o:
        cards.append(("decisions", f"{o['fused']} fused · {o['refused']} refused",
                      f"{o['ops']} ops in {o['functions']} function(s)"))
    p = report.get("ptxas")
    if p:
        cards.append(("ptxas", f"max {p['registers_max']} registers",
                      f"{p['kernels_measured']} kernels, {human_bytes(p['spill_bytes'])} spilled"))
    body = "".join(f'<div class="card"><div class="card-k">{_e(k)}</div>'
                   f'<div class="card-v">{_e(v)}</div><div class="card-s">{_e(s)}</div></div>'
                   for k, v, s in cards)
    return f'<div class="cards">{body}</div>'


def _legend(kernels: list[dict[str, Any]]) -> str:
    counts = {k: 0 for k in graphview.KINDS}
    for i in range(len(kernels)):
        counts[graphview.kernel_kind(kernels, i)] += 1
    items = "".join(
        f'<span class="lg"><span class="sw kind-{k}"></span>{k} — {KINDS[k].label} '
        f'({counts[k]})</span>'
        for k in graphview.KINDS)
    return f'<div class="legend">{items}</div>'


def _percent(before: float, after: float) -> str:
    if not before:
        return ""
    return f"{(after - before) / before * 100:+.1f}%"


# --- charts -----------------------------------------------------------------------------------


def bar_chart(title: str, rows: list[tuple[str, float, str, str]], *, kind: str,
              width: int = 380) -> str:
    """A horizontal bar chart as SVG: one ``(label, value, value text, css class)`` per
    bar; every bar is a ``rect.bar``."""
    label_w, bar_h, gap, top = 118, 18, 7, 26
    text_w = max((len(text) for _, _, text, _ in rows), default=0) * 6.4 + 10
    width = max(width, int(label_w + text_w + 120))  # room for a bar and its figure
    area = width - label_w - text_w
    peak = max((abs(v) for _, v, _, _ in rows), default=0) or 1
    height = top + len(rows) * (bar_h + gap) + 6
    out = [f'<svg class="chart" data-chart="{_e(kind)}" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" font-family="Helvetica, Arial, sans-serif">',
           f'<text x="4" y="15" font-size="12.5" font-weight="bold" '
           f'fill="#111827">{_e(title)}</text>']
    for i, (label, value, text, cls) in enumerate(rows):
        y = top + i * (bar_h + gap)
        w = max(1.0, area * abs(value) / peak)
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" font-size="11" text-anchor="end" '
                   f'fill="#374151">{_e(label)}</text>')
        out.append(f'<rect class="bar {cls}" x="{label_w}" y="{y}" width="{w:.1f}" '
                   f'height="{bar_h}" rx="3"><title>{_e(label)}: {_e(text)}</title></rect>')
        out.append(f'<text x="{label_w + w + 5:.1f}" y="{y + 13}" font-size="11" '
                   f'fill="#111827">{_e(text)}</text>')
    out.append("</svg>")
    return "".join(out)


def _charts(report: dict[str, Any]) -> str:
    t = report["totals"]
    b, a = t["before"], t["after"]
    charts = [
        bar_chart("Device bytes moved", [
            ("before (unfused)", b["bytes"], human_bytes(b["bytes"]), "before"),
            ("after (fused)", a["bytes"], human_bytes(a["bytes"]), "after"),
        ], kind="bytes"),
        bar_chart("Kernel launches", [
            ("before (unfused)", b["kernels"], str(b["kernels"]), "before"),
            ("after (fused)", a["kernels"], str(a["kernels"]), "after"),
        ], kind="launches"),
    ]
    est = report.get("estimate")
    if est:
        launch_s = est["launches_saved"] * est["t_launch_s"]
        memory_s = est["bytes_saved"] / est["b_mem_bytes_per_s"]
        charts.append(bar_chart("Estimated time saved", [
            ("launches", launch_s, f"{human_seconds(launch_s)} ({est['launches_saved']} × "
             f"{human_seconds(est['t_launch_s'])})", "after"),
            ("memory traffic", memory_s, f"{human_seconds(memory_s)} (at "
             f"{human_rate(est['b_mem_bytes_per_s'])})", "after"),
        ], kind="time"))
    saved = [(i, k) for i, k in enumerate(report.get("kernels", []))
             if k.get("bytes_saved") and len(k.get("members") or []) > 1]
    saved.sort(key=lambda ik: -ik[1]["bytes_saved"])
    if saved:
        rows = [(_kernel_short(k), k["bytes_saved"], human_bytes(k["bytes_saved"]),
                 f"kind-{graphview.kernel_kind(report['kernels'], i)} k{i}")
                for i, k in saved[:_MAX_KERNEL_BARS]]
        more = f" (top {_MAX_KERNEL_BARS} of {len(saved)})" if len(saved) > _MAX_KERNEL_BARS else ""
        charts.append(bar_chart(f"Bytes saved per fused kernel{more}", rows, kind="kernels",
                                width=460))
    boxes = "".join(f'<div class="chart-box">{c}</div>' for c in charts)
    return f'<div class="charts">{boxes}</div>'


def _kernel_short(k: dict[str, Any]) -> str:
    name = str(k.get("name", "?"))
    return name if len(name) <= 18 else name[:17] + "…"


# --- tables -----------------------------------------------------------------------------------


def _totals_table(report: dict[str, Any]) -> str:
    t = report["totals"]
    b, a = t["before"], t["after"]
    rows = [
        ("kernels (launches)", b["kernels"], a["kernels"], f"{t['launches_saved']} saved"),
        ("device bytes", human_bytes(b["bytes"]), human_bytes(a["bytes"]),
         f"{human_bytes(t['bytes_saved'])} saved ({_percent(b['bytes'], a['bytes'])})"),
        ("flops (W)", human_flops(b["flops"]), human_flops(a["flops"]), ""),
    ]
    est = report.get("estimate")
    if est:
        rows.append(("estimated T_saved", "", human_seconds(est["t_saved_s"]),
                     f"{est['launches_saved']} × T_launch {human_seconds(est['t_launch_s'])} + "
                     f"{human_bytes(est['bytes_saved'])} / B_mem "
                     f"{human_rate(est['b_mem_bytes_per_s'])} ({est['target']})"))
    p = report.get("ptxas")
    if p:
        err = p.get("estimate_error_max")
        rows.append(("ptxas -v", "", f"max {p['registers_max']} registers",
                     f"{p['kernels_measured']} kernels measured ({p.get('arch') or '?'}), "
                     f"{human_bytes(p['spill_bytes'])} spilled"
                     + (f", estimate off by at most {err}" if err is not None else "")))
    body = "".join(f"<tr><th>{_e(r[0])}</th><td>{_e(r[1])}</td><td>{_e(r[2])}</td>"
                   f"<td>{_e(r[3])}</td></tr>" for r in rows)
    return ('<table class="totals"><thead><tr><th></th><th>before</th><th>after</th><th></th>'
            f"</tr></thead><tbody>{body}</tbody></table>")


def _num(value: Any, fmt: str = "{:.3g}") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return fmt.format(value)
    return str(value)


def _kernel_table(kernels: list[dict[str, Any]]) -> str:
    head = ("<tr><th>#</th><th>kernel</th><th>kind</th><th>member ops</th><th>W (flops)</th>"
            "<th>Q (bytes)</th><th>AI</th><th>regs est.</th><th>regs ptxas</th>"
            "<th>bytes saved</th></tr>")
    rows = []
    for i, k in enumerate(kernels):
        kind = graphview.kernel_kind(kernels, i)
        members = [str(m) for m in (k.get("members") or [])]
        shown = ", ".join(members[:_MAX_MEMBERS_SHOWN])
        if len(members) > _MAX_MEMBERS_SHOWN:
            shown += f", … (+{len(members) - _MAX_MEMBERS_SHOWN})"
        saved = k.get("bytes_saved")
        rows.append(
            f'<tr class="krow" data-kernel="{i}"><td>{i}</td>'
            f'<td><span class="sw kind-{kind}"></span>{_e(k.get("name", "?"))}</td>'
            f"<td>{_e(kind)}</td>"
            f'<td class="members" title="{_e(", ".join(members))}">'
            f"<b>{len(members)}</b>: {_e(shown)}</td>"
            f"<td>{_e(human_flops(k['flops']) if 'flops' in k else '—')}</td>"
            f"<td>{_e(human_bytes(k['bytes']) if 'bytes' in k else '—')}</td>"
            f"<td>{_e(_num(k.get('ai')))}</td>"
            f"<td>{_e(_num(k.get('registers', k.get('regs'))))}</td>"
            f"<td>{_e(_num(k.get('registers_measured')))}</td>"
            f"<td>{_e(human_bytes(saved) if saved is not None else '—')}</td></tr>"
        )
    notes = [_attention_note(k) for k in kernels if k.get("attention")]
    table = f'<table class="kernels"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    return table + "".join(notes)


def _attention_note(k: dict[str, Any]) -> str:
    """An attention kernel's saving in the seed's terms, under the kernel table."""
    a = k["attention"]
    return (f'<p class="attention-note"><span class="sw kind-attention"></span>'
            f'<b>{_e(k.get("name", "?"))}</b>: Q<sub>unfused</sub> = Q<sub>QK</sub> + '
            f"Q<sub>S</sub> + Q<sub>PV</sub> = {_e(human_bytes(a['q_unfused']))}, "
            f"Q<sub>fused</sub> = Q<sub>QK</sub> + Q<sub>PV</sub> = {_e(human_bytes(a['q_fused']))}: "
            f"Q<sub>S</sub> = {_e(human_bytes(a['q_s']))} saved (S and P stay on chip)</p>")


def _pass(d: dict[str, Any]) -> str:
    return str(d.get("pass_name", "")).removeprefix("opfuse-")


def _refused_table(decisions: list[dict[str, Any]]) -> str:
    refused = [d for d in decisions if not d.get("fused")]
    if not refused:
        return ("<h2>Refused candidates (0)</h2>"
                "<p>Every candidate the passes considered was fused.</p>")
    head = ("<tr><th>pass</th><th>candidate (producer → consumer)</th><th>location</th>"
            "<th>binding reason</th><th>would fuse with</th></tr>")
    rows = []
    for d in refused:
        would = d.get("would_fuse_with")
        rows.append(
            f'<tr class="refused"><td>{_e(_pass(d))}</td>'
            f"<td>{_e(d['producer'])} → {_e(d['consumer'])}"
            f"{' (duplicate)' if d.get('action') == 'duplicate' else ''}</td>"
            f"<td>{_e(d.get('location', ''))}</td><td>{_e(d['reason'])}</td>"
            f'<td class="{"would" if would else "structural"}">'
            f"{_e(would) if would else '— (structural: no threshold flips it)'}</td></tr>"
        )
    return (f"<h2>Refused candidates ({len(refused)})</h2>"
            f'<table class="refused"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')


def _decisions_table(decisions: list[dict[str, Any]]) -> str:
    head = ("<tr><th>step</th><th>pass</th><th>verdict</th><th>candidate</th><th>reason</th>"
            "</tr>")
    rows = "".join(
        f"<tr><td>{_e(d.get('step') or '')}</td><td>{_e(_pass(d))}</td>"
        f"<td>{'fused' if d.get('fused') else 'not fused'}"
        f"{' (duplicate)' if d.get('action') == 'duplicate' else ''}</td>"
        f"<td>{_e(d['producer'])} → {_e(d['consumer'])}</td><td>{_e(d['reason'])}</td></tr>"
        for d in decisions)
    return (f"<details><summary>All {len(decisions)} decisions, in order (step = the fusion's "
            "rank, what --fusion-fuel counts)</summary>"
            f'<table class="decisions"><thead>{head}</thead><tbody>{rows}</tbody></table>'
            "</details>")


# --- page ---------------------------------------------------------------------------------

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="opfuse">
<title>{title}</title>
<style>{css}</style>
<script>{onerror}</script>
</head>
<body>
<div id="errors" class="errors" hidden></div>
<h1>{h1}</h1>
{sections}
<script>{script}</script>
</body>
</html>
"""

_KIND_CSS = "".join(
    f".kind-{k}.sw, .sw.kind-{k} {{ background: {fill}; border-color: {stroke}; }}\n"
    f"rect.bar.kind-{k} {{ fill: {stroke}; }}\n"
    for k, (fill, stroke) in graphview.KIND_COLORS.items()
)

_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 16px 20px; color: #111827;
       font-size: 13px; }
h1 { font-size: 20px; margin: 0 0 6px; }
h2 { font-size: 15px; margin: 20px 0 8px; }
.meta { color: #4b5563; font-size: 11.5px; margin: 0 0 10px; word-break: break-all; }
.errors { background: #fee2e2; color: #991b1b; border: 1px solid #ef4444; padding: 8px;
          white-space: pre-wrap; font-family: monospace; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0; }
.card { border: 1px solid #d1d5db; border-radius: 8px; padding: 8px 12px; min-width: 170px;
        background: #f9fafb; }
.card-k { font-size: 11px; color: #6b7280; text-transform: uppercase; letter-spacing: .04em; }
.card-v { font-size: 17px; font-weight: bold; margin: 2px 0; }
.card-s { font-size: 11px; color: #374151; }
.legend { margin: 8px 0; display: flex; flex-wrap: wrap; gap: 14px; font-size: 12px; }
.sw { display: inline-block; width: 12px; height: 12px; border: 2px solid #999;
      border-radius: 3px; vertical-align: -2px; margin-right: 5px; }
.steps { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; align-items: start; }
.view { margin: 0; border: 1px solid #d1d5db; border-radius: 8px; padding: 6px;
        background: #fff; cursor: zoom-in; }
.view.wide { grid-column: 1 / span 2; cursor: zoom-out; }
.view figcaption { font-weight: bold; font-size: 13px; margin: 2px 4px 6px; }
.view svg.graph-svg { width: 100%; height: auto; display: block; }
.view.before .cluster { display: none; }
.view.before .node rect, .view.before .node path, .view.before .node polygon,
.view.before .node ellipse { fill: #ffffff; stroke: #6b7280; }
.view.after .node.hl rect, .view.after .node.hl path, .view.after .node.hl polygon,
.view .cluster.hl rect, .view .cluster.hl path, .view .cluster.hl polygon {
  stroke: #111827; stroke-width: 4px; }
.hint { color: #6b7280; font-size: 11.5px; margin: 6px 0; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart-box { border: 1px solid #d1d5db; border-radius: 8px; padding: 6px; background: #fff; }
rect.bar.before { fill: #9ca3af; }
rect.bar.after { fill: #2563eb; }
rect.bar.hl { stroke: #111827; stroke-width: 2px; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0 8px; }
th, td { border: 1px solid #e5e7eb; padding: 3px 7px; text-align: left; vertical-align: top; }
thead th { background: #f3f4f6; }
tr.krow:hover, tr.krow.hl { background: #fef9c3; }
td.members { max-width: 560px; }
td.would { color: #065f46; font-weight: bold; }
td.structural { color: #6b7280; }
details { margin: 12px 0; }
summary { cursor: pointer; font-weight: bold; }
""" + _KIND_CSS

# Installed first (in <head>) so that errors in the main script are caught and shown.
_ONERROR_JS = """
window.onerror = function (message, source, line) {
  var box = document.getElementById("errors");
  if (box) { box.hidden = false; box.textContent += message + " (line " + line + ")\\n"; }
  document.documentElement.setAttribute("data-error", "1");
  if (document.body) { document.body.setAttribute("data-error", "1"); }
};
"""

_MAIN_JS = """
(function () {
  "use strict";
  function all(sel, root) {
    return Array.prototype.slice.call((root || document).querySelectorAll(sel));
  }
  function kernelOf(el) {
    var m = /(?:^|\\s)k(\\d+)(?:\\s|$)/.exec(el.getAttribute("class") || "");
    return m ? m[1] : el.getAttribute("data-kernel");
  }
  function highlight(section, k, on) {
    all(".k" + k + ", tr[data-kernel='" + k + "']", section).forEach(function (el) {
      el.classList.toggle("hl", on);
    });
  }
  all("section.report").forEach(function (section) {
    var hoverable = ".view.after .cluster, .view.after .node, tr.krow, rect.bar";
    all(hoverable, section).forEach(function (el) {
      var k = kernelOf(el);
      if (k === null) { return; }
      el.addEventListener("mouseenter", function () { highlight(section, k, true); });
      el.addEventListener("mouseleave", function () { highlight(section, k, false); });
    });
    all("figure.view", section).forEach(function (fig) {
      fig.addEventListener("click", function () { fig.classList.toggle("wide"); });
    });
  });
  // What a headless browser checks: the graph and the charts are in the page, drawn.
  var body = document.body;
  var before = all(".view.before svg .node").length;
  var after = all(".view.after svg .node").length;
  var clusters = all(".view.after svg .cluster").length;
  var bars = all("svg.chart rect.bar").length;
  var charts = all("svg.chart").length;
  var drawn = all(".view.after svg").every(function (svg) {
    var box = svg.getBoundingClientRect();
    return box.width > 0 && box.height > 0;
  });
  body.setAttribute("data-graph-nodes", String(after));
  body.setAttribute("data-graph-nodes-before", String(before));
  body.setAttribute("data-clusters", String(clusters));
  body.setAttribute("data-charts", String(charts));
  body.setAttribute("data-bars", String(bars));
  body.setAttribute("data-height", String(document.documentElement.scrollHeight));
  if (before === after && charts >= 2 && bars >= 4 && drawn) {
    body.setAttribute("data-ok", "1");
  } else {
    throw new Error("report incomplete: " + after + " nodes, " + charts + " charts, " + bars +
                    " bars, drawn=" + drawn);
  }
})();
"""
