"""The one table of GPU targets: the cost model's figures and the datasheet's, per chip.

The guard (:mod:`.guard`) prices fusion with ``t_launch_s``, ``b_mem`` and ``f_peak``; the
kernel-time estimates (:mod:`.gpu_time`) use the same bandwidth and FP32 peak plus the
SM counts, tensor peaks and per-SM limits. ``sm_90a`` (the wgmma target) is an H200 too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import OpfuseError


@dataclass(frozen=True)
class Target:
    """One GPU: what the cost model needs (the guard's R_limit, T_launch, B_mem, FP32 peak)
    and the datasheet figures the kernel-time estimates use (:mod:`.gpu_time`).

    Attributes:
        name: the chip, as ptxas spells it (``sm_90``).
        regs_per_sm, max_threads_per_sm: register file and thread slots of one SM.
        block_size: threads per block the emitters use for loop and row kernels.
        occupancy_target: fraction of max_threads_per_sm to keep resident; with
            block_size it fixes the default R_limit (see ``default_r_limit``).
        t_launch_s: cost of one kernel launch, seconds.
        b_mem: device memory bandwidth, bytes per second.
        f_peak: FP32 arithmetic throughput without tensor cores (FFMA), flops per second
            (what recomputed elementwise work runs at; see ``recompute_guard``).
        attention_tiles: the FlashAttention tiles by head dim.
        device: the GPU the figures are for (marketing name).
        sms: streaming multiprocessors.
        max_blocks_per_sm: resident blocks per SM.
        smem_per_sm: shared memory blocks may use per SM (bytes); ``smem_per_block`` the
            static limit of one block (what a kernel gets without opting in to more).
        tensor_flops: dense tensor-core peak per operand kind (the roofline's).
        mma_sync_flops: what ``mma.sync`` reaches per kind (on Hopper the warpgroup
            instruction ``wgmma`` is needed for the full tensor peak).
        sfu_per_s: special-function results per second (``ex2``: 16 per clock per SM).
        busy_warps_mma, busy_warps_ffma, busy_warps_wgmma: resident warps per SM that
            keep those pipes busy (assumptions; see :mod:`.gpu_time`).
    """

    name: str
    regs_per_sm: int
    max_threads_per_sm: int
    block_size: int
    occupancy_target: float
    t_launch_s: float
    b_mem: float
    f_peak: float
    attention_tiles: tuple["AttentionTile", ...] = ()
    device: str = ""
    sms: int = 0
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 48 * 1024
    tensor_flops: dict = field(default_factory=dict, hash=False, compare=False)
    mma_sync_flops: dict = field(default_factory=dict, hash=False, compare=False)
    sfu_per_s: float = 0.0
    busy_warps_mma: int = 8
    busy_warps_ffma: int = 16
    busy_warps_wgmma: int = 4

    @property
    def default_r_limit(self) -> int:
        """Registers per thread that keep ``occupancy_target`` of the SM's threads resident,
        rounded down to the allocation granule of 8, capped at the ISA's 255."""
        threads = self.max_threads_per_sm * self.occupancy_target
        threads = max(self.block_size, math.ceil(threads / self.block_size) * self.block_size)
        return min(255, (self.regs_per_sm // threads) // 8 * 8)

    @property
    def chip(self) -> str:
        return self.name

    @property
    def dram_bps(self) -> float:
        return self.b_mem

    @property
    def ffma_flops(self) -> float:
        return self.f_peak

    @property
    def l2_bps(self) -> float:
        """L2 bandwidth: an assumed 2x the DRAM's."""
        return 2.0 * self.b_mem


@dataclass(frozen=True)
class AttentionTile:
    """The FlashAttention kernel's tile for head dims up to ``head_dim``.

    Attributes:
        head_dim: the largest head dim (of Q·Kᵀ and of V) this tile serves.
        block_m: query rows per block (each block owns rows of one batch and head).
        block_n: keys per K/V tile staged in shared memory.
    """

    head_dim: int
    block_m: int
    block_n: int


#: Threads of an attention block: 16 along the keys (and value columns), 8 along the rows.
ATTENTION_THREADS = (16, 8)
#: Shared memory the attention kernel may use: the 48 KiB of static shared memory both
#: sm_80 and sm_90 give a kernel without opting in to more. Q (block_m x D), one K/V tile
#: (block_n x D, K then V) and P (block_m x block_n) are staged as f32.
ATTENTION_SMEM_BYTES = Target.smem_per_block
# Tiles by head dim, checked by ptxas (0 spills) and against the shared-memory budget:
# 32 -> 64x64 (32 KiB), 64 -> 64x32 (32 KiB), 128 -> 32x32 (36 KiB); larger head dims use
# the last tile with head dims padded in shared memory (the slower path).
_ATTENTION_TILES = (AttentionTile(32, 64, 64), AttentionTile(64, 64, 32),
                    AttentionTile(128, 32, 32))

# The one table of GPUs. Launch overhead and bandwidth are datasheet-level figures for
# A100-80GB SXM and H200 SXM (the benchmark suite measures them on a real GPU). A 25%
# occupancy target (16 warps per SM) is enough to keep HBM busy with 16-byte vector loads,
# and gives R_limit = 128. FP32 (no tensor cores): 19.5 TFLOP/s on A100, 67 on H200.
# H200 SXM: 132 SMs at 1.98 GHz boost, HBM3e 4.8 TB/s, dense FP16/BF16 989 TFLOP/s, TF32
# 494 (NVIDIA's H200 datasheet; the SM is the H100's). mma.sync on Hopper: assumed 62 % of
# the wgmma peak (the figure microbenchmark papers report for H800), until gpu-check
# measures it. A100 80GB SXM: 108 SMs, 2.0 TB/s, FP16/BF16 312, TF32 156; mma.sync is
# Ampere's native tensor-core instruction (its peak is the datasheet's).
TARGETS: dict[str, Target] = {
    "sm_80": Target(
        "sm_80", 65536, 2048, 256, 0.25, 4.0e-6, 2.0e12, 19.5e12, _ATTENTION_TILES,
        device="A100 80GB SXM", sms=108, smem_per_sm=164 * 1024,
        tensor_flops={"f16": 312e12, "bf16": 312e12, "tf32": 156e12},
        mma_sync_flops={"f16": 312e12, "bf16": 312e12, "tf32": 156e12},
        sfu_per_s=108 * 16 * 1.41e9),
    "sm_90": Target(
        "sm_90", 65536, 2048, 256, 0.25, 3.0e-6, 4.8e12, 67.0e12, _ATTENTION_TILES,
        device="H200 SXM", sms=132,
        tensor_flops={"f16": 989.4e12, "bf16": 989.4e12, "tf32": 494.7e12},
        mma_sync_flops={"f16": 0.62 * 989.4e12, "bf16": 0.62 * 989.4e12,
                        "tf32": 0.62 * 494.7e12},
        sfu_per_s=132 * 16 * 1.98e9),
}


def get_target(name: str) -> Target:
    """The preset for ``name``; unknown names are a user error listing the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        raise OpfuseError(f"unknown target '{name}' (known: {', '.join(sorted(TARGETS))})") from None


__all__ = [
    "ATTENTION_SMEM_BYTES",
    "ATTENTION_THREADS",
    "AttentionTile",
    "TARGETS",
    "Target",
    "get_target",
]
