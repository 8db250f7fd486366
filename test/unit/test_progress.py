"""The driver's progress lines and --timing (opfuse.driver.progress), and the CLIs' flags."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from opfuse.driver import progress

ROOT = Path(__file__).resolve().parents[2]
G2 = ROOT / "examples/g2_elementwise_chain.mlir"


def test_spans_nest_and_the_table_lists_them_in_order():
    timing = progress.Timing()
    with progress.run("tool", timing=timing, stream=io.StringIO(), progress=False):
        with progress.stage("fused program"):
            with progress.stage("linalg"):
                pass
            with progress.stage("fused"):
                pass
        with progress.stage("timed runs"):
            pass
    assert [(s.name, s.depth) for s in timing.spans] == [
        ("fused program", 0), ("linalg", 1), ("fused", 1), ("timed runs", 0)]
    lines = timing.table().splitlines()
    assert "opfuse stage timing" in lines[1]
    assert lines[-1].endswith("Total") and "(100.0%)" in lines[-1]
    assert lines[-4].endswith("    linalg")  # indented under its parent


def test_progress_lines_only_once_a_compile_is_long(monkeypatch):
    out = io.StringIO()
    with progress.run("fuse-opt", stream=out, progress=True):
        with progress.stage("linalg"):
            pass
    assert out.getvalue() == ""  # under a second: silent
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.0)
    with progress.run("fuse-opt", stream=out, progress=True):
        with progress.stage("fused"):
            pass
    assert out.getvalue().startswith("fuse-opt: fused 0.0s")


def test_stages_outside_a_run_cost_nothing_and_print_nothing(capsys):
    with progress.stage("fused"):
        pass
    assert capsys.readouterr().err == ""


def test_progress_follows_the_terminal_unless_the_environment_says(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("OPFUSE_PROGRESS", raising=False)
    assert progress.wants_progress(Tty()) and not progress.wants_progress(io.StringIO())
    monkeypatch.setenv("OPFUSE_PROGRESS", "0")
    assert not progress.wants_progress(Tty())
    monkeypatch.setenv("OPFUSE_PROGRESS", "1")
    assert progress.wants_progress(io.StringIO())


def _tool(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    code = f"import sys; from opfuse.tools.{name} import main; sys.exit(main(sys.argv[1:]))"
    import os

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_fuse_opt_timing_names_the_stages():
    done = _tool("fuse_opt", str(G2), "--emit=ptx", "--timing", "-o", "/dev/null")
    assert done.returncode == 0, done.stderr
    names = [line.split()[-1] for line in done.stderr.splitlines() if "%)" in line]
    assert names == ["linalg", "fused", "ptx", "gpu", "Total"]


def test_fuse_run_progress_on_request():
    done = _tool("fuse_run", str(G2), "--repeat", "1", OPFUSE_PROGRESS="1")
    assert done.returncode == 0, done.stderr
    assert "fuse-run: fused program" in done.stderr
    assert "fuse-run: unfused program" in done.stderr
    quiet = _tool("fuse_run", str(G2), "--repeat", "1", OPFUSE_PROGRESS="0")
    assert "fuse-run:" not in quiet.stderr
