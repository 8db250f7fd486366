"""Block tiles of the tensor-core matmul: target data, chosen per problem size.

A :class:`Tiles` is a block tile ``bm x bn`` of C, the K slab ``bk`` staged per pipeline
step, the warp grid ``warps_m x warps_n`` (each warp computes ``bm/warps_m x bn/warps_n``
as 16x8 MMA tiles) and the pipeline depth (``stages`` slabs in flight in shared memory).
:data:`CANDIDATES` lists them from the largest tile (most reuse per byte staged) to the
smallest (most blocks). :func:`choose` takes, for one contraction, the candidate the
analytic model (:mod:`opfuse.cost.gpu_time`) says is fastest on the target: a large problem gets
128x128 tiles, a small one (G1's 2048x256 outputs) smaller tiles so that its blocks still
fill the 132 SMs of an H200 instead of leaving most of them idle (small tiles are this
emitter's answer to small M·N; it does not split K).

Stages are as many as fit in the 48 KB of static shared memory a block may have (at most
4, at least 2); a slab is ``bk`` deep along K (32 for 16-bit types: two m16n8k16 steps;
16 for tf32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ....cost import gpu_time as estimate
from .mma import MmaKind, shared_ld

MAX_STAGES = 4


@dataclass(frozen=True)
class Tiles:
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_m(self) -> int:
        return self.bm // self.warps_m

    @property
    def warp_n(self) -> int:
        return self.bn // self.warps_n


#: (bm, bn, warps_m, warps_n), largest first. Warp tiles are multiples of 16x16 (A is
#: loaded 16 rows at a time, B 16 columns at a time: one ldmatrix.x4 for two 8-wide tiles).
CANDIDATES = (
    (128, 128, 2, 4),
    (128, 64, 2, 2),
    (64, 128, 2, 2),
    (64, 64, 2, 2),
    (64, 32, 2, 2),
    (32, 64, 2, 2),
    (32, 32, 2, 2),
)


def stage_bytes(bm: int, bn: int, bk: int, kind: MmaKind, a_k_major: bool, b_k_major: bool) -> int:
    """Shared-memory bytes of one pipeline stage (A and B slabs, padded rows)."""
    e = kind.element_bytes
    a = bm * shared_ld(bk, kind, True) if a_k_major else bk * shared_ld(bm, kind, False)
    b = bn * shared_ld(bk, kind, True) if b_k_major else bk * shared_ld(bn, kind, False)
    return (a + b) * e


def estimate_registers(t: Tiles, kind: MmaKind) -> int:
    """Registers per thread of the kernel: accumulators (4 per 16x8 tile), one k-step of
    A and B fragments, and ~40 for addresses, indices and the epilogue (checked against
    ptxas on the G graphs)."""
    tiles = (t.warp_m // 16) * (t.warp_n // 8)
    frags = (t.warp_m // 16) * kind.a_regs + (t.warp_n // 8) * kind.b_regs
    return 4 * tiles + frags + 40


@dataclass(frozen=True)
class Rules:
    """What differs between the tensor-core instructions' tiles.

    Attributes:
        candidates: ``(bm, bn, warps_m, warps_n)``, largest first.
        stage_bytes: ``(bm, bn, bk, kind, a_k_major, b_k_major)`` -> bytes of one stage.
        registers: ``(tiles, kind)`` -> estimated registers per thread.
        instruction: the estimate's rate (``mma.sync`` or ``wgmma``).
    """

    candidates: tuple
    stage_bytes: Callable[..., int]
    registers: Callable[..., int]
    instruction: str = "mma.sync"


#: ``mma.sync`` warps (:mod:`opfuse.backends.gpu.emit.matmul_mma`).
MMA_SYNC = Rules(CANDIDATES, stage_bytes, estimate_registers)


def configure(bm, bn, wm, wn, K: int, kind: MmaKind, a_k_major: bool, b_k_major: bool, smem_cap,
              rules: Rules = MMA_SYNC):
    slab = 32 if kind.element_bytes == 2 else 16
    bk = min(slab, -(-K // kind.k) * kind.k)
    per = rules.stage_bytes(bm, bn, bk, kind, a_k_major, b_k_major)
    stages = min(MAX_STAGES, smem_cap // per)
    if stages < 2:
        return None
    return Tiles(bm, bn, bk, wm, wn, stages), per * stages


def choose(
    M: int, N: int, K: int, batch: int, kind: MmaKind, chip: str, a_k_major: bool, b_k_major: bool,
    rules: Rules = MMA_SYNC,
) -> Tiles:
    """The fastest candidate by the analytic model (ties: the larger tile)."""
    dev = estimate.device(chip)
    best, best_t = None, None
    for bm, bn, wm, wn in rules.candidates:
        made = configure(bm, bn, wm, wn, K, kind, a_k_major, b_k_major, dev.smem_per_block, rules)
        if made is None:
            continue
        t, smem = made
        grid = (-(-N // bn), -(-M // bm), batch)
        executed = 2.0 * grid[0] * bn * grid[1] * bm * batch * (-(-K // t.bk) * t.bk)
        moved = kind.element_bytes * batch * (M * K * grid[0] + K * N * grid[1])
        unique = kind.element_bytes * batch * (M * K + K * N) + 4 * batch * M * N
        est = estimate.kernel_estimate(
            dev,
            grid=grid,
            threads=t.threads,
            registers=rules.registers(t, kind),
            smem=smem,
            flops=executed,
            bytes_=unique,
            kind=kind.name,
            l2_bytes=moved,
            instruction=rules.instruction,
        )
        if "estimate_s" not in est:
            continue
        if best_t is None or est["estimate_s"] < best_t * 0.999:
            best, best_t = t, est["estimate_s"]
    assert best is not None, "no tile candidate fits in shared memory"
    return best


__all__ = ["CANDIDATES", "MMA_SYNC", "Rules", "Tiles", "choose", "configure",
           "estimate_registers", "stage_bytes"]
