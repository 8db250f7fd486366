"""jax.numpy (under jax.jit): the G graphs' ops, with jax.nn's composites where they exist.

Attention is written out: ``jax.nn.dot_product_attention`` wants [batch, seq, heads, dim]
operands, and XLA fuses the explicit form anyway.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

tanh = jnp.tanh
exp = jnp.exp
matmul = jnp.matmul
reshape = jnp.reshape
transpose = jnp.transpose
relu = jax.nn.relu
silu = jax.nn.silu


def mean(x):
    return jnp.mean(x, axis=-1, keepdims=True)


def gelu(x):
    return jax.nn.gelu(x, approximate=True)


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layernorm(x, weight, bias, eps):
    d = x - mean(x)
    return d * jax.lax.rsqrt(mean(d * d) + eps) * weight + bias


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(mean(x * x) + eps) * weight


def attention(q, k, v):
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * (1 / math.sqrt(q.shape[-1]))
    return jnp.matmul(softmax(scores), v)
