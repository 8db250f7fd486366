"""gpu-check's attention section (tools/gpu/gpu_check_attention.py) and f16 in its plan,
without a GPU.

Bundles prepared here at 1/16 size (batch and sequence; head dims kept, so the d128
cases build the 128-wide tensor-core kernel) for G1 and G5 in f16: the plan's entry for
G5 carries the attention cases, each with its tensor-core and SIMT bundle. Then the
check runs as on the device: its dry run (the CPU library stands in for the GPU), and
the stubbed driver with torch's CUDA calls stubbed too (test/unit/gpu_check_stub.py:
CPU torch computes SDPA, events, memsets and synchronizes are logged with the driver's
calls), which shows what is measured and how: every case checked against float64 and
against SDPA, opfuse's program and SDPA timed hot (many launches between one pair of
events) and cold (the L2 flushed before each), a synchronize after every kernel of the
correctness runs. A planted failing launch in one case's kernel names the kernel and
the case and makes the exit status non-zero while the other cases still run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_gpu_check import STUB, _gpu_check, timing_windows

TOOLS = Path(__file__).parents[2] / "tools" / "gpu"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import gpu_check_attention as gca  # noqa: E402
from gpu_check_prepare import MATMUL_GRAPHS, default_plan  # noqa: E402

KEY = "g5_attention.f16"
NAMES = [c[0] for c in gca.CASES]


def test_the_plan_has_every_matmul_graph_in_f16_with_its_simt_and_wgmma_variants():
    plan = {e["key"]: e for e in default_plan()}
    for g in MATMUL_GRAPHS:
        for dtype in ("bf16", "f16"):
            assert plan[f"{g}.{dtype}"]["variants"] == {
                "simt": {"matmul": "simt"},
                "wgmma": {"matmul": "wgmma", "targets": ["sm_90a"]}}
    keys = list(plan)
    # the tensor-core graphs first: bf16, then f16, then f32
    assert keys.index("g7_rmsnorm_swiglu.f16") < keys.index("g1_mlp.f32")
    assert keys.index("g7_rmsnorm_swiglu.bf16") < keys.index("g1_mlp.f16")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpu-check-attention")
    proc = _gpu_check("prepare", folder, "--graphs", "g1_mlp,g5_attention", "--dtypes", "f16",
                      "--scale", "16", "--no-pycuda", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


def test_prepare_writes_every_case_with_both_kernels(prepared):
    from opfuse.runtime import bundle

    spec = json.loads((prepared / "inputs.json").read_text())
    assert [e["key"] for e in spec["entries"]] == ["g1_mlp.f16", KEY]
    g1, g5 = spec["entries"]
    assert "attention" not in g1
    # the wgmma variant where a matmul kernel takes it; G5's one attention kernel does not
    assert set(g1["variants"]) == {"simt", "wgmma"} and set(g5["variants"]) == {"simt"}
    assert "wgmma" not in g5["bundles"] and not list(prepared.glob("g5_attention.*.wgmma.*"))
    cases = {c["name"]: c for c in g5["attention"]["cases"]}
    assert list(cases) == NAMES
    assert cases["g5"]["bundles"] == {"fused": "fused", "simt": "simt"}  # G5's own bundles
    assert (cases["gqa4_causal"]["heads"], cases["gqa4_causal"]["kv_heads"]) == (8, 2)
    assert cases["d128"]["dim"] == 128 and cases["d128"]["seq"] == 32
    for c in cases.values():
        for variant, emitter in (("fused", "attention_mma"), ("simt", "attention")):
            b = bundle.load(prepared / g5["bundles"][c["bundles"][variant]])
            (k,) = b.kernels.values()  # one kernel: the whole attention, GQA included
            assert k.emitter == emitter
            # the i64 iota >= iota mask is recognized as causal: the key loop ends at
            # the diagonal
            assert k.meta["causal"] == (0 if c["causal"] else None)
            assert k.meta["problem"][3] == c["dim"]
            assert b.manifest.get("cpu")  # f16 bundles have their CPU library now


def test_dry_run_checks_every_case_against_float64(prepared, tmp_path):
    proc = _gpu_check("run", prepared, "--dry-run", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    assert result["graphs"]["g1_mlp.f16"]["correct"]["ok"]
    att = result["graphs"][KEY]["attention"]
    assert att["ok"] and [c["name"] for c in att["cases"]] == NAMES
    for c in att["cases"]:
        assert set(c["opfuse"]) == {"attention_mma", "attention"}
        for r in c["opfuse"].values():
            assert r["correct"]["ok"] and r["correct"]["against"] == "float64 reference"
        assert c["sdpa"] == {"not_available": "dry run: no device"}
    assert "attention vs SDPA: g5: attention_mma ok" in proc.stdout


def _stub_run(prepared, out, fail=None):
    stub = f"{STUB}:make_driver" + (f":{fail}" if fail else "")
    log = prepared / "stub-log"
    if log.exists():
        for f in log.iterdir():
            f.unlink()
    proc = _gpu_check("run", prepared, "--out", out, "--stub", stub, "--only", KEY)
    result = json.loads((out / "gpu-check.json").read_text())
    return proc, result, json.loads((log / f"{KEY}.json").read_text())


def test_stubbed_run_times_opfuse_and_sdpa_the_same_way(prepared, tmp_path):
    proc, result, log = _stub_run(prepared, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    att = result["graphs"][KEY]["attention"]
    assert att["ok"] and att["sdpa"]["torch"] and not att.get("not_run")
    for c in att["cases"]:
        assert c["flops"] == gca.useful_flops(c) > 0
        sdpa = c["sdpa"]
        assert sdpa["correct"]["ok"] and sdpa["hot_us"] > 0 and sdpa["cold_us"] > 0
        assert sdpa["TFLOPs"] == pytest.approx(c["flops"] / sdpa["hot_us"] / 1e6, rel=1e-2)
        for label, r in c["opfuse"].items():
            assert r["correct"]["ok"] and r["vs_sdpa"]["ok"]
            assert r["hot_us"] > 0 and r["cold_us"] > 0 and r["TFLOPs"] > 0
            assert r["opfuse_over_sdpa"] == pytest.approx(r["hot_us"] / sdpa["hot_us"], rel=1e-2)
            (k,) = r["kernels"]
            assert k["emitter"] == label and k["h200_estimate_us"] >= k["roofline_us"] > 0
            assert r["fraction_of_estimate"] == pytest.approx(
                k["h200_estimate_us"] / k["hot_us"], rel=1e-2)
    # causal work is about half: the useful FLOPs count the pairs up to the diagonal
    by = {c["name"]: c for c in att["cases"]}
    assert by["g5_causal"]["flops"] / by["g5_causal"]["heads"] < 0.6 * 2 * 2 * 64 * 32 * 32
    # SDPA's timing windows: many calls between one pair of events, nothing else
    sdpa_windows = [w for w in timing_windows(log) if "sdpa" in w]
    assert max(len(w) for w in sdpa_windows) >= 100
    assert all(set(w) == {"sdpa"} for w in sdpa_windows)
    # cold SDPA: a memset (the L2 flush) right before the events of one call, 5 per case
    cold = [i for i in range(len(log) - 3) if log[i][0] == "memset"
            and log[i + 1] == ["event", "start"] and log[i + 2][0] == "sdpa"
            and log[i + 3] == ["event", "end"]]
    assert len(cold) == 5 * len(NAMES)
    # each case's opfuse bundles: the first launch (the correctness run) is synchronized
    # and checked before anything else; then many launches per parameter packing
    for name in NAMES[1:]:
        for variant in ("fused", "simt"):
            bname = f"attention.{name}.{variant}"
            i = log.index(["launch", KEY, bname, "fusion_0_attention"])
            assert log[i + 1] == ["sync"]
            launches = sum(1 for x in log if x[0] == "launch" and x[2] == bname)
            prepares = sum(1 for x in log if x[0] == "prepare" and x[2] == bname)
            assert launches > 50 * prepares > 0
    assert "attention vs SDPA: g5: attention_mma 10.0us" in proc.stdout


def test_a_planted_failing_launch_names_the_kernel_and_the_case(prepared, tmp_path):
    proc, result, _ = _stub_run(prepared, tmp_path,
                                fail="launch:attention.gqa4_causal.fused/fusion_0_attention")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert result["failed"] == [KEY] and result["exit_status"] == 1
    g5 = result["graphs"][KEY]
    assert g5["correct"]["ok"] and not g5.get("error")  # the graph's own kernels are fine
    att = g5["attention"]
    assert att["ok"] is False
    by = {c["name"]: c for c in att["cases"]}
    assert list(by) == NAMES  # the other cases still ran
    error = by["gqa4_causal"]["error"]
    assert "kernel fusion_0_attention (entry fusion_0_attention_kernel, emitter attention_mma)" in error
    assert "cuLaunchKernel" in error
    for name in NAMES[:-1]:
        assert all(r["correct"]["ok"] for r in by[name]["opfuse"].values())
    assert f"FAILED {KEY}: attention: gqa4_causal: OpfuseError: kernel fusion_0_attention" in proc.stdout
