"""The HTML fusion report in a real browser: headless Chromium (Debian ``chromium``) loads
the pages of G6 (encoder layer) and G1 (the seed MLP) from a file with name resolution
disabled (so the page cannot lean on the network), and the test reads the DOM after the
scripts ran: the page marks ``<body data-ok="1">`` once it has found the graph and the
charts drawn (nodes with a size, bars), and ``data-error`` plus a visible ``#errors`` box
on any script error. A screenshot of each page is kept: in pytest's tmp dir, and copied to
``$OPFUSE_TEST_ARTIFACTS`` when that is set.

Skipped (with the reason) when no Chromium is installed: ``apt-get install chromium``.
The same pages are checked without a browser in test_report.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from opfuse.report import html as html_report
from opfuse.tools import fuse_opt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)"
)

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # any network access would fail
)
TIMEOUT_S = 120
WIDTH = 1600
MAX_HEIGHT = 16000


def chromium(*args: str) -> str:
    """Run headless Chromium with a throwaway profile; its stdout."""
    with tempfile.TemporaryDirectory(prefix="opfuse-chromium-") as profile:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def body_attributes(dom: str) -> dict[str, str]:
    m = re.search(r"<body([^>]*)>", dom)
    assert m, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))


def keep_artifact(path: Path) -> None:
    target = os.environ.get("OPFUSE_TEST_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


def page_for(tmp_path: Path, example: str, engine: str) -> Path:
    report_json = tmp_path / f"{example}.json"
    assert fuse_opt.main([str(EXAMPLES / f"{example}.mlir"), "--opfuse-report=json",
                          "-o", str(report_json)]) == 0
    import json

    page = tmp_path / f"{example}-{engine}.html"
    page.write_text(html_report.render_html(json.loads(report_json.read_text()), engine=engine),
                    encoding="utf-8")
    return page


ENGINES = ["auto", pytest.param("builtin", id="builtin")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("example, ops, kernels", [("g6_encoder_layer", 69, 7), ("g1_mlp", 20, 2)])
def test_report_draws_in_chromium(tmp_path, example, ops, kernels, engine):
    page = page_for(tmp_path, example, engine)
    dom = chromium(f"--window-size={WIDTH},1200", "--dump-dom", page.as_uri())
    attrs = body_attributes(dom)
    errors = re.search(r'<div id="errors"[^>]*>(.*?)</div>', dom, re.S)
    assert "data-error" not in attrs, errors.group(1) if errors else dom[:2000]
    assert errors is not None and errors.group(1) == ""
    assert attrs.get("data-ok") == "1", attrs
    args = {"g6_encoder_layer": 17, "g1_mlp": 5}[example]
    assert int(attrs["data-graph-nodes"]) == int(attrs["data-graph-nodes-before"]) == ops + args
    assert int(attrs["data-clusters"]) == kernels
    assert int(attrs["data-charts"]) >= 3 and int(attrs["data-bars"]) >= 6

    height = min(MAX_HEIGHT, int(attrs["data-height"]) + 20)
    shot = tmp_path / f"report-{example}-{engine}.png"
    chromium(f"--window-size={WIDTH},{height}", f"--screenshot={shot}", page.as_uri())
    assert shot.exists() and shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep_artifact(shot)
    keep_artifact(page)


def test_a_script_error_is_caught_and_shown(tmp_path):
    """The marks are not vacuous: a page whose script fails says so."""
    page = page_for(tmp_path, "g1_mlp", "builtin")
    text = page.read_text(encoding="utf-8")
    broken = text.replace('"use strict";', '"use strict"; undefinedFunction();', 1)
    assert broken != text
    page.write_text(broken, encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri())
    attrs = body_attributes(dom)
    assert attrs.get("data-error") == "1" and "data-ok" not in attrs
    assert "undefinedFunction" in re.search(r'<div id="errors"[^>]*>(.*?)</div>', dom, re.S).group(1)
