"""The Triton GPU peer (bench/peers/triton_peer.py): its launches, JIT-like signatures and
the estimate rows, without triton; one real sm_90 compile where triton is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_estimate
from bench.peers import triton_peer as tp
from opfuse.cost import gpu_time as estimate

H200 = estimate.device("sm_90")


def test_launches_take_the_graphs_sizes() -> None:
    g1 = tp.launches("g1_mlp", "bf16", "bf16", scale=8)
    assert [(l.name, l.kernel, l.shape) for l in g1] == [
        ("fc1+gelu", "linear", (256, 32, 32, 1)), ("fc2+gelu", "linear", (256, 32, 32, 1))]
    # x, w, bias, out once each, 2 bytes
    assert g1[0].bytes_ == 2 * (256 * 32 + 32 * 32 + 32 + 256 * 32)
    assert g1[0].flags == {"BIAS": True, "GELU": True, "RESIDUAL": False}
    g6 = tp.launches("g6_encoder_layer", "f32", "tf32", scale=8)
    assert [l.name for l in g6] == ["qkv", "attention", "o_proj+residual", "ffn1+gelu",
                                    "ffn2+residual"]
    qkv, attn = g6[0], g6[1]
    assert qkv.shape == (32, 192, 64, 1)  # B*T = 1*32, [wq | wk | wv], d_model 64
    # attention reads Q/K/V from the packed QKV rows and writes O as [B, T, H, D]
    assert attn.shape == (8, 32, 8) and attn.scalars["stride_qt"] == 192
    assert attn.scalars["stride_ot"] == 64 and attn.scalars["stride_oh"] == 8
    assert attn.flops == 2.0 * 8 * 32 * 32 * 16
    g7 = tp.launches("g7_rmsnorm_swiglu", "bf16", "bf16", scale=8)
    assert [(l.kernel, l.shape) for l in g7] == [("swiglu", (512, 352, 128, 2)),
                                                 ("linear", (512, 128, 352, 1))]
    assert g7[0].flops == 2.0 * 512 * 352 * 128 * 2 and g7[1].flags["BIAS"] is False


def test_signature_specializes_like_the_jit() -> None:
    launch = tp.launches("g1_mlp", "f32", "ieee", scale=8)[0]
    launch.scalars["K"] = 33  # not a multiple of 16: no divisibility hint
    sig, consts, attrs = tp.signature(launch, tp.Config(64, 32, 32, 2, 5))
    order = tp.ARG_ORDER["linear"]
    assert sig["x"] == "*fp32" and sig["M"] == "i32" and sig["BLOCK_K"] == "constexpr"
    assert attrs[(order.index("out"),)] == [["tt.divisibility", 16]]
    assert (order.index("M"),) in attrs and (order.index("K"),) not in attrs
    assert consts == {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8,
                      "PRECISION": "ieee", "BIAS": True, "GELU": True, "RESIDUAL": False}
    attn = tp.launches("g5_attention", "bf16", "bf16", scale=8)[0]
    sig, consts, _ = tp.signature(attn, tp.Config(64, 64, 0, 4, 3))
    assert sig["sm_scale"] == "fp32" and "BLOCK_K" not in consts and consts["HEAD_DIM"] == 8
    assert list(sig)[:len(tp.ARG_ORDER["attention"])] == list(tp.ARG_ORDER["attention"])


PTX = """
.visible .entry linear(
{
\tcp.async.cg.shared.global [%r1], [%rd2], 16, %r3;
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd4, %rd5, p, 1, 1, 0, 1;
\tfma.rn.f32 %f2, %f3, %f4, %f5;
}
"""


def test_instructions_read_from_the_ptx() -> None:
    assert tp.instructions(PTX) == ["wgmma", "cp.async", "fma.f32"]
    assert tp.instructions("\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {};\n"
                           "\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {}, [%r1];\n"
                           "\tcp.async.bulk.tensor.2d.shared::cluster.global [%r1], [%rd1];\n") \
        == ["mma.sync", "ldmatrix", "tma"]


def _facts(instructions, registers=128, spills=0, smem=49152):
    one = {"registers": registers, "spills": spills, "smem": smem,
           "instructions": instructions, "chip": "sm_90a", "compile_s": 0.1}
    return {90: one, 80: dict(one, chip="sm_80", instructions=["mma.sync"])}


def test_the_row_is_opfuses_model_fed_tritons_kernel() -> None:
    launch = tp.launches("g6_encoder_layer", "bf16", "bf16")[3]  # ffn1: 2048x2048x512
    config = tp.Config(128, 128, 32, 4, 4)
    row = tp.estimate_row(launch, config, _facts(["mma.sync", "cp.async"]), H200)
    same = estimate.matmul_kernel(
        H200, grid=(16 * 16, 1, 1), block=(128, 1, 1),
        meta={"tile": [128, 128, 32], "problem": [1, 2048, 2048, 512], "operands": "bf16",
              "mma": "bf16"},
        flops=2.0 * 2048 * 2048 * 512, bytes_=launch.bytes_, registers=128, smem=49152)
    assert row["estimate_s"] == same["estimate_s"] and row["roofline_s"] == same["roofline_s"]
    assert row["model_notes"] == [] and "estimate_wgmma_s" not in row
    assert row["compare_with"] == "mma" and row["sm_80"]["chip"] == "sm_80"
    # wgmma: estimated as mma.sync and said; the dense-peak variant beside it is faster
    wg = tp.estimate_row(launch, config, _facts(["wgmma", "cp.async"]), H200)
    assert wg["estimate_s"] == row["estimate_s"]
    assert wg["model_notes"] == ["wgmma priced as mma.sync (no wgmma rate in the model)"]
    assert wg["estimate_wgmma_s"] < wg["estimate_s"]
    # f32 IEEE runs on FFMA; a TF32 kernel without tensor-core instructions is said to
    ieee = tp.launches("g6_encoder_layer", "f32", "ieee")[3]
    r = tp.estimate_row(ieee, config, _facts(["cp.async", "fma.f32"], spills=24), H200)
    assert r["compare_with"] == "simt" and r["estimate_s"] > 5 * row["estimate_s"]
    assert r["model_notes"] == ["spills 24 bytes (not modelled)"]
    tf32 = tp.launches("g6_encoder_layer", "f32", "tf32")[3]
    r = tp.estimate_row(tf32, config, _facts(["fma.f32"]), H200)
    assert "no tensor-core MMA in the PTX: estimated as FFMA" in r["model_notes"]
    # SwiGLU's two products on one A tile, said as opfuse's horizontal kernels say it
    sw = tp.launches("g7_rmsnorm_swiglu", "bf16", "bf16")[0]
    r = tp.estimate_row(sw, config, _facts(["mma.sync"]), H200)
    assert r["tile"] == [128, 128, 32] and r["grid"] == [32 * 22, 1, 1]
    assert r["executed_flops"] == 2.0 * 4096 * 2 * 2816 * 1024
    # its two products share each A tile; opfuse's pair restages A for the second product
    meta = {k: v for k, v in tp.estimate_meta(sw, config, "bf16").items() if k != "shared_a"}
    restaged = estimate.matmul_kernel(H200, grid=r["grid"], block=r["block"], meta=meta,
                                      flops=sw.flops, bytes_=sw.bytes_, registers=128,
                                      smem=49152)
    assert restaged["executed_flops"] == r["executed_flops"]
    assert restaged["memory_s"] > r["memory_s"]


def test_attention_row_and_the_choice_of_blocks() -> None:
    launch = tp.launches("g5_attention", "bf16", "bf16")[0]
    row = tp.estimate_row(launch, tp.Config(128, 64, 0, 4, 3), _facts(["mma.sync"]), H200)
    assert row["grid"] == [4, 64, 1] and row["tile"] == [128, 64]
    assert row["executed_flops"] == 2.0 * 64 * 512 * 512 * 128
    rows = [{"estimate_s": 2.0, "spills": 0}, {"estimate_s": 1.0, "spills": 8},
            {"estimate_s": 3.0, "spills": 0}, {"not_available": "too big", "spills": 0}]
    assert tp.choose(rows) is rows[0]
    assert tp.choose(rows[1:2] + [{"estimate_s": 5.0, "spills": 4}])["spills"] == 4
    assert tp.choose(rows[3:]) is rows[3]


def _section(triton: dict) -> dict:
    return {"device": "H200 SXM", "registers_from": "ptxas", "kernels": [],
            "graphs": [{"graph": "g1_mlp", "dtype": "bf16", "variant": "mma", "default": True,
                        "kernels": 2, "estimate_s": 2e-6, "roofline_s": 1e-6},
                       {"graph": "g1_mlp", "dtype": "bf16", "variant": "simt",
                        "default": False, "kernels": 2, "estimate_s": 9e-6,
                        "roofline_s": 1e-6}],
            "triton": triton}


def test_the_summary_has_a_triton_column_or_says_why_not() -> None:
    rows = [tp.estimate_row(l, tp.Config(64, 32, 32, 2, 5), _facts(["wgmma"]), H200)
            for l in tp.launches("g1_mlp", "bf16", "bf16", scale=8)]
    totals = tp.totals(rows)
    assert [(t["precision"], t["compare_with"], t["kernels"]) for t in totals] == [
        ("bf16", "mma", 2)]
    assert totals[0]["estimate_s"] == sum(r["estimate_s"] for r in rows)
    lines = gpu_estimate.readme_totals(_section({"graphs": totals}))
    assert "Triton µs" in lines[0]
    assert lines[2].startswith("| g1_mlp | bf16 | mma (default) | 2 | 2.0 | 2 (bf16) | ")
    assert lines[3].endswith("| - | - | - | 1.0 |")  # no Triton kernel is the SIMT one
    missing = {"not_available": "triton not installed"}
    last = gpu_estimate.readme_totals(_section(missing))[-1]
    assert last == "Triton: n/a (triton not installed)."
    assert tp.markdown(missing) == ["Triton peer: n/a (triton not installed)."]
    table = "\n".join(gpu_estimate.markdown(_section(missing)))
    assert "Triton: n/a (triton not installed)" in table


def test_without_triton_the_section_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    got = tp.section(("g1_mlp",), ("bf16",), scale=8, log=lambda m: None)
    assert set(got) == {"not_available"} and got["not_available"].startswith(
        "triton not installed")


NO_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                               reason="triton not installed (the bench extra)")
ROOT = Path(__file__).resolve().parents[2]


@NO_TRITON
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_the_triton_kernels_compute_the_graphs_ops() -> None:
    """Triton's interpreter runs the peer's kernels on the CPU (f32, tails in M, N, K and
    the sequence, G6's packed Q/K/V strides): they compute what they stand for."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "test/unit/triton_interpret_check.py")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = dict(line.split() for line in proc.stdout.splitlines())
    assert set(errors) == {"linear", "matmul", "swiglu", "attention"}
    assert all(float(e) < 1e-5 for e in errors.values()), errors


@NO_TRITON
def test_compiles_a_triton_kernel_for_sm_90_without_a_gpu() -> None:
    launch = tp.launches("g1_mlp", "bf16", "bf16", scale=8)[0]
    config = tp.Config(64, 64, 32, 4, 3)
    facts = tp.compile_facts(launch, config, 90)
    assert facts["chip"] == "sm_90a" and 0 < facts["registers"] <= 255
    assert facts["spills"] == 0 and facts["smem"] > 0
    assert "wgmma" in facts["instructions"] and "cp.async" in facts["instructions"]
    row = tp.estimate_row(launch, config, {90: facts}, H200)
    assert row["estimate_s"] >= row["roofline_s"] > 0 and row["registers"] == facts["registers"]
