"""The CPU attention kernel's tiled fast path (backends/cpu/attention_tiles.py): query tiles
on the threads, Q·Kᵀ and P·V on the packed micro-kernel, the row softmax vectorized.

Against the float64 SDPA reference (attention_cases.py) and against the same graph with
attention left as three kernels (fused vs unfused), on shapes that exercise the tiling:
several query tiles with a short last one, key counts that are not a multiple of the
vector width or of the micro-kernel's panel, head dims that are not a multiple of 16
(and a value dim unlike the head dim), causal masks with key blocks skipped per tile,
grouped-query heads, f16/bf16, fewer units than threads, on 1 and 2 threads (bit for bit
the same). And the fallback: past the workspace limit the one-row loops run, with a
warning, and are still right.
"""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

import opfuse
from opfuse import pipeline as pl
from opfuse.backends.cpu import attention_tiles as tiles
from opfuse.backends.cpu.attention import lower_attention_kernels
from opfuse.ir import parse_module

from attention_cases import Case, assert_matches, device_args, graph, host_values, inputs
from test_attention import ALWAYS, lower_plan  # attention always fused; a kernel's plan

THREE = pl.Pipeline.default(disable=("opfuse-fuse-attention",))

CASES = [
    # three query tiles (bm 72), the last one short; 150 keys: no multiple of 16 or 64
    Case(heads=2, queries=200, keys=150, head_dim=64),
    # causal over three tiles: each tile's key loop stops at its diagonal
    Case(heads=1, queries=257, head_dim=32, causal=True),
    # head dim 80 and value dim 40: panels and vectors with tails
    Case(heads=2, queries=33, keys=70, head_dim=80, value_dim=40, mask="bool"),
    # grouped-query heads (4 query heads per K/V head), additive mask
    Case(batch=2, heads=4, kv_heads=1, queries=20, keys=37, head_dim=32, mask="float"),
    Case(heads=2, queries=130, head_dim=64, dtype="f16", causal=True),
    Case(heads=2, kv_heads=1, queries=40, keys=99, head_dim=128, dtype="bf16"),
    # one unit (batch x heads x tiles = 1): fewer units than threads
    Case(heads=1, queries=5, keys=9, head_dim=16),
]


def _compile(c: Case, threads: int, pipeline=ALWAYS):
    return opfuse.compile(graph(c), backend="cpu", pipeline=pipeline, threads=threads)


def _kinds(exe) -> list[str]:
    return [k["kind"] for k in exe.report["kernels"]]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tiles_match_float64_and_unfused(case):
    g = graph(case)
    args = inputs(g, case)
    dev = device_args(case, args)
    one, two = _compile(case, 1), _compile(case, 2)
    assert _kinds(one) == ["attention"]
    out1, out2 = one(*dev), two(*dev)
    assert_matches(case, out1, args)
    np.testing.assert_array_equal(out1, out2)  # the threads split units, not the math
    three = _compile(case, 2, THREE)
    assert "attention" not in _kinds(three)
    got, want = host_values(case, out1), host_values(case, three(*dev))
    # a row with every key masked: the three kernels' softmax gives NaN (0 / 0), the
    # attention kernel 0 like SDPA (the float64 reference checked that above)
    live = np.isfinite(want).all(axis=-1)
    assert live.any()
    rtol, atol = {"f32": (1e-4, 1e-5), "f16": (1e-2, 2e-3), "bf16": (3e-2, 2e-2)}[case.dtype]
    np.testing.assert_allclose(got[live], want[live], rtol=rtol, atol=atol)


def test_lowered_function_is_the_tiled_path():
    """The attention function calls the micro-kernel variant and the vectorized softmax,
    inside one loop over the threads."""
    c = CASES[0]
    exe = _compile(c, 2)
    module = parse_module(exe.ir("fused"))
    assert lower_attention_kernels(module, threads=2) == 1
    text = str(module)
    assert "opfuse.cpu_attention = \"tiles\"" in text
    for name in ("@__opfuse_att_scores", "@__opfuse_att_pv", "@__opfuse_att_softmax_f32",
                 "@__opfuse_mm_att_f32_f32"):
        assert f"call {name}" in text or f"func.call {name}" in text, name
    assert text.count("scf.forall") == 1
    assert "vector.reduction <maximumf>" in text and "call @__opfuse_math_exp_le0_vector" in text


def test_fallback_past_the_workspace_limit_warns_and_is_right(monkeypatch):
    c = Case(heads=2, queries=40, keys=50, head_dim=32, causal=True)
    monkeypatch.setattr(tiles, "WORKSPACE_LIMIT", 0)
    g = graph(c)
    args = inputs(g, c)
    exe = _compile(c, 2)
    with pytest.warns(UserWarning, match="one-row loops"):
        out = exe(*device_args(c, args))
    assert_matches(c, out, args)
    module = parse_module(exe.ir("fused"))
    with pytest.warns(UserWarning):
        lower_attention_kernels(module, threads=2)
    (fn,) = [op.operation for op in module.body.operations
             if "fusion_" in ir.StringAttr(op.operation.attributes["sym_name"]).value]
    assert ir.StringAttr(fn.attributes["opfuse.cpu_attention"]).value == "rows"


def test_tiling_sizes():
    """Tiles of at most BLOCK_M rows, a multiple of the micro-kernel's rows, balanced; one
    worker per unit at most."""
    from opfuse.backends.cpu.matmul import Blocking

    b = Blocking(lanes=16, mr=6, nv=4, kc=256, mc=132)
    exe = _compile(CASES[1], 1)
    t = tiles.tiling(lower_plan(exe), 8, b)  # 257 queries: three tiles
    assert (t.tiles, t.bm, t.bh, t.threads) == (3, 90, 1, 3)
    assert t.lds == 272 and t.sizes["s"] == 90 * 272
    assert t.sizes["kp"] == 320 * 32 and t.sizes["vp"] == 64 * 257
