"""The rotary embedding (RoPE) as a prologue of the attention kernel (issue #11: a Llama
block in G6's shape, 7 kernels).

``q * cos + rotate_half(q) * sin`` (and the same on K) on the projections' heads, as
transformers' Llama writes it, imported from torch: opfuse-fuse-attention takes each
rotation into the attention group as its own guard candidate, and every backend evaluates
it while it stages Q (once per query block) and each K tile: the CPU kernels (tiled and
one-row), the SIMT GPU kernel (f32) and the tensor-core kernel (bf16, which must not fall
back to SIMT: its Q and K tiles are computed into shared memory instead of copied by
cp.async). Checked against torch eager and float64, in the emulator with the race check
on, and by ptxas (0 spills at sm_80 and sm_90). The rotated K returned beside the
attention (a KV cache) keeps its own kernel, with the reason in the ledger.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.nn import functional as F  # noqa: E402

import opfuse  # noqa: E402
from attention_cases import cpu_outputs  # noqa: E402
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas  # noqa: E402
from opfuse.backends.gpu.compiler import compile_module  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402
from opfuse.runtime.schedule import bf16_bits_to_float32  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

HAVE_PTXAS = ptxas.find_ptxas() is not None
HEADS, KV_HEADS = 4, 2
#: Against eager, relative to max(1, max|eager|): f32 another summation order; bf16 as
#: the half-precision attention tests (eager rounds every RoPE op to bf16, so does opfuse).
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rope(torch.nn.Module):
    """Llama's attention after its projections: heads split, RoPE on Q and K (GQA: K/V
    heads shared by two query heads), causal SDPA (or SDPA with an additive ``mask``).
    ``return_k``: the rotated K is returned too (a KV cache)."""

    def __init__(self, return_k: bool = False):
        super().__init__()
        self.return_k = return_k

    def forward(self, qp, kp, v, cos, sin, mask=None):
        b, s, _ = qp.shape
        q = qp.view(b, s, HEADS, -1).transpose(1, 2)
        k = kp.view(b, s, KV_HEADS, -1).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # a decoder's causal + padding mask, additive (as transformers builds it)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return (o, k) if self.return_k else o


def _inputs(d: int, s: int, dtype, batch: int = 1, masked: bool = False):
    torch.manual_seed(0)
    pos = torch.arange(s, dtype=torch.float64)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)
    angles = torch.cat((pos, pos), dim=-1)[None].expand(batch, -1, -1)
    args = (torch.randn(batch, s, HEADS * d), torch.randn(batch, s, KV_HEADS * d),
            torch.randn(batch, KV_HEADS, s, d), angles.cos(), angles.sin())
    if masked:  # causal, the last sequence right-padded by 3 tokens
        keep = torch.tril(torch.ones(s, s, dtype=torch.bool))[None, None].repeat(batch, 1, 1, 1)
        keep[-1, :, :, -3:] = False
        args += (torch.where(keep, 0.0, torch.finfo(torch.float32).min),)
    return tuple(a.to(dtype) for a in args)


_CACHE: dict = {}


def _compiled(d: int, s: int, dtype, *, return_k: bool = False, batch: int = 1,
              masked: bool = False):
    """(model, torch inputs, imported, CPU executable), built once per case."""
    key = (d, s, dtype, return_k, batch, masked)
    if key not in _CACHE:
        model = Rope(return_k).eval()
        args = _inputs(d, s, dtype, batch, masked)
        imported = import_module(model, args)
        _CACHE[key] = model, args, imported, opfuse.compile(imported.graph, backend="cpu")
    return _CACHE[key]


def _eager(model, args):
    with torch.no_grad():
        out = model(*args)
    return [o.float().numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _close(got, want, dtype):
    got = np.asarray(got, np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * max(1.0, np.abs(want).max()))


def _prologues(exe) -> dict[str, dict]:
    return {d["numbers"].get("prologue", d["producer"]): d for d in exe.report["decisions"]
            if d["action"] == "attention prologue"}


def test_both_rotations_join_the_attention_kernel():
    """One kernel; each rotation its own guard decision, its saving the rotated tensor's
    write and read; K's note says what the GPU kernel reads again from L2 (the kernel reads
    K once per query block and query head: 2 blocks of 64 rows x 2 heads per K/V head)."""
    _, _, imported, exe = _compiled(8, 70, torch.float32, batch=2)
    assert [k["kind"] for k in exe.report["kernels"]] == ["attention"], exe.report["kernels"]
    found = _prologues(exe)
    assert set(found) == {"Q", "K"} and all(d["fused"] for d in found.values()), found
    q, k = found["Q"]["numbers"], found["K"]["numbers"]
    q_rot, k_rot = 2 * HEADS * 70 * 8 * 4, 2 * KV_HEADS * 70 * 8 * 4
    assert q["q_unfused"] - q["q_fused"] == 2 * q_rot and q["l2_reread"] == 0
    # K's: its write and read, and cos and sin read once by the merged kernel, not once
    # by each rotation
    tables = 2 * 70 * 8 * 4
    assert k["q_unfused"] - k["q_fused"] == 2 * k_rot + 2 * tables
    # k_proj, cos and sin instead of K, read 2 query blocks x 2 heads times
    assert k["l2_reread"] == (k_rot + 2 * tables - k_rot) * (2 * 2 - 1)
    assert f"{k['l2_reread']} B more read from L2" in found["K"]["reason"]


@pytest.mark.parametrize("path", ["tiles", "rows"])
def test_cpu_kernels_match_eager(path, monkeypatch):
    model, args, imported, _ = _compiled(8, 70, torch.float32, batch=2)
    got = cpu_outputs(imported.graph, imported.arguments(*args), path, monkeypatch)
    _close(got, _eager(model, args)[0], torch.float32)


def test_simt_kernel_matches_eager():
    model, args, imported, exe = _compiled(8, 70, torch.float32, batch=2)
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention"], program.notes
    (got,) = emulate.run_program(program, imported.arguments(*args))
    _close(got, _eager(model, args)[0], torch.float32)


def test_tensor_core_kernel_matches_eager_and_float64():
    """bf16, head dim 32, 70 queries (a partial query block and key tile), causal, GQA:
    the tensor-core kernel, emulated with the race check on."""
    model, args, imported, exe = _compiled(32, 70, torch.bfloat16)
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention_mma"], program.notes
    (got,) = emulate.run_program(program, imported.arguments(*args))
    got = bf16_bits_to_float32(got)
    _close(got, _eager(model, args)[0], torch.bfloat16)
    ref = _eager(model.double(), tuple(a.double() for a in args))[0]
    _close(got, ref, torch.bfloat16)


@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("d", [32, 64])  # the 64-key tiles (128: 198-203 of 255 registers)
def test_tensor_core_kernel_ptx_has_no_spills(d):
    """Q and K computed into shared memory (global loads, no cp.async for them), V copied
    by cp.async, both products on mma.sync; 0 spills within the tile's register budget."""
    _, _, _, exe = _compiled(d, 70, torch.bfloat16)
    program = compile_module(exe._source, targets=("sm_80", "sm_90"), ptxas=True)
    (k,) = program.kernels.values()
    assert k.emitter == "attention_mma", program.notes
    for chip in ("sm_80", "sm_90"):
        ptx = k.ptx[chip]
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
        assert "cp.async.cg.shared.global" in ptx  # V
        assert re.search(r"ld\.global\.nc\.(b|u)16", ptx)  # q_proj, k_proj, cos, sin
        assert re.search(r"st\.shared\.v2\.b16", ptx)  # rotated pairs into the Q/K tiles
        res = k.resources[chip]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (d, chip, res)
        assert res["smem"] <= 48 * 1024, (chip, res)


@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not installed")
def test_simt_kernel_ptx_has_no_spills_and_matches_eager():
    """f32, the zoo's decoder shape (head dim 8, 8 tokens, causal + padding mask): the
    SIMT kernel evaluates the rotations in a loop, one element an iteration. Regression:
    unrolled (as a view is copied), ptxas scheduled every element's loads at once and
    spilled 12 bytes at sm_80 (dfb44a6; the zoo's GPT-NeoX and Llama too)."""
    model, args, imported, exe = _compiled(8, 8, torch.float32, batch=2, masked=True)
    program = compile_module(exe._source, targets=("sm_80", "sm_90"), ptxas=True)
    (k,) = program.kernels.values()
    assert k.emitter == "attention", program.notes
    for chip, res in k.resources.items():
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (chip, res)
    (got,) = emulate.run_program(program, imported.arguments(*args))
    _close(got, _eager(model, args)[0], torch.float32)


def test_rotated_k_returned_stays_apart():
    """The rotated K also returned (a KV cache): its rotation keeps its own kernel (the
    attention kernel writes only O), with the reason; Q's still joins. Both results =
    eager."""
    model, args, imported, exe = _compiled(8, 70, torch.float32, return_k=True)
    kinds = Counter(k["kind"] for k in exe.report["kernels"])
    assert kinds["attention"] == 1 and kinds["loop"] >= 1, exe.report["kernels"]
    found = _prologues(exe)
    assert found["Q"]["fused"], found
    (refused,) = [d for key, d in found.items() if key not in ("Q", "K")]
    assert not refused["fused"]
    # returned through the unit-dim fold's reshape (or copied out as a view of it; that
    # reshape is written by the rotation's loop kernel: opfuse-fuse-producer-consumer)
    assert re.search(r"^add_1(\.expand_shape)? is also (returned|read by)",
                     refused["reason"]), refused
    assert "writes only its result" in refused["reason"]
    got = exe(*imported.arguments(*args))
    for g, w in zip(got, _eager(model, args)):
        _close(g, w, torch.float32)
