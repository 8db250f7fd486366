"""opfuse.pipeline with fake passes: parsing, printing, options, defaults, running, dumps,
error wrapping; plus the report renderer and fuse-opt's exit codes."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlir import ir

from opfuse import ir as oir
from opfuse import passes, pipeline
from opfuse.errors import OpfuseError
from opfuse.pipeline import DEFAULT_PIPELINE, OpfuseStep, Pipeline, UpstreamStep
from opfuse.analysis import ledger as ledger_mod
from opfuse.report import render

INPUT = """\
func.func @f(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %0 = linalg.add ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %1 = linalg.add ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %2 = linalg.mul ins(%0, %1 : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
"""


# --- fake passes ------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardOpts:
    delta: float = 0.1
    r_limit: int = 0
    target: str = "sm_90"
    enabled: bool = True


@dataclass(frozen=True)
class NoOpts:
    pass


@dataclass(frozen=True)
class OutlineOpts:
    prefix: str = "fusion"
    max_duplicates: int = 8


RAN: list[tuple[str, object]] = []


def _tagger(name: str):
    def run(module: ir.Module, options) -> None:
        RAN.append((name, options))
        with module.context:
            for op in module.body.operations:
                op.operation.attributes[f"test.{name.replace('-', '_')}"] = ir.UnitAttr.get()
        ledger_mod.record(
            ledger_mod.Decision(name, "%0", "%2", "in.mlir:5:8", True, "saving 0.50 > delta 0.10")
        )

    return run


def _crash(module, options):
    raise KeyError("boom")


def _user_error(module, options):
    raise OpfuseError("dynamic shapes are not supported yet", diagnostics=["in.mlir:2:3: error: dynamic dim"])


def _break_ir(module, options):
    func_op = module.body.operations[0]
    list(func_op.regions[0].blocks[0].operations)[-1].erase()  # the return


def _module(name: str, opts: type, run) -> types.ModuleType:
    mod = types.ModuleType(f"fake_{name}")
    mod.__doc__ = f"{name}: a fake pass for tests."
    mod.NAME, mod.Options, mod.run = name, opts, run
    return mod


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch):
    RAN.clear()
    reg = {
        "opfuse-fold-unit-dims": _module("opfuse-fold-unit-dims", NoOpts, _tagger("opfuse-fold-unit-dims")),
        "opfuse-fuse-elementwise": _module("opfuse-fuse-elementwise", GuardOpts, _tagger("opfuse-fuse-elementwise")),
        "opfuse-fuse-producer-consumer": _module("opfuse-fuse-producer-consumer", GuardOpts, _tagger("opfuse-fuse-producer-consumer")),
        "opfuse-fuse-reduction": _module("opfuse-fuse-reduction", GuardOpts, _tagger("opfuse-fuse-reduction")),
        "opfuse-fuse-columns": _module("opfuse-fuse-columns", GuardOpts, _tagger("opfuse-fuse-columns")),
        "opfuse-fuse-column-sums": _module("opfuse-fuse-column-sums", GuardOpts, _tagger("opfuse-fuse-column-sums")),
        "opfuse-fuse-scan": _module("opfuse-fuse-scan", GuardOpts, _tagger("opfuse-fuse-scan")),
        "opfuse-fuse-epilogue": _module("opfuse-fuse-epilogue", GuardOpts, _tagger("opfuse-fuse-epilogue")),
        "opfuse-fuse-horizontal": _module("opfuse-fuse-horizontal", GuardOpts, _tagger("opfuse-fuse-horizontal")),
        "opfuse-fuse-attention": _module("opfuse-fuse-attention", GuardOpts, _tagger("opfuse-fuse-attention")),
        "opfuse-fuse-grouped": _module("opfuse-fuse-grouped", GuardOpts, _tagger("opfuse-fuse-grouped")),
        "opfuse-fuse-recompute": _module("opfuse-fuse-recompute", GuardOpts, _tagger("opfuse-fuse-recompute")),
        "opfuse-outline": _module("opfuse-outline", OutlineOpts, _tagger("opfuse-outline")),
        "test-crash": _module("test-crash", OutlineOpts, _crash),
        "test-user-error": _module("test-user-error", OutlineOpts, _user_error),
        "test-break-ir": _module("test-break-ir", OutlineOpts, _break_ir),
    }
    monkeypatch.setattr(passes, "registry", lambda: reg)
    monkeypatch.delenv("OPFUSE_DUMP_DIR", raising=False)
    monkeypatch.delenv("OPFUSE_DEBUG", raising=False)
    return reg


def _input() -> ir.Module:
    return oir.parse_module(INPUT, filename="in.mlir")


# --- parse / print ------------------------------------------------------------------------


def test_parse_mixes_opfuse_and_upstream_and_round_trips():
    text = "builtin.module(opfuse-fuse-elementwise{delta=0.2 r-limit=32},canonicalize,func.func(cse),opfuse-outline)"
    p = Pipeline.parse(text)
    assert [type(s) for s in p.steps] == [OpfuseStep, UpstreamStep, OpfuseStep]
    assert p.steps[1].elements == ("canonicalize", "func.func(cse)")
    assert p.steps[0].options == GuardOpts(delta=0.2, r_limit=32)
    assert p.names == ["opfuse-fuse-elementwise", "canonicalize", "func.func", "opfuse-outline"]
    assert str(p) == text
    assert Pipeline.parse(str(p)) == p


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("", "builtin.module()"),
        ("builtin.module()", "builtin.module()"),
        ("opfuse-outline", "builtin.module(opfuse-outline)"),  # the anchor may be left out
        # defaults are not printed; fields print in declaration order
        ("builtin.module(opfuse-fuse-elementwise{target=sm_80 delta=0.1})",
         "builtin.module(opfuse-fuse-elementwise{target=sm_80})"),
        # comma separators and snake_case keys are accepted
        ("builtin.module(opfuse-fuse-reduction{r_limit=64,delta=0.5})",
         "builtin.module(opfuse-fuse-reduction{delta=0.5 r-limit=64})"),
        ("builtin.module( canonicalize{max-iterations=3} , opfuse-outline{max-duplicates=0x10})",
         "builtin.module(canonicalize{max-iterations=3},opfuse-outline{max-duplicates=16})"),
        ("builtin.module(opfuse-fuse-elementwise{enabled})", "builtin.module(opfuse-fuse-elementwise)"),
        ("builtin.module(opfuse-fuse-elementwise{enabled=false})",
         "builtin.module(opfuse-fuse-elementwise{enabled=false})"),
        ('builtin.module(opfuse-outline{prefix="my kernel"})', 'builtin.module(opfuse-outline{prefix="my kernel"})'),
    ],
)
def test_canonical_text(text, canonical):
    p = Pipeline.parse(text)
    assert str(p) == canonical
    assert str(Pipeline.parse(canonical)) == canonical


def test_option_values_are_typed():
    step = Pipeline.parse("opfuse-fuse-elementwise{delta=1 r-limit=32 target=sm_80 enabled=off}").steps[0]
    opts = step.options
    assert (opts.delta, opts.r_limit, opts.target, opts.enabled) == (1.0, 32, "sm_80", False)
    assert isinstance(opts.delta, float) and isinstance(opts.r_limit, int)


@pytest.mark.parametrize(
    "text, message",
    [
        ("opfuse-fuse-elementwise{bogus=1}", "unknown option 'bogus' for opfuse-fuse-elementwise; valid options: delta=0.1 (float), r-limit=0 (int)"),
        ("opfuse-fuse-elementwise{delta=abc}", "invalid value 'abc' for option 'delta' of opfuse-fuse-elementwise: expected float"),
        ("opfuse-fuse-elementwise{r-limit=1.5}", "expected int"),
        ("opfuse-fuse-elementwise{enabled=maybe}", "expected bool"),
        ("opfuse-fuse-elementwise{delta}", "option 'delta' of opfuse-fuse-elementwise needs a value"),
        ("builtin.module(no-such-pass)", "'no-such-pass' does not refer to a registered pass"),
        ("builtin.module(canonicalize{no-such-option=1})", "no such option no-such-option"),
        ("builtin.module(func.func(opfuse-outline))", "opfuse pass 'opfuse-outline' runs on the whole module"),
        ("builtin.module(opfuse-outline(cse))", "takes options in {...}"),
        ("builtin.module(cse", "pass pipeline"),
        ("builtin.module(cse,,cse)", "empty element"),
        ("builtin.module(cse))", "unbalanced"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(OpfuseError) as info:
        Pipeline.parse(text)
    assert message in str(info.value)
    assert info.value.exit_code == 1


def test_unknown_upstream_pass_lists_opfuse_passes():
    with pytest.raises(OpfuseError, match="opfuse passes: opfuse-fold-unit-dims, opfuse-fuse-elementwise"):
        Pipeline.parse("builtin.module(opfuse-fuse-elmentwise)")


# --- default ------------------------------------------------------------------------------


def test_default_is_the_declared_order():
    assert Pipeline.default().names == list(DEFAULT_PIPELINE)
    assert str(Pipeline.default()) == f"builtin.module({','.join(DEFAULT_PIPELINE)})"


def test_default_disable_and_shared_options():
    p = Pipeline.default(disable=["opfuse-fuse-reduction"], delta=0.25, r_limit="64", target="sm_80")
    assert "opfuse-fuse-reduction" not in p.names
    guards = [s.options for s in p.steps if s.name not in ("opfuse-fold-unit-dims", "opfuse-outline")]
    assert all(o == GuardOpts(delta=0.25, r_limit=64, target="sm_80") for o in guards)
    # an option applies only where the pass has it
    assert p.steps[-1].options == OutlineOpts()
    assert Pipeline.default(max_duplicates=2).steps[-1].options.max_duplicates == 2
    # kebab-case keys work too
    assert Pipeline.default(**{"r-limit": 7}).steps[1].options.r_limit == 7


def test_default_errors():
    with pytest.raises(OpfuseError, match="cannot disable opfuse-nope: not in the default pipeline"):
        Pipeline.default(disable=["opfuse-nope"])
    with pytest.raises(OpfuseError, match="unknown option 'bogus' for the default pipeline; valid options: .*delta"):
        Pipeline.default(bogus=1)
    with pytest.raises(OpfuseError, match="expected float"):
        Pipeline.default(delta="lots")
    with pytest.raises(OpfuseError, match="expected int"):
        Pipeline.default(r_limit=True)


# --- editing --------------------------------------------------------------------------------


def test_append_insert_remove():
    p = Pipeline.parse("builtin.module(opfuse-fuse-elementwise)")
    p.append("canonicalize").append(pipeline.make_step("opfuse-outline", prefix="k"))
    p.insert(0, pipeline.upstream("func.func(cse)"))
    assert str(p) == 'builtin.module(func.func(cse),opfuse-fuse-elementwise,canonicalize,opfuse-outline{prefix=k})'
    p.remove("canonicalize").remove("func.func")
    assert p.names == ["opfuse-fuse-elementwise", "opfuse-outline"]
    with pytest.raises(OpfuseError, match="no pass 'cse'"):
        p.remove("cse")
    with pytest.raises(OpfuseError, match="unknown opfuse pass"):
        pipeline.make_step("opfuse-nope")
    with pytest.raises(OpfuseError, match="does not refer to a registered pass"):
        pipeline.upstream("nope")


# --- running --------------------------------------------------------------------------------


def test_run_in_order_with_ledger():
    module = _input()
    p = Pipeline.parse("builtin.module(opfuse-fuse-elementwise{delta=0.3},func.func(cse),opfuse-outline)")
    led = p.run(module)
    assert [name for name, _ in RAN] == ["opfuse-fuse-elementwise", "opfuse-outline"]
    assert RAN[0][1].delta == 0.3
    assert [d.pass_name for d in led.decisions] == ["opfuse-fuse-elementwise", "opfuse-outline"]
    text = oir.print_module(module)
    assert "test.opfuse_outline" in text
    assert text.count("linalg.add") == 1  # cse ran
    # a given ledger is appended to, and returned
    mine = ledger_mod.Ledger()
    assert Pipeline.parse("opfuse-outline").run(_input(), ledger=mine) is mine
    assert len(mine.decisions) == 1


def test_dumps(tmp_path):
    p = Pipeline.parse("builtin.module(opfuse-fuse-elementwise,canonicalize,func.func(cse))")
    p.run(_input(), dump_dir=tmp_path)
    p.run(_input(), dump_dir=tmp_path)
    runs = sorted(tmp_path.iterdir())
    assert len(runs) == 2 and all(r.name.startswith("in-") for r in runs)
    files = sorted(f.name for f in runs[0].iterdir())
    assert files == ["00-input.mlir", "01-opfuse-fuse-elementwise.mlir", "02-canonicalize+func.func.mlir",
                     "ledger.json", "pipeline.txt"]
    assert (runs[0] / "pipeline.txt").read_text() == f"{p}\n"
    assert json.loads((runs[0] / "ledger.json").read_text())[0]["pass_name"] == "opfuse-fuse-elementwise"
    step = (runs[0] / "01-opfuse-fuse-elementwise.mlir").read_text()
    assert "test.opfuse_fuse_elementwise" in step and 'loc("in.mlir"' in step
    # a dump parses back
    oir.parse_module(step, filename="again.mlir")


def test_dump_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_DUMP_DIR", str(tmp_path / "env"))
    Pipeline.parse("opfuse-outline").run(_input(), name="<stdin>")
    (run,) = (tmp_path / "env").iterdir()
    assert run.name.startswith("stdin-")
    assert (run / "01-opfuse-outline.mlir").exists()


def test_pass_crash_is_internal_error_with_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_TEMP_DIR", str(tmp_path))  # where the reproducer goes
    p = Pipeline.parse("builtin.module(opfuse-fuse-elementwise,test-crash)")
    with pytest.raises(OpfuseError) as info:
        p.run(_input())
    e = info.value
    assert e.exit_code == 2
    assert "internal error in pass 'test-crash': KeyError: 'boom'" in str(e)
    note = next(d for d in e.diagnostics if "reproduce with:" in d)
    folder = Path(note.rsplit(" ", 1)[-1].strip("'")).parent
    assert folder.parent == tmp_path and folder.name.startswith("repro-")
    assert "module {" in (folder / "00-input.mlir").read_text()
    assert (folder / "pipeline.txt").read_text().strip() == str(p)
    assert "KeyError" in (folder / "traceback.txt").read_text()
    assert "--pass-pipeline=" in (folder / "reproduce.sh").read_text()


def test_invalid_ir_is_internal_error_with_location():
    with pytest.raises(OpfuseError) as info:
        Pipeline.parse("test-break-ir").run(_input())
    e = info.value
    assert e.exit_code == 2
    assert "pass 'test-break-ir' produced invalid IR" in str(e)
    assert any(d.startswith("in.mlir:") and ": error: " in d for d in e.diagnostics)
    assert all("\n" not in d for d in e.diagnostics)


def test_user_error_from_pass_passes_through(tmp_path):
    with pytest.raises(OpfuseError) as info:
        Pipeline.parse("builtin.module(opfuse-outline,test-user-error)").run(_input(), dump_dir=tmp_path)
    e = info.value
    assert e.exit_code == 1 and str(e) == "dynamic shapes are not supported yet"
    assert e.diagnostics[0] == "in.mlir:2:3: error: dynamic dim"
    # a dumped run keeps the steps done so far, their ledger, and a reproducer
    (run,) = tmp_path.iterdir()
    assert (run / "01-opfuse-outline.mlir").exists()
    assert len(json.loads((run / "ledger.json").read_text())) == 1
    assert (run / "reproduce.sh").exists()


def test_upstream_failure_has_locations():
    text = """\
func.func @f(%t: tensor<4xf32>, %n: index) -> tensor<4xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%a = %t) -> tensor<4xf32> {
    %e = tensor.empty() : tensor<4xf32>
    scf.yield %e : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}
"""
    p = Pipeline.parse("builtin.module(canonicalize,one-shot-bufferize{bufferize-function-boundaries})")
    with pytest.raises(OpfuseError) as info:
        p.run(oir.parse_module(text, filename="c.mlir"))
    e = info.value
    assert e.exit_code == 1
    assert str(e) == "pass 'canonicalize,one-shot-bufferize{bufferize-function-boundaries}' failed"
    assert e.diagnostics[0] == "c.mlir:6:5: error: Yield operand #0 is not equivalent to the corresponding iter bbArg"


def test_clone_module_is_independent():
    module = _input()
    copy = pipeline.clone_module(module)
    Pipeline.parse("opfuse-outline").run(module)
    assert "test.opfuse_outline" not in oir.print_module(copy)
    assert oir.print_module(copy) != oir.print_module(module)


# --- report rendering -------------------------------------------------------------------------


REPORT = {
    "totals": {
        "before": {"kernels": 8, "bytes": 12 * 2**20, "flops": 1_050_000},
        "after": {"kernels": 1, "bytes": 4 * 2**20, "flops": 1_050_000},
        "launches_saved": 7,
        "bytes_saved": 8 * 2**20,
    },
    "kernels": [{"name": "fusion_0_loop", "kind": "loop", "members": 3, "flops": 1_050_000,
                 "bytes": 4 * 2**20, "ai": 0.25, "regs": 19}],
    "decisions": [ledger_mod.Decision("opfuse-fuse-elementwise", "%0", "%1", "in.mlir:4:8", False,
                                      "saving 0.04 <= delta 0.10", would_fuse_with="delta < 0.04").to_json()],
}


def test_render_text():
    assert render.render(REPORT, "text").splitlines() == [
        "kernels: 8 -> 1 (7 launches saved)",
        "bytes: 12.0 MiB -> 4.0 MiB (-66.7%)",
        "flops: 1.05 MFLOP -> 1.05 MFLOP",
        "kernel fusion_0_loop: kind=loop members=3 flops=1.05 MFLOP bytes=4.0 MiB ai=0.25 regs=19",
        "decision in.mlir:4:8: not fused [fuse-elementwise] %0 -> %1: saving 0.04 <= delta 0.10"
        " (would fuse with delta < 0.04)",
    ]


def test_render_json_round_trips():
    assert json.loads(render.render(REPORT, "json")) == REPORT
    with pytest.raises(ValueError, match="unknown report format"):
        render.render(REPORT, "xml")


def test_build_report_uses_the_cost_model(monkeypatch):
    from opfuse.report import summary

    @dataclass
    class Totals:
        kernels: int
        bytes: int
        flops: int

    fake_tables = types.SimpleNamespace(
        module_totals=lambda m: Totals(3, 144, 12) if "test.opfuse_outline" not in oir.print_module(m) else Totals(1, 48, 12),
        kernel_rows=lambda m: [{"name": "fusion_0_loop", "kind": "loop", "members": 3}],
    )
    import opfuse.report

    monkeypatch.setattr(opfuse.report, "tables", fake_tables, raising=False)
    monkeypatch.setitem(sys.modules, "opfuse.report.tables", fake_tables)
    before = _input()
    after = pipeline.clone_module(before)
    led = Pipeline.parse("opfuse-outline").run(after)
    report = summary.build_report(before, after, led)
    assert report["totals"] == {"before": {"kernels": 3, "bytes": 144, "flops": 12},
                                "after": {"kernels": 1, "bytes": 48, "flops": 12},
                                "launches_saved": 2, "bytes_saved": 96}
    assert report["decisions"][0]["pass_name"] == "opfuse-outline"
    assert render.render_text(report).startswith("kernels: 3 -> 1 (2 launches saved)\nbytes: 144 B -> 48 B (-66.7%)")


# --- fuse-opt exit codes ---------------------------------------------------------------------------


def _fuse_opt(tmp_path, *args):
    from opfuse.tools import fuse_opt

    src = tmp_path / "in.mlir"
    src.write_text(INPUT)
    return fuse_opt.main([str(src), *args])


def test_fuse_opt_internal_error_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPFUSE_TEMP_DIR", str(tmp_path))
    assert _fuse_opt(tmp_path, "--pass-pipeline=builtin.module(test-crash)") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("error: internal error in pass 'test-crash': KeyError: 'boom'\n")
    assert "note: reproduce with: fuse-opt" in err


def test_fuse_opt_pass_flags_in_command_line_order(tmp_path, capsys):
    assert _fuse_opt(tmp_path, "--opfuse-outline", "--opfuse-fuse-elementwise=delta=0.2,r-limit=32",
                     "--opfuse-remarks") == 0
    assert [name for name, _ in RAN] == ["opfuse-outline", "opfuse-fuse-elementwise"]
    assert RAN[1][1] == GuardOpts(delta=0.2, r_limit=32)
    out, err = capsys.readouterr()
    assert "test.opfuse_outline" in out
    assert err.count("remark: [opfuse-") == 2


def test_fuse_opt_default_pipeline_with_disable(tmp_path, capsys):
    assert _fuse_opt(tmp_path, "--disable-pass=opfuse-fuse-reduction", "--disable-pass", "opfuse-outline") == 0
    assert [name for name, _ in RAN] == ["opfuse-fold-unit-dims", "opfuse-fuse-elementwise",
                                         "opfuse-fuse-producer-consumer", "opfuse-fuse-columns",
                                         "opfuse-fuse-scan",
                                         "opfuse-fuse-epilogue", "opfuse-fuse-column-sums",
                                         "opfuse-fuse-horizontal",
                                         "opfuse-fuse-recompute", "opfuse-fuse-attention",
                                         "opfuse-fuse-grouped"]
    assert _fuse_opt(tmp_path, "--disable-pass=opfuse-outline", "--opfuse-outline") == 1
    assert "--disable-pass applies to the default pipeline only" in capsys.readouterr().err


def test_fuse_opt_help_lists_passes_and_options(capsys):
    from opfuse.tools import fuse_opt

    assert fuse_opt.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--test-crash" in out and "max-duplicates=8 (int)" in out and "OPFUSE_DUMP_DIR" in out
