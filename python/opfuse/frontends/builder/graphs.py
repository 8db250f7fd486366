"""The benchmark graphs G1–G8, written with the builder (f32 by default).

``graphs()`` gives them at full size (what ``examples/make_graphs.py`` writes to
``examples/*.mlir``); ``graphs(small=True)`` (or ``scale=N``) divides every size by 8 (N)
but keeps head counts, for fast tests on the CPU; ``graphs(dtype="bf16")`` (or ``f16``)
gives the same graphs with every input in that element type (what real models run in:
the tensor-core matmul kernels are for these). ``example_inputs`` gives inputs whose
activations stay O(1), so references compare at f32 tolerances.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .graph import Graph, Tensor

SMALL_SCALE = 8
Size = Callable[[int], int]  # full-size dimension -> dimension at the chosen scale


def graphs(scale: int = 1, *, small: bool = False, dtype: str = "f32") -> dict[str, Graph]:
    """All G graphs by name (``g1_mlp`` … ``g8_x_minus_mean``), in order.

    Args:
        scale: Divide every size (batch, sequence, features) by this; head counts stay.
        small: Shorthand for ``scale=8``.
        dtype: Element type of every input (``f32``, ``f16`` or ``bf16``).
    """
    scale = SMALL_SCALE if small else scale
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")

    def s(n: int) -> int:
        return max(1, n // scale)

    return {name: build(s, dtype) for name, build in _GRAPHS.items()}


def example_inputs(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Uniform inputs in [-1, 1); weight matrices (2-D inputs named ``w*``) scaled by
    1/sqrt(fan_in), as common initializations do, so activations stay O(1)."""
    inputs = g.random_inputs(seed)
    for t in g.inputs:
        if t.name.startswith("w") and t.ndim == 2:
            w = inputs[t.name]
            inputs[t.name] = (w / math.sqrt(t.shape[0])).astype(w.dtype)
    return inputs


def g1_mlp(s: Size, dtype: str = "f32") -> Graph:
    n, d = s(2048), s(256)
    doc = f"G1 seed MLP: x {n}x{d}, Linear({d},{d}) -> GELU(tanh) -> Linear({d},{d}) -> GELU"
    g = Graph("g1_mlp", dtype=dtype, doc=doc)
    x = g.input("x", (n, d))
    w1, b1 = g.input("w1", (d, d)), g.input("b1", (d,))
    w2, b2 = g.input("w2", (d, d)), g.input("b2", (d,))
    h = g.gelu(_linear(g, x, w1, b1, "fc1"), name="gelu1")
    g.output(g.gelu(_linear(g, h, w2, b2, "fc2"), name="gelu2"))
    return g


def g2_elementwise_chain(s: Size, dtype: str = "f32") -> Graph:
    rows, n = s(4096), s(4096)  # two calls: a caller's Size may tell rows from columns
    doc = f"G2 elementwise chain relu(tanh(x*a+b)*c+d), x {rows}x{n}, a b c d row vectors ({n},)"
    g = Graph("g2_elementwise_chain", dtype=dtype, doc=doc)
    x = g.input("x", (rows, n))
    a, b, c, d = (g.input(v, (n,)) for v in "abcd")
    g.output(g.relu(g.tanh(x * a + b) * c + d))
    return g


def g3_softmax(s: Size, dtype: str = "f32") -> Graph:
    rows, n = s(4096), s(4096)
    g = Graph("g3_softmax", dtype=dtype, doc=f"G3 softmax over the last axis of {rows}x{n}")
    g.output(g.softmax(g.input("x", (rows, n)), axis=-1))
    return g


def g4_layernorm(s: Size, dtype: str = "f32") -> Graph:
    rows, n = s(4096), s(4096)
    doc = f"G4 layernorm with weight and bias over the last axis of {rows}x{n}, eps 1e-5"
    g = Graph("g4_layernorm", dtype=dtype, doc=doc)
    x, w, b = g.input("x", (rows, n)), g.input("weight", (n,)), g.input("bias", (n,))
    g.output(g.layernorm(x, w, b, eps=1e-5))
    return g


def g5_attention(s: Size, dtype: str = "f32") -> Graph:
    b, h, t, d = s(8), 8, s(512), s(64)
    doc = f"G5 attention softmax(Q K^T / sqrt({d})) V, Q K V [{b},{h},{t},{d}]"
    g = Graph("g5_attention", dtype=dtype, doc=doc)
    q, k, v = (g.input(n, (b, h, t, d)) for n in ("q", "k", "v"))
    g.output(_attention(g, q, k, v))
    return g


def g6_encoder_layer(s: Size, dtype: str = "f32") -> Graph:
    b, t, dm, heads, ff = s(8), s(256), s(512), 8, s(2048)
    doc = (
        f"G6 pre-norm transformer encoder layer: batch {b}, seq {t}, d_model {dm}, "
        f"{heads} heads, FFN {ff}, GELU(tanh)"
    )
    g = Graph("g6_encoder_layer", dtype=dtype, doc=doc)
    x = g.input("x", (b, t, dm))
    p = {"ln1_w": g.input("ln1_w", (dm,)), "ln1_b": g.input("ln1_b", (dm,))}
    for proj in "qkvo":
        p[f"w{proj}"], p[f"b{proj}"] = g.input(f"w{proj}", (dm, dm)), g.input(f"b{proj}", (dm,))
    p["ln2_w"], p["ln2_b"] = g.input("ln2_w", (dm,)), g.input("ln2_b", (dm,))
    p["w1"], p["b1"] = g.input("w1", (dm, ff)), g.input("b1", (ff,))
    p["w2"], p["b2"] = g.input("w2", (ff, dm)), g.input("b2", (dm,))

    tokens = g.reshape(x, (b * t, dm), name="tokens")
    h = g.layernorm(tokens, p["ln1_w"], p["ln1_b"], name="ln1")

    def heads_of(proj: str) -> Tensor:
        y = _linear(g, h, p[f"w{proj}"], p[f"b{proj}"], f"{proj}_proj")
        y = g.reshape(y, (b, t, heads, dm // heads), name=f"{proj}_split")
        return g.transpose(y, (0, 2, 1, 3), name=f"{proj}_heads")

    o = _attention(g, heads_of("q"), heads_of("k"), heads_of("v"))
    o = g.transpose(o, (0, 2, 1, 3), name="merge_heads")
    o = g.reshape(o, (b * t, dm), name="merge_heads.reshape")
    h1 = g.add(tokens, _linear(g, o, p["wo"], p["bo"], "o_proj"), name="residual1")
    f = g.layernorm(h1, p["ln2_w"], p["ln2_b"], name="ln2")
    f = g.gelu(_linear(g, f, p["w1"], p["b1"], "ffn1"))
    out = g.add(h1, _linear(g, f, p["w2"], p["b2"], "ffn2"), name="residual2")
    g.output(g.reshape(out, (b, t, dm), name="unflatten"))
    return g


def g7_rmsnorm_swiglu(s: Size, dtype: str = "f32") -> Graph:
    n, d, f = s(4096), s(1024), s(2816)
    doc = (
        f"G7 RMSNorm + SwiGLU MLP: x {n}x{d}, h = rmsnorm(x), "
        f"out = (silu(h @ w_gate) * (h @ w_up)) @ w_down, hidden {f}"
    )
    g = Graph("g7_rmsnorm_swiglu", dtype=dtype, doc=doc)
    x, w = g.input("x", (n, d)), g.input("norm_w", (d,))
    w_gate, w_up = g.input("w_gate", (d, f)), g.input("w_up", (d, f))
    w_down = g.input("w_down", (f, d))
    h = g.rms_norm(x, w, eps=1e-6, name="rms_norm")
    gate = g.silu(g.matmul(h, w_gate, name="gate_proj"))
    up = g.matmul(h, w_up, name="up_proj")
    g.output(g.matmul(g.mul(gate, up, name="swiglu"), w_down, name="down_proj"))
    return g


def g8_x_minus_mean(s: Size, dtype: str = "f32") -> Graph:
    rows, n = s(4096), s(4096)
    g = Graph("g8_x_minus_mean", dtype=dtype,
              doc=f"G8 x - mean(x, axis=-1, keepdims=True), {rows}x{n}")
    x = g.input("x", (rows, n))
    g.output(x - g.mean(x, axis=-1, keepdims=True))
    return g


def _attention(g: Graph, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(Q Kᵀ / sqrt(d)) V on [batch, heads, seq, head_dim] operands."""
    with g.scope("attn") as attn:
        k_t = g.transpose(k, (0, 1, 3, 2), name=f"{attn}.k_t")
        scores = g.matmul(q, k_t, name=f"{attn}.qk")
        p = g.softmax(g.mul(scores, 1.0 / math.sqrt(q.shape[-1]), name=f"{attn}.scale"))
        return g.matmul(p, v, name=f"{attn}.pv")


def _linear(g: Graph, x: Tensor, w: Tensor, b: Tensor, name: str) -> Tensor:
    """``x @ w + b``: a matmul named ``name`` and its bias add ``<name>.bias``."""
    return g.add(g.matmul(x, w, name=name), b, name=f"{name}.bias")


_GRAPHS: dict[str, Callable[[Size, str], Graph]] = {
    f.__name__: f
    for f in (
        g1_mlp,
        g2_elementwise_chain,
        g3_softmax,
        g4_layernorm,
        g5_attention,
        g6_encoder_layer,
        g7_rmsnorm_swiglu,
        g8_x_minus_mean,
    )
}
