"""The PyTorch models the torch tests share (imported after ``pytest.importorskip("torch")``)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def seed_mlp(d: int = 256, approximate: str = "tanh") -> nn.Module:
    """The seed's demo: Linear(d,d) -> GELU -> Linear(d,d) -> GELU (G1 uses tanh GELU)."""
    return nn.Sequential(
        nn.Linear(d, d), nn.GELU(approximate), nn.Linear(d, d), nn.GELU(approximate)
    )


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Attention(nn.Module):
    """softmax(Q Kᵀ / sqrt(d)) V written with matmuls (G5)."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


class RMSNormSwiGLU(nn.Module):
    """G7: down(silu(gate(h)) * up(h)) with h = RMSNorm(x)."""

    def __init__(self, d: int = 256, hidden: int = 512):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return self.down(F.silu(self.gate(h)) * self.up(h))


def encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=256, nhead=4, batch_first=True)
