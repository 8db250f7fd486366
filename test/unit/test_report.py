"""The fusion report (opfuse.report): its JSON against the schema, its figures against the
cost model, the graph it carries, and the HTML page read structurally (html.parser): both
graph views with their nodes, a cluster per kernel, the charts, and no URL anywhere.

The page in a real browser (headless Chromium) is test_report_browser.py.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from opfuse.cost import TARGETS
from opfuse.report import graphview, render, schema, summary
from opfuse.report import html as html_report
from opfuse.tools import fuse_opt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
G1 = EXAMPLES / "g1_mlp.mlir"
G6 = EXAMPLES / "g6_encoder_layer.mlir"

HAVE_DOT = shutil.which("dot") is not None


def fuse_opt_report(tmp_path: Path, source: Path, *args: str, fmt: str = "json") -> str:
    out = tmp_path / f"{source.stem}.{fmt}"
    assert fuse_opt.main([str(source), f"--opfuse-report={fmt}", "-o", str(out), *args]) == 0
    return out.read_text()


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """The JSON reports of G1 (the seed MLP) and G6 (encoder layer), default pipeline."""
    tmp = tmp_path_factory.mktemp("reports")
    return {p.stem: json.loads(fuse_opt_report(tmp, p)) for p in (G1, G6)}


# --- JSON and schema -------------------------------------------------------------------------


def test_reports_match_the_schema(reports):
    for name, report in reports.items():
        assert schema.validate(report) == [], name
        assert report["schema"] == summary.SCHEMA_ID


def test_split_input_reports_match_the_schema(tmp_path):
    text = G1.read_text() + "\n// -----\n" + (EXAMPLES / "g2_elementwise_chain.mlir").read_text()
    src = tmp_path / "two.mlir"
    src.write_text(text)
    out = tmp_path / "two.json"
    assert fuse_opt.main([str(src), "--split-input-file", "--opfuse-report=json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert isinstance(doc, list) and len(doc) == 2
    assert schema.main([str(out)]) == 0
    assert [r["totals"]["after"]["kernels"] for r in doc] == [2, 1]


def test_schema_file_is_documented_and_closed():
    s = schema.load_schema()
    assert s["$id"] == summary.SCHEMA_ID
    # every object in the schema lists its keys: a new report field must be documented
    def objects(node):
        if isinstance(node, dict):
            if node.get("type") == "object" or node.get("type") == ["object", "null"]:
                yield node
            for v in node.values():
                yield from objects(v)
        elif isinstance(node, list):
            for v in node:
                yield from objects(v)

    for obj in objects(s):
        if "properties" in obj:
            assert obj.get("additionalProperties") is False, obj.get("required")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.pop("totals"), "$: missing required key 'totals'"),
        (lambda r: r.update(extra=1), "$: unexpected key 'extra'"),
        (lambda r: r["totals"]["before"].update(bytes="12"),
         "$.totals.before.bytes: expected integer, got string"),
        (lambda r: r["totals"]["after"].update(kernels=-1),
         "$.totals.after.kernels: -1 < minimum 0"),
        (lambda r: r["kernels"][0].update(kind="fancy"),
         "$.kernels[0].kind: 'fancy' is not one of"),
        (lambda r: r["decisions"][0].update(fused="yes"),
         "$.decisions[0].fused: expected boolean, got string"),
        (lambda r: r["decisions"][0]["numbers"].update(saving=True),
         "$.decisions[0].numbers.saving: expected number, got boolean"),
        (lambda r: r["graph"]["edges"].append(["a0"]), "items < minItems 2"),
        (lambda r: r.update(ptxas={"arch": "sm_90"}),
         "$.ptxas: missing required key 'registers_max'"),
    ],
)
def test_schema_validator_finds_violations(reports, edit, message):
    report = json.loads(json.dumps(reports["g1_mlp"]))
    edit(report)
    errors = schema.validate(report)
    assert any(message in e for e in errors), errors


def test_validator_refuses_keywords_it_does_not_check():
    with pytest.raises(ValueError, match="unsupported keywords: \\['pattern'\\]"):
        schema.validate("x", {"type": "string", "pattern": "^x$"})


# --- figures ----------------------------------------------------------------------------------


def test_kernel_bytes_saved_add_up_to_the_total(reports):
    for name, report in reports.items():
        saved = sum(k["bytes_saved"] for k in report["kernels"])
        # shares of duplicated ops are rounded per kernel
        assert abs(saved - report["totals"]["bytes_saved"]) <= len(report["kernels"]), name


def test_estimate_is_the_seed_formula_with_named_figures(reports):
    t = TARGETS["sm_90"]
    for report in reports.values():
        e, totals = report["estimate"], report["totals"]
        assert (e["target"], e["t_launch_s"], e["b_mem_bytes_per_s"]) == ("sm_90", t.t_launch_s, t.b_mem)
        expect = totals["launches_saved"] * t.t_launch_s + totals["bytes_saved"] / t.b_mem
        assert e["t_saved_s"] == pytest.approx(expect)


def test_overview_counts(reports):
    g6 = reports["g6_encoder_layer"]
    o = g6["overview"]
    assert o["ops"] == g6["totals"]["before"]["kernels"] == 69
    assert o["decisions"] == len(g6["decisions"]) == o["fused"] + o["refused"]
    assert o["refused"] > 0


def test_graph_ties_every_op_to_its_kernels(reports):
    g6 = reports["g6_encoder_layer"]
    nodes = {n["id"]: n for n in g6["graph"]["nodes"]}
    ops = [n for n in nodes.values() if n["op"] != "argument"]
    args = [n for n in nodes.values() if n["op"] == "argument"]
    assert len(ops) == 69 and len(args) == 17
    assert all(n["kernel_ids"] for n in ops)  # every op ended up in some kernel
    assert all(src in nodes and dst in nodes for src, dst in g6["graph"]["edges"])
    # membership agrees with the kernel rows
    for i, k in enumerate(g6["kernels"]):
        drawn = {n["label"] for n in ops if i in n["kernel_ids"]}
        assert drawn == set(k["members"]), k["name"]
    # the duplicated producer: one op, three kernels
    (tokens,) = [n for n in ops if n["label"] == "tokens"]
    assert len(tokens["kernel_ids"]) == 2  # twice in the first layernorm kernel, once later
    assert Counter(m for k in g6["kernels"] for m in k["members"])["tokens"] == 3
    # arguments feed ops
    x = next(n for n in args if n["label"] == "x")
    assert [dst for src, dst in g6["graph"]["edges"] if src == x["id"]] == [tokens["id"]]


def test_measured_registers_join_the_rows(reports):
    report = json.loads(json.dumps(reports["g1_mlp"]))
    summary.attach_measured(report, {"fusion_1_output": {"registers": 40, "spill_stores": 8,
                                                       "arch": "sm_90"}})
    row = report["kernels"][1]
    assert (row["registers_measured"], row["spill_bytes"]) == (40, 8)
    assert report["ptxas"] == {"arch": "sm_90", "kernels_measured": 1, "registers_max": 40,
                               "spill_bytes": 8, "estimate_error_max": abs(40 - row["registers"])}
    assert schema.validate(report) == []
    text = render.render_text(report)
    assert "ptxas: 1 kernels measured (sm_90), max 40 registers, 8 B spilled" in text
    assert "regs_ptxas=40" in text
    page = html_report.render_html(report, engine="builtin")
    assert "max 40 registers" in page


def test_set_target_reprices_the_estimate(reports):
    report = json.loads(json.dumps(reports["g1_mlp"]))
    summary.set_target(report, "sm_80")
    assert report["estimate"]["target"] == "sm_80"
    assert report["estimate"]["t_launch_s"] == TARGETS["sm_80"].t_launch_s


# --- HTML, structurally ----------------------------------------------------------------------


class Page(HTMLParser):
    """What the tests look for in the page: the elements by class, per graph view."""

    def __init__(self) -> None:
        super().__init__()
        self.view: str | None = None
        self.depth = 0
        self.count: Counter[tuple[str | None, str]] = Counter()
        self.classes: list[tuple[str | None, str, str]] = []  # (view, tag, class)
        self.urls: list[str] = []
        self.tags: Counter[str] = Counter()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] += 1
        cls = a.get("class") or ""
        for name, value in attrs:
            if value and re.search(r"(?i)\b(?:https?|ftp):|^//", value):
                self.urls.append(f"{tag} {name}={value}")
            if name in ("src", "href") and value:
                self.urls.append(f"{tag} {name}={value}")
        if tag == "figure" and "view" in cls.split():
            self.view = "before" if "before" in cls.split() else "after"
            self.depth = 0
        if tag == "figure":
            self.depth += 1
        for c in cls.split():
            self.count[(self.view, c)] += 1
        if cls:
            self.classes.append((self.view, tag, cls))

    def handle_endtag(self, tag):
        if tag == "figure" and self.view is not None:
            self.depth -= 1
            if self.depth == 0:
                self.view = None

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Page:
    p = Page()
    p.feed(page)
    return p


ENGINES = [
    "builtin",
    pytest.param("dot", marks=pytest.mark.skipif(not HAVE_DOT, reason="Graphviz dot is not installed")),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["g1_mlp", "g6_encoder_layer"])
def test_html_has_both_views_a_cluster_per_kernel_and_charts(reports, name, engine):
    report = reports[name]
    page = html_report.render_html(report, engine=engine)
    p = parse(page)
    n_ops = report["overview"]["ops"]
    n_args = sum(1 for n in report["graph"]["nodes"] if n["op"] == "argument")
    # step 1 and step 2: the same nodes, one drawing each
    assert p.count[("before", "graph-svg")] == p.count[("after", "graph-svg")] == 1
    assert p.count[("before", "node")] == p.count[("after", "node")] == n_ops + n_args
    # step 2: one cluster per kernel, coloured by kind; each node in its kernel's colour
    kinds = Counter(k["kind"] for k in report["kernels"])
    assert p.count[("after", "cluster")] == len(report["kernels"])
    for kind, n in kinds.items():
        assert sum(1 for v, t, c in p.classes if v == "after" and "cluster" in c.split()
                   and f"kind-{kind}" in c.split()) == n
    for i, k in enumerate(report["kernels"]):
        primary = [n for n in report["graph"]["nodes"] if n["kernel_ids"][:1] == [i]]
        in_cluster = [c for v, t, c in p.classes if v == "after" and "node" in c.split()
                      and c.split()[1] == f"kind-{k['kind']}" and f"k{i}" in c.split()]
        assert len(in_cluster) >= len(primary), k["name"]
    # step 3: the savings charts, bytes and launches before and after
    charts = [c for v, t, c in p.classes if t == "svg" and c == "chart"]
    assert len(charts) >= 3
    bars = [c for v, t, c in p.classes if t == "rect" and "bar" in c.split()]
    assert Counter(c for c in bars if c in ("bar before", "bar after"))["bar before"] >= 2
    assert 'data-chart="bytes"' in page and 'data-chart="launches"' in page
    # tables: a row per kernel, the totals, the refused candidates
    assert p.count[(None, "krow")] == len(report["kernels"])
    refused = report["overview"]["refused"]
    assert p.count[(None, "refused")] == refused + (1 if refused else 0)  # rows + the table
    text = "".join(p.text)
    assert "T_launch" in text and "B_mem" in text
    # self-contained: no URL, no external resource, the script inline
    assert p.urls == []
    assert not re.search(r"(?i)https?:|url\((?!#)", page)
    assert p.tags["script"] == 2 and p.tags["link"] == 0 and p.tags["img"] == 0
    assert "data-ok" in page and 'id="errors"' in page


def test_html_names_the_layout_engine(reports, monkeypatch):
    monkeypatch.setattr(graphview.shutil, "which", lambda name: None)
    page = html_report.render_html(reports["g1_mlp"])  # auto, without dot: built-in
    assert "graph layout: builtin" in page
    with pytest.raises(RuntimeError, match="dot is not installed"):
        graphview.draw(reports["g1_mlp"]["graph"], reports["g1_mlp"]["kernels"], "dot")


@pytest.mark.skipif(not HAVE_DOT, reason="Graphviz dot is not installed")
def test_dot_layout_is_used_when_installed(reports):
    page = html_report.render_html(reports["g1_mlp"])
    assert "graph layout: dot" in page
    assert "<!DOCTYPE svg" not in page and "xmlns" not in page and "&#45;" not in page


def test_dot_source_has_a_cluster_per_kernel(reports):
    g6 = reports["g6_encoder_layer"]
    dot = graphview.to_dot(g6["graph"], g6["kernels"])
    assert dot.count("subgraph cluster_k") == len(g6["kernels"])
    assert 'class="kind-input k0"' in dot


def test_builtin_layout_keeps_boxes_apart(reports):
    """Kernel boxes of the built-in layout never overlap, and each holds its nodes."""
    g6 = reports["g6_encoder_layer"]
    svg = graphview.builtin_svg(g6["graph"], g6["kernels"])
    found = re.findall(
        r'<g class="cluster [^"]* k(\d+)"><title>[^<]*</title><rect x="([\d.-]+)" y="([\d.-]+)" '
        r'width="([\d.]+)" height="([\d.]+)"', svg)
    boxes = {int(k): tuple(float(v) for v in rest) for k, *rest in found}
    assert sorted(boxes) == list(range(len(g6["kernels"])))
    rects = list(boxes.values())
    for i, (x1, y1, w1, h1) in enumerate(rects):
        for x2, y2, w2, h2 in rects[i + 1:]:
            apart = x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1
            assert apart, ((x1, y1, w1, h1), (x2, y2, w2, h2))
    nodes = re.findall(r'<g class="node ([^"]*)"><title>[^<]*</title><rect x="([\d.-]+)" '
                       r'y="([\d.-]+)" width="([\d.]+)" height="([\d.]+)"', svg)
    for classes, x, y, w, h in nodes:
        ks = [int(c[1:]) for c in classes.split() if re.fullmatch(r"k\d+", c)]
        if not ks:
            continue
        bx, by, bw, bh = boxes[ks[0]]
        x, y, w, h = map(float, (x, y, w, h))
        assert bx <= x and x + w <= bx + bw and by <= y and y + h <= by + bh, classes


def test_several_reports_make_one_page(reports):
    page = render.render_html([reports["g1_mlp"], reports["g6_encoder_layer"]])
    p = parse(page)
    assert p.count[(None, "report")] == 2
    assert page.count("<html") == 1


def test_fuse_opt_writes_the_page(tmp_path):
    page = fuse_opt_report(tmp_path, G1, fmt="html")
    assert page.startswith("<!DOCTYPE html>")
    assert "source: " + str(G1) in html_report.html.unescape(page)
    assert "opfuse-fuse-elementwise" in page  # the pipeline
