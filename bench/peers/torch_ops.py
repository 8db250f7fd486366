"""torch (eager and torch.compile): the G graphs' ops, with torch's own composites."""

from __future__ import annotations

import torch
import torch.nn.functional as F

tanh = torch.tanh
exp = torch.exp
matmul = torch.matmul
relu = torch.relu
silu = F.silu
# [batch, heads, seq, head_dim], default scale 1/sqrt(head_dim): the builder's attention
attention = F.scaled_dot_product_attention


def reshape(x, shape):
    return x.reshape(shape)


def transpose(x, perm):
    return x.permute(perm)


def mean(x):
    return x.mean(dim=-1, keepdim=True)


def gelu(x):
    return F.gelu(x, approximate="tanh")


def softmax(x):
    return torch.softmax(x, dim=-1)


def layernorm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
