"""The G1–G8 graphs for the peers, written once against a small ops namespace.

Each function takes ``ops`` (one of :mod:`bench.peers.numpy_ops`, ``torch_ops``,
``jax_ops``) and the graph's inputs positionally, in the order of the builder graph's
inputs (``opfuse.frontends.builder.graphs``), and returns the one output. Shapes come from the
inputs, so every scale works.

Composite ops (``gelu``, ``softmax``, ``layernorm``, ``rms_norm``, ``silu``,
``attention``) are the namespace's own: each peer uses its library's idiomatic op where
one exists (``torch.nn.functional.layer_norm``, ``jax.nn.softmax``, ...), which is what
a user of that library would write; numpy spells them out. Every peer's result is checked
against the builder graph's float64 reference, so the namespaces cannot drift apart from
the MLIR the opfuse side compiles.
"""

from __future__ import annotations

from typing import Any, Callable

HEADS = 8  # the G6 encoder's head count (kept at every scale, like the builder)


def g1_mlp(o: Any, x, w1, b1, w2, b2):
    """Linear -> GELU(tanh) -> Linear -> GELU(tanh)."""
    h = o.gelu(o.matmul(x, w1) + b1)
    return o.gelu(o.matmul(h, w2) + b2)


def g2_elementwise_chain(o: Any, x, a, b, c, d):
    """relu(tanh(x*a+b)*c+d)."""
    return o.relu(o.tanh(x * a + b) * c + d)


def g3_softmax(o: Any, x):
    """Softmax over the last axis."""
    return o.softmax(x)


def g4_layernorm(o: Any, x, weight, bias):
    """Layer norm over the last axis with weight and bias, eps 1e-5."""
    return o.layernorm(x, weight, bias, 1e-5)


def g5_attention(o: Any, q, k, v):
    """softmax(Q Kᵀ / sqrt(d)) V on [batch, heads, seq, head_dim]."""
    return o.attention(q, k, v)


def g6_encoder_layer(o: Any, x, ln1_w, ln1_b, wq, bq, wk, bk, wv, bv, wo, bo,
                     ln2_w, ln2_b, w1, b1, w2, b2):
    """Pre-norm transformer encoder layer (GELU(tanh) FFN), as the builder writes it."""
    b, t, dm = x.shape
    tokens = o.reshape(x, (b * t, dm))
    h = o.layernorm(tokens, ln1_w, ln1_b, 1e-5)

    def heads_of(w, bias):
        y = o.reshape(o.matmul(h, w) + bias, (b, t, HEADS, dm // HEADS))
        return o.transpose(y, (0, 2, 1, 3))

    att = o.attention(heads_of(wq, bq), heads_of(wk, bk), heads_of(wv, bv))
    att = o.reshape(o.transpose(att, (0, 2, 1, 3)), (b * t, dm))
    h1 = tokens + (o.matmul(att, wo) + bo)
    f = o.gelu(o.matmul(o.layernorm(h1, ln2_w, ln2_b, 1e-5), w1) + b1)
    return o.reshape(h1 + (o.matmul(f, w2) + b2), (b, t, dm))


def g7_rmsnorm_swiglu(o: Any, x, norm_w, w_gate, w_up, w_down):
    """(silu(rmsnorm(x) @ w_gate) * (rmsnorm(x) @ w_up)) @ w_down, eps 1e-6."""
    h = o.rms_norm(x, norm_w, 1e-6)
    return o.matmul(o.silu(o.matmul(h, w_gate)) * o.matmul(h, w_up), w_down)


def g8_x_minus_mean(o: Any, x):
    """x - mean(x, axis=-1, keepdims=True)."""
    return x - o.mean(x)


MODELS: dict[str, Callable[..., Any]] = {
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
