"""Composite ops of the builder ``Graph``: ``gelu``, ``silu``, ``softmax``, ``layernorm`` and
``rms_norm``, chains of the other ops, one generic per step, never pre-fused (see
``opfuse.frontends.builder.graph``).
"""

from __future__ import annotations

import math

from ...errors import OpfuseError
from .core import GraphCore
from .tensor import Tensor


class CompositeOps(GraphCore):
    """Ops written with the elementwise ops and reductions of the ``Graph`` they join."""

    # ----------------------------------------------------------------- compositions

    def gelu(self, x: Tensor, approximate: str = "tanh", *, name: str | None = None) -> Tensor:
        """GELU as a chain of elementwise ops (one generic each).

        Args:
            x: Input.
            approximate: ``"tanh"``: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)));
                ``"none"``: 0.5·x·(1 + erf(x/√2)).
            name: Scope name of the chain.
        """
        if approximate not in ("tanh", "none"):
            raise OpfuseError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
        with self._composite(name, "gelu"):
            if approximate == "tanh":
                inner = self.add(x, self.mul(self.pow(x, 3), 0.044715))
                t = self.tanh(self.mul(inner, math.sqrt(2.0 / math.pi)))
            else:
                t = self.erf(self.mul(x, 1.0 / math.sqrt(2.0)))
            return self.mul(self.mul(x, self.add(t, 1.0)), 0.5)

    def silu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """``x * sigmoid(x)``."""
        with self._composite(name, "silu"):
            return self.mul(x, self.sigmoid(x))

    def softmax(self, x: Tensor, axis: int = -1, *, name: str | None = None) -> Tensor:
        """Softmax along ``axis``: exp(x - max) / sum(exp(x - max))."""
        with self._composite(name, "softmax"):
            e = self.exp(self.sub(x, self.max(x, axis, keepdims=True)))
            return self.div(e, self.sum(e, axis, keepdims=True))

    def layernorm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Layer normalization over the last axis (biased variance), optional affine."""
        with self._composite(name, "layernorm"):
            d = self.sub(x, self.mean(x, -1, keepdims=True))
            var = self.mean(self.mul(d, d), -1, keepdims=True)
            y = self.mul(d, self.rsqrt(self.add(var, eps)))
            if weight is not None:
                y = self.mul(y, weight)
            return y if bias is None else self.add(y, bias)

    def rms_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        eps: float = 1e-6,
        *,
        name: str | None = None,
    ) -> Tensor:
        """RMS normalization over the last axis: x · rsqrt(mean(x²) + eps) · weight."""
        with self._composite(name, "rms_norm"):
            ms = self.mean(self.mul(x, x), -1, keepdims=True)
            y = self.mul(x, self.rsqrt(self.add(ms, eps)))
            return y if weight is None else self.mul(y, weight)
