"""The tensor-core attention kernel (backends/gpu/emit/attention_mma.py): FlashAttention-2 with both
products on ``mma.sync.m16n8k16``, K/V double-buffered through ``cp.async``.

* Numerics: emulated (race check on) against float64 SDPA (attention_cases.py) over the
  issue's shapes — sequence lengths 1, 3, 127, 129 (queries and keys apart), head dims 32,
  64, 128 (and 40/72: zero-padded to 48/80), causal or not, grouped-query ratios 1, 2, 4,
  boolean and additive masks, f16 and bf16 — within the stated tolerances of
  ``attention_cases.TOLERANCES``: f16 rtol 1e-2 / atol 2e-3, bf16 rtol 3e-2 / atol 2e-2
  (S, P and O are rounded to the graph's type, P once more for the tensor cores). Fixed
  corners plus a seeded sample of the cross product.
* The pipeline is what the race check sees: one ``cp.async.wait_group`` too few and the
  emulator must raise.
* PTX: ``mma.sync`` m16n8k16 of the operand type, ``cp.async``, ``ldmatrix`` (``.trans``
  for V), no shared-memory store at all (P stays in registers), and ptxas 0 spills at
  sm_80 and sm_90 per head-dim tile; the fused f16 G5 kernel stores only O.
* The knob: ``matmul=simt`` (all or per kernel) selects the SIMT kernel; f32 is SIMT.
* Another producer: torch's causal SDPA, imported, is one tensor-core kernel = torch.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest

import opfuse
from opfuse.backends.gpu.emit import attention_mma
from opfuse.testing.emulator import emulate
from opfuse.cost import gpu_time as estimate
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.gpu.compiler import compile_module
from opfuse.errors import OpfuseError
from opfuse.frontends.builder.graphs import graphs
from opfuse.ir import parse_module

from attention_cases import Case, assert_matches, device_args, graph, inputs, mask_branches
from test_attention import ALWAYS, _store_bases
from test_codegen_mma import run_emulated

HAVE_PTXAS = ptxas.find_ptxas() is not None
SEQS = (1, 3, 127, 129)


def _corners() -> list[Case]:
    return [
        Case(queries=1, keys=129, head_dim=64, dtype="f16"),  # one query (decode)
        Case(queries=3, head_dim=64, causal=True, dtype="bf16"),
        Case(queries=127, keys=129, head_dim=32, dtype="bf16", mask="bool"),
        Case(heads=1, queries=129, head_dim=128, causal=True, dtype="f16"),
        Case(heads=1, queries=129, keys=127, head_dim=128, dtype="bf16", causal=True),
        Case(heads=4, kv_heads=1, queries=33, head_dim=64, dtype="bf16", mask="float"),
        Case(heads=2, kv_heads=1, queries=20, keys=70, head_dim=40, value_dim=72, dtype="f16"),
        Case(queries=6, keys=10, head_dim=32, causal=True, mask="float", dtype="f16"),
    ]


def _sample() -> list[Case]:
    """A seeded sample of sequence lengths x head dims x causal x GQA x dtype."""
    space = [
        Case(1, 4, 4 // ratio, q, n, d, 0, dtype, causal)
        for q, n, d, causal, ratio, dtype in itertools.product(
            SEQS, SEQS, (32, 64, 128), (False, True), (1, 2, 4), ("f16", "bf16"))
        if q * n < 129 * 129 and n > 1
    ]
    return random.Random(12).sample(space, 5)


CASES = _corners() + _sample()


def _compiled(c: Case, **options):
    g = graph(c)
    exe = opfuse.compile(g, backend="cpu", pipeline=ALWAYS)
    return g, exe, compile_module(exe._source, lower=False, **options)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_float64_sdpa(case):
    g, _, program = _compiled(case)
    emitters = [k.emitter for k in program.kernels.values()]
    if case.n > 1:  # one key: the unit-dim fold leaves no softmax to recognize
        assert emitters == ["attention_mma"], (emitters, program.notes)
    args = inputs(g, case)
    emu, (out,) = run_emulated(program, device_args(case, args))
    assert_matches(case, out, args)
    if case.n > 1:
        assert emu.stats.mma > 0
        assert emu.stats.ldmatrix_wavefronts == emu.stats.ldmatrix_matrices  # no bank conflicts


@pytest.mark.parametrize("case", [
    Case(heads=1, queries=128, keys=128, head_dim=64, dtype="f16", causal=True),
    Case(heads=2, queries=129, keys=129, head_dim=64, dtype="bf16", causal=True),
    Case(heads=2, queries=100, keys=130, head_dim=32, dtype="f16", causal=True, mask="bool"),
    Case(heads=4, kv_heads=2, queries=70, head_dim=128, dtype="bf16", causal=True),
], ids=str)
def test_tiles_below_the_diagonal_skip_the_causal_mask(case):
    """A causal kernel evaluates its scores twice, by tile: below the diagonal (every key
    of the tile <= every row of the block) without the mask (only the scale: one mulf per
    score, no compare or select), else with it; numerics = float64 over lengths that are
    not multiples of the tiles (key tails, a boolean mask on top of the causal one)."""
    g, _, program = _compiled(case)
    (k,) = program.kernels.values()
    assert k.emitter == "attention_mma" and k.meta["causal"] == 0
    scores = 4 * (k.meta["tile"][1] // 8)  # per lane: 4 per 16x8 accumulator tile
    (branches,) = mask_branches(program)
    below, other = branches
    assert below["arith.mulf"] == other["arith.mulf"] == scores
    # the causal mask is one compare and one select per score, and only the other tiles
    # have them (a key tail's compares and selects, a boolean mask's, are in both)
    assert other["arith.select"] - below["arith.select"] == scores
    assert other["arith.cmpi"] - below["arith.cmpi"] == scores
    if case.mask is None and case.n % k.meta["tile"][1] == 0:
        assert below["arith.cmpi"] == below["arith.select"] == 0
    args = inputs(g, case)
    _, (out,) = run_emulated(program, device_args(case, args))
    assert_matches(case, out, args)


def test_the_race_check_covers_the_pipeline(monkeypatch):
    """With one wait group too few (K or V of a tile read while its copy is in flight)
    the emulator raises: the race check sees the double-buffered pipeline."""
    c = Case(queries=70, keys=130, head_dim=32, dtype="f16")
    wait = attention_mma.async_copy.wait
    monkeypatch.setattr(attention_mma.async_copy, "wait", lambda kb, n: wait(kb, n + 1))
    g, _, program = _compiled(c)
    with pytest.raises(OpfuseError, match="in flight"):
        run_emulated(program, device_args(c, inputs(g, c)))


def test_the_matmul_knob_selects_the_kernel():
    c = Case(queries=20, head_dim=32, dtype="bf16")
    assert [k.emitter for k in _compiled(c)[2].kernels.values()] == ["attention_mma"]
    for spec in ("simt", "fusion_0_attention=simt,auto"):
        program = _compiled(c, matmul=spec)[2]
        assert [k.emitter for k in program.kernels.values()] == ["attention"], spec
        assert program.notes == []
    f32 = _compiled(Case(queries=20, head_dim=32))[2]
    assert [k.emitter for k in f32.kernels.values()] == ["attention"] and f32.notes == []
    wide = _compiled(Case(queries=20, head_dim=160, dtype="f16"))[2]  # above the MMA tiles
    assert [k.emitter for k in wide.kernels.values()] == ["attention"]
    assert "attention_mma: head dim 160 above the tensor-core tiles" in wide.notes[0]


@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("dims", [(32, 32), (64, 64), (128, 128), (40, 72)], ids=str)
def test_ptx_has_tensor_cores_and_no_spills(dims, dtype):
    d, dv = dims
    c = Case(heads=2, queries=70, head_dim=d, value_dim=dv, dtype=dtype, causal=True)
    exe = opfuse.compile(graph(c), backend="cpu", pipeline=ALWAYS)
    program = compile_module(exe._source, targets=("sm_80", "sm_90"), ptxas=True)
    (k,) = program.kernels.values()
    assert k.emitter == "attention_mma"
    for chip in ("sm_80", "sm_90"):
        ptx = k.ptx[chip]
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32" in ptx
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx  # Q, K
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx  # V
        assert not re.search(r"\bst\.shared", ptx)  # P goes from S to P·V in registers
        assert re.search(r"^\.maxnreg (168|255)$", ptx, re.M)  # the tile's register budget
        res = k.resources[chip]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (chip, res)
        assert res["smem"] <= 48 * 1024, (chip, res)


def test_g5_f16_kernel_stores_only_o():
    """Full-size G5 in f16: one tensor-core kernel whose global stores all go to O."""
    fused = opfuse.compile(graphs(dtype="f16")["g5_attention"], backend="cpu").ir("fused")
    program = compile_module(parse_module(fused), targets=("sm_90",), ptxas=False)
    (k,) = program.kernels.values()
    assert k.emitter == "attention_mma"
    o_param = f"{k.entry}_param_{list(k.params).index(('result', 0))}"
    assert _store_bases(k.ptx["sm_90"]) == {o_param}
    assert len(k.params) == 4  # Q, K, V, O


def test_estimate_counts_the_tiles_a_causal_mask_leaves_and_the_exponentials():
    """G5's shape (64 heads x 512 x 512 x 64) in 64 x 64 tiles: without a mask every block
    runs all 8 key tiles; causal, query block b runs b + 1 of them (36 of 64)."""
    meta = {"mma": "bf16", "tile": [64, 64], "problem": [64, 512, 512, 64, 64],
            "padded": [64, 64], "causal": None, "operands": "bf16"}
    flops, nbytes = 4.0 * 64 * 512 * 512 * 64, 4 * 64 * 512 * 64 * 2
    args = dict(grid=(8, 64, 1), block=(128, 1, 1), flops=flops, bytes_=nbytes,
                registers=149, smem=36864)
    full = estimate.attention_kernel(estimate.H200, meta=meta, **args)
    causal = estimate.attention_kernel(estimate.H200, meta={**meta, "causal": 0}, **args)
    assert full["executed_flops"] == flops and full["exponentials"] == 64 * 512 * 512
    assert causal["executed_flops"] == flops * 36 / 64
    assert full["estimate_s"] >= full["roofline_s"] > 0 and full["bound"] == "compute"
    assert causal["compute_s"] < full["compute_s"]
    simt = estimate.attention_kernel(estimate.H200, meta={**meta, "mma": None}, **args)
    assert simt["compute_s"] > 4 * full["compute_s"]  # FFMA against mma.sync


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_torch_sdpa_imports_as_one_tensor_core_kernel(dtype):
    """Another producer's graph: torch's causal SDPA (67 queries, head dim 64) through the
    importer is one attention_mma kernel, emulated = torch's float64 SDPA."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from opfuse.frontends.torch.importer import import_module
    from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, 2, 67, 64, generator=gen).to(tdt) for _ in range(3)]
    exe = opfuse.compile(import_module(Causal(), tuple(qkv)), backend="cpu")
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention_mma"]
    args = [x.float().numpy() for x in qkv]
    dev = [float32_to_bf16_bits(a) if dtype == "bf16" else a.astype(np.float16) for a in args]
    _, (out,) = run_emulated(program, dev)
    got = bf16_bits_to_float32(out) if dtype == "bf16" else out.astype(np.float32)
    want = F.scaled_dot_product_attention(*(x.double() for x in qkv), is_causal=True).numpy()
    rtol, atol = {"f16": (1e-2, 2e-3), "bf16": (3e-2, 2e-2)}[dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
