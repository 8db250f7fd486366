"""Fusion fuel (``--fusion-fuel=N``: only the first N fusions are applied) and
``fuse-run --bisect`` (the first fusion that changes results beyond the tolerance).

The wrong fusion the bisection must find is planted honestly: a test-only stand-in for
opfuse-fuse-elementwise runs the real pass and then, only if the op ``planted.add`` was
fused into a group, rewrites that op's payload (``addf`` -> ``subf``), the way a
miscompiled fused kernel would compute something else. Unfused, or with too little fuel
for that merge, the program is right; from that merge on it is wrong.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from mlir import ir
from mlir.dialects import arith

from opfuse import passes
from opfuse.analysis.graph import GROUP_ATTR, functions, op_label
from opfuse.analysis import ledger as ledger_mod
from opfuse.tools import fuse_opt, fuse_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
G1 = EXAMPLES / "g1_mlp.mlir"
G6 = EXAMPLES / "g6_encoder_layer.mlir"

PLANTED = "planted.add"
CHAIN = """\
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @chain(%x: tensor<64x64xf32> loc("x"), %y: tensor<64x64xf32> loc("y")) -> tensor<64x64xf32> {
  %e = tensor.empty() : tensor<64x64xf32>
  %0 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %y : tensor<64x64xf32>, tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<64x64xf32> loc("first.mul")
  %1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%0 : tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  } -> tensor<64x64xf32> loc("second.exp")
  %2 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%1, %y : tensor<64x64xf32>, tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<64x64xf32> loc("planted.add")
  %3 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%2 : tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.negf %a : f32
    linalg.yield %r : f32
  } -> tensor<64x64xf32> loc("last.neg")
  return %3 : tensor<64x64xf32>
}
"""


# --- the planted miscompilation ---------------------------------------------------------------


def _corrupt_planted(module: ir.Module, only_if_fused: bool) -> None:
    """``addf`` -> ``subf`` in the payload of the op labelled ``planted.add``."""
    with module.context:
        for func_op in functions(module):
            for op in func_op.regions[0].blocks[0].operations:
                op = op.operation
                if op_label(op) != PLANTED or (only_if_fused and GROUP_ATTR not in op.attributes):
                    continue
                body = op.regions[0].blocks[0]
                addf = next(o.operation for o in body.operations if o.operation.name == "arith.addf")
                with ir.InsertionPoint(addf), addf.location:
                    sub = arith.SubFOp(addf.operands[0], addf.operands[1])
                addf.results[0].replace_all_uses_with(sub.result)
                addf.erase()


def _planted_registry(only_if_fused: bool = True):
    real = passes.registry()
    elementwise = real["opfuse-fuse-elementwise"]

    def run(module, options):
        elementwise.run(module, options)
        _corrupt_planted(module, only_if_fused)

    fake = types.ModuleType("planted_fuse_elementwise")
    fake.__doc__ = elementwise.__doc__
    fake.NAME, fake.Options, fake.run = elementwise.NAME, elementwise.Options, run
    return {**real, fake.NAME: fake}


@pytest.fixture
def chain(tmp_path) -> Path:
    path = tmp_path / "chain.mlir"
    path.write_text(CHAIN)
    return path


@pytest.fixture
def planted(monkeypatch):
    """The fused program goes wrong from the merge that puts planted.add in a group."""
    reg = _planted_registry(only_if_fused=True)
    monkeypatch.setattr(passes, "registry", lambda: reg)


# --- fuel --------------------------------------------------------------------------------------


def test_ledger_fuel_counts_and_runs_out():
    led = ledger_mod.Ledger(fuel=2)
    assert [led.spend_fuel() for _ in range(3)] == [1, 2, None]
    assert led.fuel_refusal() == ("fusion fuel exhausted (2 applied)", "fusion-fuel >= 3")
    assert ledger_mod.Ledger().fuel is None  # no limit
    with ledger_mod.fuel_limit(5):
        assert ledger_mod.Ledger().fuel == 5  # every run in the block gets its own 5
        assert ledger_mod.Ledger(fuel=1).fuel == 1
    assert ledger_mod.spend_fuel() == 0  # no ledger collecting: apply, unnumbered


def _json_report(tmp_path, source, *args) -> dict:
    out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
    assert fuse_opt.main([str(source), "--opfuse-report=json", "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_fuel_applies_only_the_first_fusions(tmp_path):
    full = _json_report(tmp_path, G1)
    applied = [d for d in full["decisions"] if d["fused"]]
    assert [d["step"] for d in applied] == list(range(1, 19))
    kernels = []
    for fuel in (0, 1, 5, 17, 18, 19):
        r = _json_report(tmp_path, G1, f"--fusion-fuel={fuel}")
        kernels.append(r["totals"]["after"]["kernels"])
        fused = [d for d in r["decisions"] if d["fused"]]
        assert [d["step"] for d in fused] == list(range(1, min(fuel, 18) + 1))
        # the first N fusions are the full run's first N
        key = lambda d: (d["pass_name"], d["producer"], d["consumer"])  # noqa: E731
        assert [key(d) for d in fused] == [key(d) for d in applied[: len(fused)]]
        starved = [d for d in r["decisions"] if d["reason"].startswith("fusion fuel exhausted")]
        assert all(not d["fused"] and d["step"] is None for d in starved)
        assert all(d["would_fuse_with"] == f"fusion-fuel >= {fuel + 1}" for d in starved)
        assert bool(starved) == (fuel < 18)
    assert kernels[0] == full["totals"]["before"]["kernels"] == 20  # no fusion at all
    assert kernels == sorted(kernels, reverse=True)
    assert kernels[-2:] == [2, 2]


def test_a_duplication_is_one_fusion(tmp_path):
    full = _json_report(tmp_path, G6)
    dups = [d for d in full["decisions"] if d["action"] == "duplicate" and d["fused"]]
    assert len(dups) == 3 and len({d["step"] for d in dups}) == 1
    step = dups[0]["step"]
    before = _json_report(tmp_path, G6, f"--fusion-fuel={step - 1}")
    refused = [d for d in before["decisions"] if d["action"] == "duplicate"]
    assert len(refused) == 3 and not any(d["fused"] for d in refused)
    assert all("fusion fuel exhausted" in d["reason"] for d in refused)
    at = _json_report(tmp_path, G6, f"--fusion-fuel={step}")
    assert [d["fused"] for d in at["decisions"] if d["action"] == "duplicate"] == [True] * 3


def test_fuse_run_with_no_fuel_runs_the_unfused_program(chain, capsys):
    assert fuse_run.main([str(chain), "--fusion-fuel=0", "--repeat=0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fused"]["kernels"] == doc["unfused"]["kernels"] == 4


# --- bisection --------------------------------------------------------------------------------


def test_the_planted_fusion_breaks_results_only_once_applied(chain, planted, capsys):
    """What the bisection relies on, checked directly: fuel 1 agrees, fuel 2 does not."""
    assert fuse_run.main([str(chain), "--fusion-fuel=1", "--repeat=0"]) == 0
    assert fuse_run.main([str(chain), "--fusion-fuel=2", "--repeat=0"]) == fuse_run.EXIT_MISMATCH
    assert fuse_run.main([str(chain), "--repeat=0"]) == fuse_run.EXIT_MISMATCH
    capsys.readouterr()


def test_bisect_names_the_planted_wrong_fusion(chain, planted, capsys):
    assert fuse_run.main([str(chain), "--bisect"]) == fuse_run.EXIT_MISMATCH
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert "fusions applied by the full pipeline: 3" in lines
    found = "first fusion that changes the results beyond the tolerance: #2 of 3"
    culprit = lines[lines.index(found) + 1]
    assert culprit.startswith(
        "  decision planted.add: fused #2 [fuse-elementwise] second.exp -> planted.add:")
    assert f"reproduce: fuse-run {chain} --fusion-fuel=2 (differs), --fusion-fuel=1 (agrees)" in lines
    # trials: all, 0, then the search; no more programs than a binary search needs
    trials = [ln.split(":")[0].split()[-1] for ln in lines if ln.startswith("  fuel ")]
    assert trials == ["all", "0", "1", "2"]  # the full run, fuel 0, then a binary search
    assert err.startswith("error: fusion #2 changes the results beyond the tolerance: "
                          "[opfuse-fuse-elementwise] second.exp -> planted.add at planted.add")


def test_bisect_as_json(chain, planted, capsys):
    assert fuse_run.main([str(chain), "--bisect", "--json"]) == fuse_run.EXIT_MISMATCH
    doc = json.loads(capsys.readouterr().out)
    assert doc["fusions"] == 3 and doc["first_bad_fusion"] == 2
    assert [(d["producer"], d["consumer"]) for d in doc["decisions"]] == [("second.exp", PLANTED)]
    assert {"fuel": None, "ok": False} in doc["trials"] and {"fuel": 1, "ok": True} in doc["trials"]


def test_bisect_when_every_fusion_is_right(chain, capsys):
    assert fuse_run.main([str(chain), "--bisect"]) == 0
    out = capsys.readouterr().out
    assert "all 3 fusions keep the outputs within the tolerance" in out


def test_bisect_blames_no_fusion_for_a_difference_without_fusion(chain, monkeypatch, capsys):
    reg = _planted_registry(only_if_fused=False)  # wrong whether fused or not
    monkeypatch.setattr(passes, "registry", lambda: reg)
    assert fuse_run.main([str(chain), "--bisect"]) == fuse_run.EXIT_MISMATCH
    out, err = capsys.readouterr()
    assert "the outputs differ with no fusion applied (fuel 0)" in out
    assert "differ even with --fusion-fuel=0" in err


def test_bisect_dumps_every_trial(chain, planted, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    fuse_run.main([str(chain), "--bisect", "--dump-dir", str(dumps)])
    capsys.readouterr()
    (run,) = dumps.iterdir()
    # the full run, fuel 0, then the search: 1 agrees, 2 does not
    assert {p.name for p in run.iterdir()} == {"unfused", "fused", "fuel-0", "fuel-1", "fuel-2"}
    (trial,) = (run / "fuel-1").iterdir()
    ledger = json.loads((trial / "ledger.json").read_text())
    assert [d["step"] for d in ledger if d["fused"]] == [1]
    assert any(p.name.endswith("-cpu.mlir") for p in trial.iterdir())


@pytest.mark.parametrize("extra", [["--fusion-fuel=2"], ["--report=text"], ["--save-outputs", "x"]])
def test_bisect_refuses_flags_it_would_ignore(chain, capsys, extra):
    assert fuse_run.main([str(chain), "--bisect", *extra]) == 1
    assert "--bisect chooses the fuel itself" in capsys.readouterr().err
