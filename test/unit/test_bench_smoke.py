"""The benchmark's smoke test: ``python -m bench --quick`` writes a document that matches
its schema, plus the markdown table and the charts. Benchmarks are not tests: no figure is
judged here, only that every one is present or says why not. Also the peers' kernel
counters on fixed text (no torch or jax needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a top-level folder, not part of the package
    sys.path.insert(0, str(ROOT))

from bench import schema  # noqa: E402
from bench.peers.kernels import count_inductor, count_xla  # noqa: E402


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "peers found:" in proc.stdout
    return out


def test_quick_run_matches_schema(quick_run: Path) -> None:
    doc = json.loads((quick_run / "bench.json").read_text())
    assert schema.validate(doc) == []
    assert doc["quick"] is True and doc["schema"] == "opfuse-bench/1"
    (g,) = doc["graphs"]
    assert g["kernels"]["after"] < g["kernels"]["before"]
    assert g["correctness"]["fused"]["ok"] and g["correctness"]["unfused"]["ok"]
    assert doc["summary"]["met"]["g2_speedup"]["not_available"]  # smoke sizes judge nothing


def test_quick_run_writes_table_and_charts(quick_run: Path) -> None:
    doc = json.loads((quick_run / "bench.json").read_text())
    table = (quick_run / "bench.md").read_text()
    assert "| g2_elementwise_chain |" in table
    charts = doc["files"]["charts"]
    if isinstance(charts, dict):  # matplotlib is a bench extra
        pytest.skip(charts["not_available"])
    for name in charts:
        assert (quick_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validator_rejects_missing_and_unexplained_figures() -> None:
    spec = {"a": schema.Fig("num"), "b": "int"}
    assert schema.validate({"a": {"not_available": "why"}, "b": 1}, spec) == []
    assert schema.validate({"a": {"not_available": ""}, "b": 1}, spec) != []
    assert schema.validate({"a": float("nan"), "b": 1}, spec) != []
    assert schema.validate({"a": 1.5}, spec) == ["$.b: missing"]
    assert schema.validate({"a": True, "b": 1}, spec) != []


def test_schema_md_documents_every_key() -> None:
    text = (ROOT / "bench" / "SCHEMA.md").read_text()
    keys = {p.rsplit(".", 1)[-1].removesuffix("[]") for p in schema.paths()}
    undocumented = sorted(k for k in keys if f"`{k}`" not in text)
    assert undocumented == []


INDUCTOR_CODE = """
cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], '''...''')
class Runner:
    def call(self, args):
        buf0 = empty_strided_cpu((8, 8), (8, 1), torch.float32)
        extern_kernels.addmm(arg1_1, arg0_1, arg2_1, alpha=1, beta=1, out=buf0)
        buf1 = buf0; del buf0
        cpp_fused_add_0(buf1, arg3_1)
        buf2 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf1, buf1, buf1)
        return (buf1, )
"""

HLO = """HloModule jit_f, is_scheduled=true

%fused_computation (param_0: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  ROOT %t = f32[4]{0} tanh(%param_0)
}

ENTRY %main.2 (x.1: f32[4,4], w.1: f32[4,4]) -> (f32[4,4], f32[4]) {
  %x.1 = f32[4,4]{1,0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[4,4]{1,0} parameter(1)
  %c = f32[] constant(0)
  %ynn_fusion = f32[4,4]{1,0} fusion(%x.1, %w.1), kind=kCustom, calls=%fused_computation
  %loop_fusion = f32[4]{0} fusion(%x.1), kind=kLoop, calls=%fused_computation
  %copy.1 = f32[4,4]{0,1} copy(%ynn_fusion)
  %b = f32[4,4]{1,0} bitcast(%copy.1)
  ROOT %tuple.1 = (f32[4,4]{1,0}, f32[4]{0}) tuple(%b, %loop_fusion)
}
"""


def test_inductor_kernel_count() -> None:
    k = count_inductor([INDUCTOR_CODE])
    assert (k["count"], k["generated"], k["extern"], k["fallback"]) == (3, 1, 1, 1)


def test_xla_kernel_count() -> None:
    k = count_xla(HLO)
    assert (k["count"], k["fusions"], k["other"]) == (3, 2, 1)
    assert k["fusion_kinds"] == {"kCustom": 1, "kLoop": 1}
    assert re.fullmatch(r"\{.*copy.*\}", json.dumps(k["opcodes"]))


def test_quick_run_estimates_the_matmul_kernels(quick_run: Path) -> None:
    """Per matmul and attention kernel, the H200 estimate next to the roofline, both
    variants, labelled as an estimate in the JSON and the table."""
    doc = json.loads((quick_run / "bench.json").read_text())
    section = doc["gpu_estimate"]
    assert section["method"].startswith("estimate, not a measurement")
    rows = section["kernels"]
    assert {r["variant"] for r in rows} == {"mma", "simt", "wgmma"}
    for r in rows:
        assert r["estimate_s"] >= r["roofline_s"] > 0 and 0 < r["occupancy"] <= 1
        assert r["blocks_per_sm"] >= 1 and r["flops"] > 0 and r["bytes"] > 0
    assert {(r["variant"], r["emitter"]) for r in rows} == {
        ("mma", "mma"), ("mma", "attention_mma"), ("simt", "matmul"), ("simt", "attention"),
        ("wgmma", "wgmma")}  # attention has no wgmma kernel: its mma row stands
    table = (quick_run / "bench.md").read_text()
    assert "## GPU matmul and attention kernels (estimates)" in table and "**estimates**" in table
