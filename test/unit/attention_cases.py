"""Attention graphs over the issue's shapes and an independent float64 reference (no tests
here): the property tests of the attention kernels (GPU emulator, CPU backend) share them,
and :func:`cpu_outputs` runs a graph through either CPU attention kernel.

A case is batch, heads, K/V heads (grouped-query when fewer: K and V are broadcast to the
query heads, as ``repeat_kv`` does), query and key lengths, head dims of Q·Kᵀ and of V,
dtype, a causal mask (iota + compare + where, the form the builder and the importer
write) and an optional extra mask: a boolean input (True: attend) or an additive float
input, broadcast over heads. The reference computes in float64 from the inputs' values
with PyTorch SDPA's semantics: a row with every key masked gives 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import opfuse
from opfuse.builder import Graph
from opfuse.backends.cpu import attention_tiles as cpu_attention_tiles

#: Tolerances against the float64 reference, per dtype (accumulation is f32 everywhere;
#: f16/bf16 round S, the scaled scores and O to their type like the unfused graph does).
TOLERANCES = {"f32": (2e-4, 2e-5), "f16": (1e-2, 2e-3), "bf16": (3e-2, 2e-2)}


@dataclass(frozen=True)
class Case:
    batch: int = 1
    heads: int = 2
    kv_heads: int = 0  # 0: as many as query heads
    queries: int = 16
    keys: int = 0  # 0: as many as queries
    head_dim: int = 32
    value_dim: int = 0  # 0: the head dim
    dtype: str = "f32"
    causal: bool = False
    mask: str | None = None  # None, "bool" or "float"

    @property
    def kvh(self) -> int:
        return self.kv_heads or self.heads

    @property
    def n(self) -> int:
        return self.keys or self.queries

    @property
    def dv(self) -> int:
        return self.value_dim or self.head_dim

    def __str__(self) -> str:
        parts = [f"b{self.batch}h{self.heads}", f"kv{self.kvh}", f"q{self.queries}",
                 f"k{self.n}", f"d{self.head_dim}", f"v{self.dv}", self.dtype]
        if self.causal:
            parts.append("causal")
        if self.mask:
            parts.append(f"{self.mask}mask")
        return "-".join(parts)


def graph(c: Case) -> Graph:
    """softmax(Q Kᵀ / sqrt(d) [masked]) V for case ``c``."""
    g = Graph("attention", dtype=c.dtype)
    q = g.input("q", (c.batch, c.heads, c.queries, c.head_dim))
    k = g.input("k", (c.batch, c.kvh, c.n, c.head_dim))
    v = g.input("v", (c.batch, c.kvh, c.n, c.dv))
    mask = None
    if c.mask == "bool":
        mask = g.input("mask", (c.batch, 1, c.queries, c.n), "i8")
    elif c.mask == "float":
        mask = g.input("mask", (c.batch, 1, c.queries, c.n))
    if c.kvh != c.heads:
        k, v = _repeat_kv(g, k, c), _repeat_kv(g, v, c)
    s = g.matmul(q, g.transpose(k, (0, 1, 3, 2)), name="qk")
    s = g.mul(s, 1.0 / math.sqrt(c.head_dim), name="scale")
    if c.causal:
        # an integer iota, as torch's tril masks are: one in f16/bf16 is not exact past
        # 2048/256 and is not recognized as causal (the kernels would evaluate it as a
        # general mask on every tile and never skip a tile)
        keep = g.ge(g.iota((c.queries, c.n), 0, dtype="i64"),
                    g.iota((c.queries, c.n), 1, dtype="i64"), name="causal")
        s = g.where(keep, s, float("-inf"), name="causal_mask")
    if c.mask == "bool":
        s = g.where(mask, s, float("-inf"), name="bool_mask")
    elif c.mask == "float":
        s = g.add(s, mask, name="float_mask")
    g.output(g.matmul(g.softmax(s), v, name="pv"))
    return g


def _repeat_kv(g: Graph, x, c: Case):
    b, kvh, n, d = x.shape
    rep = c.heads // kvh
    x = g.reshape(x, (b, kvh, 1, n, d))
    x = g.broadcast_to(x, (b, kvh, rep, n, d))
    return g.reshape(x, (b, c.heads, n, d))


def inputs(g: Graph, c: Case, seed: int = 0) -> list[np.ndarray]:
    """Random inputs: Q, K, V uniform in [-1.5, 1.5) (so the softmax is not flat), the
    boolean mask keeping about 70% of the keys with some rows fully masked, the float
    mask 0 or -inf-ish."""
    values = g.random_inputs(seed, low=-1.5, high=1.5)
    rng = np.random.default_rng(seed + 1)
    if c.mask == "bool":
        keep = rng.random((c.batch, 1, c.queries, c.n)) < 0.7
        if c.queries > 2:
            keep[:, :, 1, :] = False  # a fully masked row: SDPA gives 0
        values["mask"] = keep.astype(np.int8)
    elif c.mask == "float":
        add = np.where(rng.random((c.batch, 1, c.queries, c.n)) < 0.8, 0.0, -1e4)
        values["mask"] = (add + rng.uniform(-0.5, 0.5, add.shape)).astype(values["mask"].dtype)
    return [values[t.name] for t in g.inputs]


def device_args(c: Case, args: list[np.ndarray]) -> list[np.ndarray]:
    """The arrays a compiled program takes: bf16 values as their 16-bit patterns."""
    from opfuse.runtime.schedule import float32_to_bf16_bits

    if c.dtype != "bf16":
        return args
    return [float32_to_bf16_bits(a) if a.dtype == np.float32 else a for a in args]


def host_values(c: Case, out: np.ndarray) -> np.ndarray:
    """A compiled program's result as values (bf16 bits back to float32)."""
    from opfuse.runtime.schedule import bf16_bits_to_float32

    return bf16_bits_to_float32(out) if c.dtype == "bf16" else np.asarray(out)


def reference(c: Case, args: list[np.ndarray]) -> np.ndarray:
    """float64 SDPA (fully masked rows give 0)."""
    q, k, v = (np.asarray(a, np.float64) for a in args[:3])
    rep = c.heads // c.kvh
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(c.head_dim)
    if c.causal:
        s = np.where(np.tril(np.ones((c.queries, c.n), bool)), s, -np.inf)
    if c.mask == "bool":
        s = np.where(args[3].astype(bool), s, -np.inf)
    elif c.mask == "float":
        s = s + np.asarray(args[3], np.float64)
    m = s.max(axis=-1, keepdims=True)
    dead = np.isneginf(m)
    e = np.exp(s - np.where(dead, 0.0, m))
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
    return p @ v


def assert_matches(c: Case, got: np.ndarray, args: list[np.ndarray]) -> None:
    """``got`` (a compiled program's result for ``args``, the values) against float64."""
    want = reference(c, args)
    rtol, atol = TOLERANCES[c.dtype]
    got = np.asarray(host_values(c, got), np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=str(c))


def mask_branches(program) -> list[tuple[dict[str, int], dict[str, int]]]:
    """For each ``scf.if`` of the kernels that yields a tile's scores (8 f32 results or
    more): the count of mask ops (``arith.cmpi``, ``arith.select``) and of ``arith.mulf``
    in its then-branch (tiles below the causal diagonal) and its else-branch."""
    from opfuse.ir import make_context, parse_module

    def walk(op, f):
        f(op)
        for r in op.regions:
            for b in r.blocks:
                for o in b.operations:
                    walk(o.operation, f)

    ifs = []
    module = parse_module(program.outlined_ir, make_context())
    walk(module.operation, lambda o: ifs.append(o) if o.name == "scf.if" and len(o.results) >= 8
         and all(str(r.type) == "f32" for r in o.results) else None)
    out = []
    for o in ifs:
        counts = []
        for region in o.regions:
            n: dict[str, int] = {}
            for b in region.blocks:
                for x in b.operations:
                    walk(x.operation, lambda y: n.__setitem__(y.name, n.get(y.name, 0) + 1))
            counts.append({k: n.get(k, 0) for k in ("arith.cmpi", "arith.select", "arith.mulf")})
        out.append(tuple(counts))
    return out


def cpu_outputs(graph, arguments, path: str, monkeypatch):
    """``graph`` compiled for the CPU and run on ``arguments`` through the tiled attention
    kernel (``path="tiles"``) or the one-row loops (``"rows"``: the tiles' workspace limit
    set to 0, and the warning that says so)."""
    if path == "tiles":
        return opfuse.compile(graph, backend="cpu")(*arguments)
    monkeypatch.setattr(cpu_attention_tiles, "WORKSPACE_LIMIT", 0)
    exe = opfuse.compile(graph, backend="cpu")
    with pytest.warns(UserWarning, match="one-row loops"):
        return exe(*arguments)  # the CPU code is made at the first call
