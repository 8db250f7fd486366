"""Dumps and reproducers (issue "See the fusion", parts 2 and 3).

A planted failing pass (registered for the test only) breaks a real pipeline run by
fuse-opt in-process; the error names the reproducer, and the one command it prints, run
again (in-process, with the same planted pass), fails the same way. Dumps: fuse-opt and
fuse-run write every stage's IR, the pipeline and the ledger, in folders that never
collide; fuse-run adds the lowered CPU module.
"""

from __future__ import annotations

import json
import re
import shlex
import types
from pathlib import Path

import pytest

from opfuse import passes
from opfuse.tools import fuse_opt, fuse_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
G3 = EXAMPLES / "g3_softmax.mlir"
G2 = EXAMPLES / "g2_elementwise_chain.mlir"


def _explode(module, options):
    """Fails on graphs that compute an exp, as a pass with a bug in one pattern would."""
    if "math.exp" in str(module):
        raise RuntimeError("planted failure: cannot handle math.exp")


def _break_ir(module, options):
    """Leaves a function without its terminator: invalid IR for the verifier."""
    for op in module.body.operations:
        if op.operation.name == "func.func":
            list(op.operation.regions[0].blocks[0].operations)[-1].erase()
            return


def _pass(name: str, run) -> types.ModuleType:
    from opfuse.passes.outline import Options  # any frozen dataclass of options

    mod = types.ModuleType(name.replace("-", "_"))
    mod.__doc__ = f"{name}: a planted failing pass (tests only)."
    mod.NAME, mod.Options, mod.run = name, Options, run
    return mod


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """The real passes plus two broken ones; reproducers go under tmp_path."""
    reg = {**passes.registry(), "test-explode": _pass("test-explode", _explode),
           "test-break-ir": _pass("test-break-ir", _break_ir)}
    monkeypatch.setattr(passes, "registry", lambda: reg)
    monkeypatch.setenv("OPFUSE_TEMP_DIR", str(tmp_path))
    monkeypatch.delenv("OPFUSE_DUMP_DIR", raising=False)
    return reg


def _reproduce_command(err: str) -> list[str]:
    (line,) = [ln for ln in err.splitlines() if "reproduce with:" in ln]
    argv = shlex.split(line.split("reproduce with:", 1)[1])
    assert argv[0] == "fuse-opt"
    return argv[1:]


@pytest.mark.parametrize("planted_pass, first_line", [
    ("test-explode", "error: internal error in pass 'test-explode': RuntimeError: planted "
                     "failure: cannot handle math.exp"),
    ("test-break-ir", "error: internal error: pass 'test-break-ir' produced invalid IR"),
])
def test_planted_failure_writes_a_reproducer_that_fails_the_same_way(
        planted, tmp_path, capsys, planted_pass, first_line):
    pipeline = f"builtin.module(opfuse-fuse-elementwise,{planted_pass},opfuse-outline)"
    assert fuse_opt.main([str(G3), f"--pass-pipeline={pipeline}"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == first_line
    assert "Traceback" not in err
    argv = _reproduce_command(err)
    # the files the message points at: the input as it was, the pipeline, the command
    repro = Path(argv[-1]).parent
    assert repro.parent == tmp_path and repro.name.startswith("repro-")
    assert (repro / "00-input.mlir").read_text().count("linalg.generic") == 5  # G3, unfused
    assert (repro / "pipeline.txt").read_text().strip() == pipeline
    assert f"--pass-pipeline={pipeline}" in (repro / "reproduce.sh").read_text().replace("'", "")
    if planted_pass == "test-explode":
        assert "RuntimeError: planted failure" in (repro / "traceback.txt").read_text()

    # the printed command, run again, fails the same way
    assert fuse_opt.main(argv) == 2
    again = capsys.readouterr().err
    assert again.splitlines()[0] == first_line
    # ... and only because of the planted pass: without it the saved input is fine
    good = pipeline.replace(f",{planted_pass}", "")
    assert fuse_opt.main([*argv[:-2], f"--pass-pipeline={good}", argv[-1]]) == 0
    capsys.readouterr()


def test_planted_failure_in_a_dumped_run_keeps_the_stages_before_it(planted, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    pipeline = "builtin.module(opfuse-fuse-elementwise,opfuse-fuse-reduction,test-explode)"
    assert fuse_opt.main([str(G3), f"--pass-pipeline={pipeline}", "--dump-dir", str(dumps)]) == 2
    err = capsys.readouterr().err
    (run,) = dumps.iterdir()
    assert re.fullmatch(r"g3_softmax-\d+-\d+", run.name)
    assert sorted(p.name for p in run.iterdir()) == [
        "00-input.mlir", "01-opfuse-fuse-elementwise.mlir", "02-opfuse-fuse-reduction.mlir",
        "ledger.json", "pipeline.txt", "reproduce.sh", "traceback.txt"]
    assert json.loads((run / "ledger.json").read_text())  # the decisions made before it
    assert str(run / "00-input.mlir") in err


def test_dump_dir_names_never_collide(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPFUSE_DUMP_DIR", raising=False)
    for _ in range(3):
        assert fuse_opt.main([str(G2), "--dump-dir", str(tmp_path), "-o", str(tmp_path / "out.mlir")]) == 0
    runs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(runs) == 3 and len(set(runs)) == 3
    files = sorted(p.name for p in (tmp_path / runs[0]).iterdir())
    from opfuse.pipeline import DEFAULT_PIPELINE

    stages = [f"{i:02d}-{name}.mlir" for i, name in enumerate(DEFAULT_PIPELINE, 1)]
    assert files == ["00-input.mlir", *stages, "ledger.json", "pipeline.txt"]
    assert stages[0] == "01-opfuse-fold-unit-dims.mlir" and stages[-1].endswith("-opfuse-outline.mlir")
    ledger = json.loads((tmp_path / runs[0] / "ledger.json").read_text())
    assert [d["step"] for d in ledger] == [1, 2, 3, 4, 5]


def test_fuse_run_dumps_both_programs_and_their_cpu_modules(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPFUSE_DUMP_DIR", str(tmp_path))  # the default for --dump-dir
    src = tmp_path / "small.mlir"
    from opfuse.frontends.builder.graphs import graphs

    src.write_text(graphs(small=True)["g2_elementwise_chain"].to_mlir())
    assert fuse_run.main([str(src), "--repeat=0"]) == 0
    capsys.readouterr()
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run.name.startswith("small-fuse-run-")
    (fused,) = (run / "fused").iterdir()
    (unfused,) = (run / "unfused").iterdir()
    assert sorted(p.name for p in unfused.iterdir()) == [
        "00-input.mlir", "01-opfuse-outline.mlir", "02-cpu.mlir", "ledger.json", "pipeline.txt"]
    from opfuse.pipeline import DEFAULT_PIPELINE

    cpu_stage = f"{len(DEFAULT_PIPELINE) + 1:02d}-cpu.mlir"
    names = sorted(p.name for p in fused.iterdir())
    assert names[-3:] == [cpu_stage, "ledger.json", "pipeline.txt"]
    assert "llvm.func" in (fused / cpu_stage).read_text()


def test_fuse_run_report_dir(tmp_path, capsys):
    src = tmp_path / "small.mlir"
    from opfuse.frontends.builder.graphs import graphs
    from opfuse.report import schema

    src.write_text(graphs(small=True)["g2_elementwise_chain"].to_mlir())
    out = tmp_path / "report"
    assert fuse_run.main([str(src), "--repeat=0", "--report", str(out), "--target", "sm_80"]) == 0
    assert f"report: {out / 'report.html'} (and report.json, report.txt)" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert schema.validate(report) == []
    assert report["source"] == str(src) and report["estimate"]["target"] == "sm_80"
    assert (out / "report.txt").read_text().startswith("kernels: 6 -> 1")
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert fuse_run.main([str(src), "--report", "html"]) == 1
    assert "--report DIR writes DIR/report.html" in capsys.readouterr().err
