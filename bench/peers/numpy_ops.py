"""numpy eager in float32: the G graphs' ops spelled out (numpy has no composites).

Python scalars keep float32 (NEP 50), so nothing is silently computed in float64.
"""

from __future__ import annotations

import math

import numpy as np

tanh = np.tanh
exp = np.exp
matmul = np.matmul
reshape = np.reshape
transpose = np.transpose


def relu(x):
    return np.maximum(x, 0)


def mean(x):
    return np.mean(x, axis=-1, keepdims=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def gelu(x):
    # x*x*x, not x**3: numpy's power has no fast path for 3 and would dominate the graph
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layernorm(x, weight, bias, eps):
    d = x - mean(x)
    return d / np.sqrt(mean(d * d) + eps) * weight + bias


def rms_norm(x, weight, eps):
    return x / np.sqrt(mean(x * x) + eps) * weight


def attention(q, k, v):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * (1 / math.sqrt(q.shape[-1]))
    return np.matmul(softmax(scores), v)
