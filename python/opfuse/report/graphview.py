"""Draw the op graph of a report with its fusion groups, as inline SVG.

One drawing serves both views of the HTML report: every kernel is a cluster (a box around
its member ops, ``class="cluster kind-<kind> k<i>"``) and every op a node (``class="node
kind-<kind> k<i>"``); the page hides the clusters and the colours for "before fusion" and
shows them for "after", so the two views have the same layout and can be compared op by op.

Two engines:
- ``dot``: Graphviz ``dot -Tsvg`` with one ``subgraph cluster_*`` per kernel, when ``dot``
  is on PATH;
- ``builtin``: a small layered layout for machines without Graphviz. Each kernel is laid
  out on its own (longest-path layers of its members), then the kernels and the lone nodes
  (function arguments) are layered the same way as boxes, ordered and placed at the mean
  position of what feeds them. Edges are curves from the producer's bottom to the
  consumer's top.

The SVG carries no ids (it is inlined twice) except the arrow marker's, spelled with the
placeholder ``__P__`` that the page replaces per copy; and no namespace URLs (inline SVG
in HTML needs none), so the page holds no URL at all.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from .. import kinds as _kinds

#: Fill (light) and stroke (dark) per kernel kind (opfuse.kinds); "none" for nodes in no
#: kernel.
KIND_COLORS: dict[str, tuple[str, str]] = {
    **{k.name: (k.fill, k.stroke) for k in _kinds.KINDS.values()},
    "none": ("#ffffff", "#6b7280"),
}
KINDS = tuple(_kinds.KINDS)

ENGINES = ("auto", "dot", "builtin")
DOT_TIMEOUT_S = 60

# builtin layout, in px
_CHAR_W = 6.6
_NODE_H = 34
_ARG_H = 22
_GAP_X = 16
_GAP_Y = 30
_PAD = 10
_TITLE_H = 18
_MARGIN = 12


@dataclass
class Drawing:
    """An SVG drawing and how it was made.

    Attributes:
        svg: the ``<svg>`` element (scales to its container's width).
        engine: ``dot`` or ``builtin``.
        note: why the requested engine was not used, if it was not.
    """

    svg: str
    engine: str
    note: str = ""


def kernel_kind(kernels: list[dict[str, Any]], index: int | None) -> str:
    if index is None or index >= len(kernels):
        return "none"
    kind = str(kernels[index].get("kind", _kinds.OPAQUE))
    return kind if kind in KIND_COLORS else _kinds.OPAQUE


def draw(graph: dict[str, Any], kernels: list[dict[str, Any]], engine: str = "auto") -> Drawing:
    """Draw ``graph`` (``report["graph"]``) with the ``kernels`` it refers to.

    Args:
        engine: ``dot`` (Graphviz, required), ``builtin``, or ``auto`` (dot when on PATH).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown graph engine '{engine}' (engines: {', '.join(ENGINES)})")
    note = ""
    if engine in ("auto", "dot"):
        dot = shutil.which("dot")
        if dot is not None:
            try:
                return Drawing(_dot_svg(dot, graph, kernels), "dot")
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                note = f"Graphviz dot failed ({e}); built-in layout used"
        else:
            note = "Graphviz dot is not installed; built-in layout used"
        if engine == "dot":
            raise RuntimeError(note)
    return Drawing(builtin_svg(graph, kernels), "builtin", note if engine == "dot" else "")


# --- shared -------------------------------------------------------------------------------


def _primary_kernel(node: dict[str, Any]) -> int | None:
    ids = node.get("kernel_ids") or []
    return ids[0] if ids else None


def node_lines(node: dict[str, Any]) -> tuple[str, str]:
    """The two lines a node shows: its name, and what it is."""
    label = node["label"]
    if node["op"] == "argument":
        return label, _short_type(node.get("type", ""))
    op = node["op"].split(".", 1)[-1]
    if "@" in label:  # an op without a NameLoc: op@file:line:col
        return label.split("@", 1)[1].rsplit("/", 1)[-1], f"{op} · {node['op_kind']}"
    return label, f"{op} · {node['op_kind']}"


def node_title(node: dict[str, Any], kernels: list[dict[str, Any]]) -> str:
    """Tooltip: label, op, type, and the kernel(s) it became part of."""
    where = [str(kernels[i].get("name", i)) for i in node.get("kernel_ids") or []]
    text = f"{node['label']}\n{node['op']} ({node['op_kind']})"
    if node.get("type"):
        text += f"\n{node['type']}"
    if len(where) > 1:
        text += f"\nduplicated into {len(where)} kernels: {', '.join(where)}"
    elif where:
        text += f"\nkernel {where[0]}"
    return text


def node_classes(node: dict[str, Any], kernels: list[dict[str, Any]]) -> str:
    k = _primary_kernel(node)
    classes = [f"kind-{kernel_kind(kernels, k)}"]
    classes += [f"k{i}" for i in node.get("kernel_ids") or []]
    if node["op"] == "argument":
        classes.append("arg")
    if len(node.get("kernel_ids") or []) > 1:
        classes.append("dup")
    return " ".join(classes)


def kernel_title(kernel: dict[str, Any], members: int) -> str:
    return f"{kernel.get('name', '?')} · {members} op{'s' if members != 1 else ''}"


def _short_type(t: str) -> str:
    m = re.fullmatch(r"tensor<(.*)>", t)
    return m.group(1) if m else t


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


# --- Graphviz -----------------------------------------------------------------------------


def to_dot(graph: dict[str, Any], kernels: list[dict[str, Any]]) -> str:
    """The graph in DOT, one ``cluster_k<i>`` per kernel."""

    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    lines = [
        "digraph opfuse {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.2, ranksep=0.3, '
        'bgcolor="transparent", newrank=true];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, '
        'height=0.3, margin="0.08,0.03", penwidth=1.2];',
        '  edge [color="#8a8f98", arrowsize=0.6, penwidth=1.0];',
    ]
    by_kernel: dict[int | None, list[dict[str, Any]]] = {}
    for node in graph["nodes"]:
        by_kernel.setdefault(_primary_kernel(node), []).append(node)

    def node_stmt(node: dict[str, Any], indent: str) -> str:
        kind = kernel_kind(kernels, _primary_kernel(node))
        fill, stroke = KIND_COLORS[kind]
        first, second = node_lines(node)
        attrs = [f"label={q(first + chr(10) + second)}", f"class={q(node_classes(node, kernels))}",
                 f"tooltip={q(node_title(node, kernels))}", f"fillcolor={q(fill)}",
                 f"color={q(stroke)}"]
        if node["op"] == "argument":
            attrs += ["shape=box", 'style="rounded,filled,dashed"', "fontsize=9", "height=0.2"]
        if "dup" in node_classes(node, kernels).split():
            attrs.append("peripheries=2")
        return f"{indent}{q(node['id'])} [{', '.join(attrs)}];"

    for k, nodes in by_kernel.items():
        if k is None:
            lines += [node_stmt(n, "  ") for n in nodes]
            continue
        kind = kernel_kind(kernels, k)
        fill, stroke = KIND_COLORS[kind]
        lines.append(f"  subgraph cluster_k{k} {{")
        lines.append(
            f"    label={q(kernel_title(kernels[k], len(nodes)))}; class={q(f'kind-{kind} k{k}')}; "
            f'style="rounded,filled"; fillcolor={q(_tint(fill))}; color={q(stroke)}; '
            f"fontcolor={q(stroke)}; penwidth=2; fontsize=10; labeljust=l;"
        )
        lines += [node_stmt(n, "    ") for n in nodes]
        lines.append("  }")
    for src, dst in graph["edges"]:
        lines.append(f"  {q(src)} -> {q(dst)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_svg(dot: str, graph: dict[str, Any], kernels: list[dict[str, Any]]) -> str:
    proc = subprocess.run([dot, "-Tsvg"], input=to_dot(graph, kernels), capture_output=True,
                          text=True, timeout=DOT_TIMEOUT_S)
    if proc.returncode != 0 or "<svg" not in proc.stdout:
        raise ValueError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else
                         f"exit code {proc.returncode}")
    return clean_dot_svg(proc.stdout)


def clean_dot_svg(svg: str) -> str:
    """Graphviz's SVG made fit to inline twice: no XML prolog, DOCTYPE, comments, ids or
    namespace URLs; width follows the container (the viewBox keeps the aspect ratio)."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.S).replace("&#45;", "-")
    svg = re.sub(r'\s(?:xmlns(?::\w+)?|id)="[^"]*"', "", svg)
    head_end = svg.index(">")
    head = re.sub(r'\s(?:width|height)="[^"]*"', "", svg[:head_end])
    box = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) [\d.]+"', head)
    width = float(box.group(1)) * 4 / 3 if box else 0  # pt -> px: never scaled up
    style = f' style="max-width: {width:.0f}px"' if width else ""
    head = head.replace("<svg", f'<svg class="graph-svg"{style}', 1)
    svg = head + ' preserveAspectRatio="xMidYMin meet"' + svg[head_end:]
    return svg.strip() + "\n"


def _tint(fill: str) -> str:
    """A lighter version of a fill colour, for cluster backgrounds."""
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * 0.55) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


# --- built-in layered layout ----------------------------------------------------------------


@dataclass
class _Box:
    """A kernel (cluster of nodes) or a lone node, laid out as one block."""

    kernel: int | None
    members: list[str]
    order: int  # block order of the first member: a topological order of the boxes
    w: float = 0.0
    h: float = 0.0
    x: float = 0.0
    y: float = 0.0
    local: dict[str, tuple[float, float]] = field(default_factory=dict)  # node centre in box
    layer: int = 0
    want: float | None = None  # desired centre x


def _node_size(node: dict[str, Any]) -> tuple[float, float]:
    first, second = node_lines(node)
    if node["op"] == "argument":
        return max(40.0, len(first) * _CHAR_W + 14), float(_ARG_H)
    return max(84.0, max(len(first), len(second) * 0.9) * _CHAR_W + 18), float(_NODE_H)


def _layers(ids: list[str], preds: dict[str, list[str]]) -> dict[str, int]:
    """Longest-path layering; ``ids`` in a topological order, edges against it ignored."""
    rank = {n: i for i, n in enumerate(ids)}
    layer: dict[str, int] = {}
    for n in ids:
        ps = [layer[p] for p in preds.get(n, []) if p in layer and rank[p] < rank[n]]
        layer[n] = max(ps) + 1 if ps else 0
    return layer


def _layout_box(box: _Box, sizes: dict[str, tuple[float, float]],
                preds: dict[str, list[str]], title: str) -> None:
    inner = {m: [p for p in preds.get(m, []) if p in set(box.members)] for m in box.members}
    layer = _layers(box.members, inner)
    rows: dict[int, list[str]] = {}
    for m in box.members:
        rows.setdefault(layer[m], []).append(m)
    x_of: dict[str, float] = {}
    widths = {}
    for i in sorted(rows):
        row = rows[i]
        if i > 0:  # barycentre of the producers in the row above, stable for ties
            row.sort(key=lambda m: (sum(x_of[p] for p in inner[m] if p in x_of) /
                                    max(1, sum(1 for p in inner[m] if p in x_of))
                                    if any(p in x_of for p in inner[m]) else 1e9))
        x = 0.0
        for m in row:
            x_of[m] = x + sizes[m][0] / 2
            x += sizes[m][0] + _GAP_X
        widths[i] = x - _GAP_X
    width = max(widths.values())
    lone = box.kernel is None
    pad, title_h = (0.0, 0.0) if lone else (_PAD, _TITLE_H)
    y = pad + title_h
    for i in sorted(rows):
        shift = (width - widths[i]) / 2
        row_h = max(sizes[m][1] for m in rows[i])
        for m in rows[i]:
            box.local[m] = (pad + shift + x_of[m], y + row_h / 2)
        y += row_h + _GAP_Y * 0.6
    box.w = width + 2 * pad
    box.h = y - _GAP_Y * 0.6 + pad
    if not lone:  # room for the title
        box.w = max(box.w, len(title) * _CHAR_W + 2 * pad)


def _boxes(graph: dict[str, Any]) -> tuple[list[_Box], dict[str, _Box]]:
    by_kernel: dict[int, _Box] = {}
    boxes: list[_Box] = []
    for i, node in enumerate(graph["nodes"]):
        k = _primary_kernel(node)
        order = -1 if node["op"] == "argument" else i
        if k is None:
            boxes.append(_Box(None, [node["id"]], order))
        elif k in by_kernel:
            by_kernel[k].members.append(node["id"])
        else:
            by_kernel[k] = _Box(k, [node["id"]], order)
            boxes.append(by_kernel[k])
    box_of = {m: b for b in boxes for m in b.members}
    return boxes, box_of


def _place(boxes: list[_Box], box_of: dict[str, _Box], preds: dict[str, list[str]],
           succs: dict[str, list[str]]) -> None:
    """Layer the boxes, then give each a position (see the module docstring)."""
    is_arg = {id(b): b.order < 0 for b in boxes}
    main = sorted((b for b in boxes if not is_arg[id(b)]), key=lambda b: b.order)
    rank = {id(b): i for i, b in enumerate(main)}
    for b in main:
        ps = {id(box_of[p]) for m in b.members for p in preds.get(m, [])}
        layers = [x.layer for x in main if id(x) in ps and rank[id(x)] < rank[id(b)]]
        b.layer = max(layers) + 1 if layers else 1
    for b in boxes:
        if is_arg[id(b)]:
            below = [box_of[s].layer for m in b.members for s in succs.get(m, [])]
            b.layer = min(below) - 1 if below else 0
    by_layer: dict[int, list[_Box]] = {}
    for b in sorted(boxes, key=lambda b: b.order):
        by_layer.setdefault(b.layer, []).append(b)

    def abs_x(node_id: str) -> float:
        b = box_of[node_id]
        return b.x + b.local[node_id][0]

    placed: set[int] = set()
    for layer in sorted(by_layer):  # down: follow what feeds each box (arguments excepted)
        for b in by_layer[layer]:
            xs = [abs_x(p) for m in b.members for p in preds.get(m, [])
                  if id(box_of[p]) in placed and not is_arg[id(box_of[p])]]
            b.want = sum(xs) / len(xs) if xs else None
        _pack(by_layer[layer])
        placed.update(id(b) for b in by_layer[layer])
    for layer in sorted(by_layer):  # up: arguments over the ops that read them
        row = by_layer[layer]
        taken = [(b.x, b.x + b.w) for b in row if not is_arg[id(b)]]
        for b in sorted((b for b in row if is_arg[id(b)]), key=lambda b: b.order):
            xs = [abs_x(s) for m in b.members for s in succs.get(m, [])]
            b.x = _free_spot(min(xs) if xs else 0.0, b.w, taken)
            taken.append((b.x, b.x + b.w))
    left = min(b.x for b in boxes)
    y = float(_MARGIN)
    for layer in sorted(by_layer):
        height = max(b.h for b in by_layer[layer])
        for b in by_layer[layer]:
            b.x += _MARGIN - left
            # an argument sits at the bottom of its layer, right over what reads it
            b.y = y + (height - b.h if is_arg[id(b)] else 0.0)
        y += height + _GAP_Y


def _free_spot(centre: float, width: float, taken: list[tuple[float, float]]) -> float:
    """The left edge nearest to ``centre - width / 2`` where ``width`` fits between the
    ``taken`` intervals (with a gap)."""
    gap = _GAP_X
    candidates = [centre - width / 2]
    for lo, hi in taken:
        candidates += [lo - gap - width, hi + gap]

    def free(x: float) -> bool:
        return all(x + width + gap <= lo or x >= hi + gap for lo, hi in taken)

    return min((x for x in candidates if free(x)), key=lambda x: abs(x + width / 2 - centre))


def _pack(row: list[_Box]) -> None:
    """Place a layer's boxes left to right, each at its wanted centre when there is room."""
    row.sort(key=lambda b: (b.want if b.want is not None else float("inf"), b.order))
    right = None
    for b in row:
        want = b.want if b.want is not None else (right or 0.0) + _GAP_X + b.w / 2
        x = want - b.w / 2
        if right is not None:
            x = max(x, right + _GAP_X * 1.5)
        b.x = x
        right = x + b.w


def _edge_svg(a: tuple[float, float], b: tuple[float, float], size_a: tuple[float, float],
              size_b: tuple[float, float], inner: bool) -> str:
    """A producer-to-consumer curve: bottom to top; an edge that skips rows of a column
    inside a kernel would run behind the nodes in between, so it leaves the producer's
    right side, bows out and enters the consumer's right side."""
    (x1, y1), (x2, y2) = a, b
    if inner and abs(x2 - x1) < 4 and y2 - y1 > _NODE_H + _GAP_Y:
        x1 += size_a[0] / 2
        x2 += size_b[0] / 2
        out = max(x1, x2) + 16 + min(40.0, (y2 - y1) * 0.04)
        path = f"M{x1:.1f},{y1:.1f} C{out:.1f},{y1:.1f} {out:.1f},{y2:.1f} {x2 + 1:.1f},{y2:.1f}"
    else:
        y1 += size_a[1] / 2
        y2 -= size_b[1] / 2
        bend = max(12.0, (y2 - y1) * 0.45)
        path = (f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} "
                f"{x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}")
    return (f'<g class="edge{" inner" if inner else ""}"><path d="{path}" fill="none" '
            'stroke="#8a8f98" stroke-width="1.1" marker-end="url(#__P__-arrow)"/></g>')


def builtin_svg(graph: dict[str, Any], kernels: list[dict[str, Any]]) -> str:
    """The graph drawn with the built-in layered layout (no Graphviz needed)."""
    nodes = {n["id"]: n for n in graph["nodes"]}
    if not nodes:
        return ('<svg class="graph-svg" viewBox="0 0 200 40">'
                '<text x="10" y="24">(no ops)</text></svg>\n')
    preds: dict[str, list[str]] = {}
    succs: dict[str, list[str]] = {}
    for src, dst in graph["edges"]:
        if src in nodes and dst in nodes:
            preds.setdefault(dst, []).append(src)
            succs.setdefault(src, []).append(dst)
    sizes = {i: _node_size(n) for i, n in nodes.items()}
    boxes, box_of = _boxes(graph)
    for b in boxes:
        title = kernel_title(kernels[b.kernel], len(b.members)) if b.kernel is not None else ""
        _layout_box(b, sizes, preds, title)
    _place(boxes, box_of, preds, succs)

    def centre(node_id: str) -> tuple[float, float]:
        b = box_of[node_id]
        lx, ly = b.local[node_id]
        return b.x + lx, b.y + ly

    width = max(b.x + b.w for b in boxes) + _MARGIN
    height = max(b.y + b.h for b in boxes) + _MARGIN
    out = [f'<svg class="graph-svg" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'style="max-width: {width:.0f}px" preserveAspectRatio="xMidYMin meet" '
           'font-family="Helvetica, Arial, sans-serif">',
           '<defs><marker id="__P__-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
           'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
           '<path d="M0,0 L10,5 L0,10 z" fill="#8a8f98"/></marker></defs>']
    for b in boxes:  # clusters first, under the edges and nodes
        if b.kernel is None:
            continue
        kind = kernel_kind(kernels, b.kernel)
        fill, stroke = KIND_COLORS[kind]
        name = kernel_title(kernels[b.kernel], len(b.members))
        out.append(
            f'<g class="cluster kind-{kind} k{b.kernel}"><title>{_esc(name)}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="8" '
            f'fill="{_tint(fill)}" stroke="{stroke}" stroke-width="2"/>'
            f'<text x="{b.x + _PAD:.1f}" y="{b.y + 13:.1f}" font-size="10.5" font-weight="bold" '
            f'fill="{stroke}">{_esc(name)}</text></g>'
        )
    for src, dst in graph["edges"]:
        if src not in nodes or dst not in nodes:
            continue
        out.append(_edge_svg(centre(src), centre(dst), sizes[src], sizes[dst],
                             box_of[src] is box_of[dst] and box_of[src].kernel is not None))
    for node_id, node in nodes.items():
        x, y = centre(node_id)
        w, h = sizes[node_id]
        kind = kernel_kind(kernels, _primary_kernel(node))
        fill, stroke = KIND_COLORS[kind]
        first, second = node_lines(node)
        classes = node_classes(node, kernels)
        arg = node["op"] == "argument"
        dash = ' stroke-dasharray="4 2"' if arg else ""
        double = "dup" in classes.split()
        shape = (f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" '
                 f'rx="6" fill="{fill}" stroke="{stroke}" '
                 f'stroke-width="{2.4 if double else 1.2}"{dash}/>')
        if arg:
            text = (f'<text x="{x:.1f}" y="{y + 3.5:.1f}" font-size="9.5" text-anchor="middle" '
                    f'fill="#374151">{_esc(first)}</text>')
        else:
            text = (f'<text x="{x:.1f}" y="{y - 2:.1f}" font-size="11" text-anchor="middle" '
                    f'fill="#111827">{_esc(first)}</text>'
                    f'<text x="{x:.1f}" y="{y + 11:.1f}" font-size="8.5" text-anchor="middle" '
                    f'fill="#4b5563">{_esc(second)}</text>')
        out.append(f'<g class="node {classes}"><title>{_esc(node_title(node, kernels))}</title>'
                   f"{shape}{text}</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
