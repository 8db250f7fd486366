"""opfuse-fuse-recompute: small producers read through a broadcast are computed again inside
their consumers (position ids, a position embedding shared by the batch, the pieces of an
attention mask). Fused == unfused == numpy on the CPU, the GPU kernels in the emulator (race
check on), and the kernel counts the recomputation reaches.
"""

from __future__ import annotations

import numpy as np

from opfuse.builder import Graph

from test_codegen_common import assert_everywhere

RNG = np.random.default_rng(0)
B, S, H, V = 2, 8, 16, 50


def _layernorm(e: np.ndarray) -> np.ndarray:
    return (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-5)


def test_gpt2_embeddings_are_one_kernel():
    """Position ids (arange + past length, 1 x S) index the position table (1 x S x H),
    which is added to the token embedding (B x S x H) and normalized: without recomputation
    the ids and the position rows are kernels of their own (iteration spaces differ)."""
    g = Graph("gpt2_front")
    wte, ids, wpe = g.input("wte", (V, H)), g.input("ids", (B, S), "i64"), g.input("wpe", (64, H))
    pos = g.add(g.iota((1, S), 1, dtype="i64", name="arange"), 3, name="position_ids")
    y = g.layernorm(g.embedding(wte, ids, name="tokens") + g.embedding(wpe, pos, name="positions"))
    g.output(y)
    W, P = RNG.standard_normal((V, H)).astype(np.float32), RNG.standard_normal((64, H)).astype(np.float32)
    I = RNG.integers(0, V, (B, S))
    want = _layernorm(W[I] + P[np.arange(S) + 3][None])
    assert_everywhere(g, [W, I, P], [want.astype(np.float32)], kernels=1)


def test_a_causal_and_padding_mask_is_one_kernel_with_its_consumer():
    """HF's mask: causal (q >= kv, 1 x 1 x S x S, from two aranges) and padding
    (mask[b, kv], B x 1 x 1 x S), and-ed into B x 1 x S x S and applied to the scores of
    every head (B x 4 x S x S): everything is recomputed where the scores are read."""
    g = Graph("mask")
    scores, mask = g.input("scores", (B, 4, S, S)), g.input("mask", (B, S), "i64")
    q = g.iota((1, 1, S, 1), 2, dtype="i64", name="q_idx")
    kv = g.iota((1, 1, 1, S), 3, dtype="i64", name="kv_idx")
    causal = g.ge(q, kv, name="causal")
    pad = g.reshape(g.cast(mask, "i8", name="pad"), (B, 1, 1, S), name="pad4")
    allowed = g.logical_and(causal, pad, name="allowed")
    g.output(g.where(allowed, scores, -1e9, name="masked"))
    X = RNG.standard_normal((B, 4, S, S)).astype(np.float32)
    M = np.ones((B, S), np.int64)
    M[1, -3:] = 0
    allow = (np.arange(S)[:, None] >= np.arange(S)[None, :])[None, None] & (M[:, None, None, :] != 0)
    want = np.where(allow, X, np.float32(-1e9)).astype(np.float32)
    assert_everywhere(g, [X, M], [want], kernels=1)


def test_the_padding_mask_gather_reads_the_mask_itself():
    """HF's padding mask is ``mask.to(bool)[batch_arange, kv_arange]``: a gather from a
    cast. The cast is computed at the gathered positions (the gather extracts the i64 mask
    and compares it there), so mask, gather and its consumer are one kernel."""
    g = Graph("hf_mask")
    scores, mask = g.input("scores", (B, 4, S, S)), g.input("mask", (B, S), "i64")
    as_bool = g.cast(mask, "i8", name="to_bool")
    batch = g.iota((B, 1, 1, 1), 0, dtype="i64", name="batch_arange")
    kv = g.iota((1, 1, 1, S), 3, dtype="i64", name="kv_arange")
    pad = g.index(as_bool, [batch, kv], name="padding")
    causal = g.ge(g.iota((1, 1, S, 1), 2, dtype="i64"), kv, name="causal")
    g.output(g.where(g.logical_and(causal, pad), scores, -1e9, name="masked"))
    X = RNG.standard_normal((B, 4, S, S)).astype(np.float32)
    M = np.ones((B, S), np.int64)
    M[0, -2:] = 0
    M[1, :3] = 7
    allow = (np.arange(S)[:, None] >= np.arange(S)[None, :])[None, None] & (M[:, None, None, :] != 0)
    assert_everywhere(g, [X, M], [np.where(allow, X, np.float32(-1e9)).astype(np.float32)], kernels=1)


def test_a_rewritten_gather_is_described_afresh():
    """Regression: inlining the cast into the gather's body rewrote the body but left the
    gather's cached description (payload, flops) as it was, for the rest of the run."""
    from opfuse.analysis.opinfo import describe_all, info_cache
    from opfuse.ir import parse_module
    from passes import fuse_recompute

    g = Graph("hf_mask_only")
    mask = g.input("mask", (B, S), "i64")
    as_bool = g.cast(mask, "i8", name="to_bool")
    batch = g.iota((B, 1, 1, 1), 0, dtype="i64", name="batch_arange")
    kv = g.iota((1, 1, 1, S), 3, dtype="i64", name="kv_arange")
    g.output(g.index(as_bool, [batch, kv], name="padding"))
    module = parse_module(g.to_mlir())
    func = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
    with info_cache():
        describe_all(func, [op.operation for op in func.regions[0].blocks[0].operations])
        fuse_recompute.run(module)
        ops = [op.operation for op in func.regions[0].blocks[0].operations]
        assert "to_bool" not in str(module)  # the cast was computed inside the gather
        cached = describe_all(func, ops)
    fresh = describe_all(func, ops)  # no cache: every op described from its IR now
    for op, c, f in zip(ops, cached, fresh):
        assert (c.payload, c.flops_per_point) == (f.payload, f.flops_per_point), op.name
