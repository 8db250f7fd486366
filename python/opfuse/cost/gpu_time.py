"""Analytic kernel-time estimates for a GPU we do not have (always labelled "estimate").

From what the compiler knows of a kernel (launch shape, registers per thread from ptxas or
a formula, shared memory, executed FLOPs, device bytes) and a device description, the
estimate is the larger of

* compute: the busiest SM runs ``ceil(blocks / SMs)`` blocks; its share of the device's
  peak (tensor-core ``mma.sync`` for MMA kernels, the dense tensor peak for ``wgmma``
  kernels, FFMA otherwise) bounds how fast, scaled down when fewer warps are resident on
  the SM than it takes to keep the pipes busy (assumed: 8 warps for mma.sync, two per
  scheduler; one warpgroup for wgmma; 16 for FFMA);
* memory: the kernel's device-memory bytes at the device's bandwidth, and the bytes its
  blocks read from L2 (a matmul's operand tiles, each read by every block of its row or
  column of the grid) at the L2's (an assumed 2x the DRAM bandwidth);

next to occupancy (blocks per SM from registers, shared memory and threads; the fraction
of the SM's thread slots they fill) and waves (``ceil(blocks / (SMs x blocks per SM))``).
Beyond that warp count it does not model latency (launch, pipeline fill, the epilogue),
bank conflicts or clock throttling: it shows the gap to the roofline that tiling and
occupancy explain, and ``tools/gpu/gpu-check`` measures the rest on a device.

Attention kernels (:func:`attention_kernel`) add their exponentials at the SFU rate to the
compute time and count the key tiles a causal mask lets them skip.

The matmul emitter uses the same model to choose block tiles (:mod:`opfuse.backends.gpu.build.matmul_tiles`), and
the benchmark suite reports it per matmul and attention kernel next to the roofline
(``max(FLOPs / peak, bytes / bandwidth)`` with the device's best peak for the operand type).
"""

from __future__ import annotations

import math
from typing import Sequence

from .targets import TARGETS, Target


#: The device figures are the targets' (one table: :mod:`.targets`).
Device = Target
H200 = TARGETS["sm_90"]
A100 = TARGETS["sm_80"]
DEVICES = {"sm_90": H200, "sm_90a": H200, "sm_80": A100}


def device(chip: str) -> Device:
    """The device estimates are made for when compiling for ``chip`` (sm_90: H200)."""
    return DEVICES.get(chip, H200)


def blocks_per_sm(dev: Device, threads: int, registers: int, smem: int) -> int:
    """Resident blocks per SM: registers (allocated per warp in units of 256), shared
    memory (plus the 1 KB the driver reserves per block), thread slots, the block cap."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(1, registers) * 32 // 256) * 256
    by_regs = dev.regs_per_sm // (regs_per_warp * warps)
    by_smem = dev.smem_per_sm // (smem + 1024) if smem else dev.max_blocks_per_sm
    by_threads = dev.max_threads_per_sm // (warps * 32)
    return max(0, min(by_regs, by_smem, by_threads, dev.max_blocks_per_sm))


def kernel_estimate(
    dev: Device,
    *,
    grid: tuple,
    threads: int,
    registers: int,
    smem: int,
    flops: float,
    bytes_: float,
    kind: str | None,
    l2_bytes: float = 0.0,
    sfu_ops: float = 0.0,
    instruction: str | None = None,
) -> dict:
    """The estimate of one kernel (module docstring) as a JSON-ready dict.

    Args:
        flops: FLOPs the kernel executes (tiles padded to their full size for MMA).
        bytes_: device-memory bytes read and written.
        l2_bytes: bytes the blocks read through L2 (0: not known).
        kind: ``f16``, ``bf16``, ``tf32`` for tensor-core kernels, None for FFMA.
        sfu_ops: special-function results (an attention's exponentials), whose time on
            the busiest SM is added to the compute time.
        instruction: ``wgmma`` for warpgroup-MMA kernels (the dense tensor peak), else
            ``mma.sync`` rates for tensor-core kinds.
    """
    blocks = math.prod(grid)
    bps = blocks_per_sm(dev, threads, registers, smem)
    wgmma = bool(kind) and instruction == "wgmma"
    peak = (dev.tensor_flops if wgmma else dev.mma_sync_flops)[kind] if kind else dev.ffma_flops
    if bps == 0:
        return {"not_available": f"a block does not fit on an SM ({registers} registers, "
                                 f"{smem} bytes of shared memory, {threads} threads)"}
    per_sm = -(-blocks // dev.sms)  # blocks the busiest SM runs, one after another or together
    warps = min(bps, per_sm) * -(-threads // 32)  # resident on the busiest SM
    needed = dev.busy_warps_wgmma if wgmma else dev.busy_warps_mma if kind else dev.busy_warps_ffma
    busy = min(1.0, warps / needed)
    t_compute = per_sm * (flops / blocks) / (peak / dev.sms * busy)
    if sfu_ops:
        t_compute += per_sm * (sfu_ops / blocks) / (dev.sfu_per_s / dev.sms * busy)
    t_memory = max(bytes_ / dev.dram_bps, l2_bytes / dev.l2_bps)
    t = max(t_compute, t_memory)
    return {
        "device": dev.device,
        "estimate_s": t,
        "compute_s": t_compute,
        "memory_s": t_memory,
        "bound": "compute" if t_compute >= t_memory else "memory",
        "blocks": blocks,
        "blocks_per_sm": bps,
        "waves": -(-blocks // (dev.sms * bps)),
        "occupancy": round(min(bps, per_sm) * threads / dev.max_threads_per_sm, 4),
        "pipe_busy": round(busy, 3),
        "peak_flops_used": peak,
    }


def roofline(dev: Device, flops: float, bytes_: float, kind: str | None) -> float:
    """Seconds at the device's best: FLOPs at its peak for the operand kind (the dense
    tensor peak for f16/bf16/tf32, FFMA for f32), bytes at its bandwidth."""
    peak = dev.tensor_flops[kind] if kind else dev.ffma_flops
    return max(flops / peak, bytes_ / dev.dram_bps)


def matmul_kernel(
    dev: Device,
    *,
    grid: Sequence[int],
    block: Sequence[int],
    meta: dict,
    flops: float,
    bytes_: float,
    registers: int | None,
    smem: int | None,
) -> dict:
    """The estimate of one matmul kernel from its KernelSpec facts (``meta``: the tile,
    the problem ``[batch, M, N, K]``, for a horizontal kernel its N ``ranges`` (a grouped one:
    each range's ``problems`` ``[M, N, K]``), the
    ``products`` each range's blocks run and whether they share their A tiles
    (``shared_a``), the MMA kind or none, the operand type) and the
    fusion report's FLOPs and bytes, next to the roofline of its problem: the dense tensor
    peak for f16/bf16 operands (and TF32 when the kernel uses it), FFMA for f32.

    ``registers`` and ``smem`` come from ptxas; without ptxas 128 registers are assumed
    (said in ``registers_from``) and shared memory from the tile."""
    operands = meta.get("operands", "f32")
    executed, l2 = float(flops), 0.0
    if meta.get("tile") and meta.get("problem"):
        bm, bn, bk = meta["tile"]
        batch, M, N, K = meta["problem"]
        elem = 4 if operands == "f32" else 2
        if meta.get("problems"):  # a grouped kernel: each range its own M, N and K
            def up(x: int, b: int) -> int:
                return -(-x // b) * b
            executed = sum(2.0 * batch * up(m, bm) * up(n, bn) * up(k, bk)
                           for m, n, k in meta["problems"])
            l2 = float(sum(elem * batch * (m * k * -(-n // bn) + k * n * -(-m // bm))
                           for m, n, k in meta["problems"]))
            return _estimated(dev, grid, block, meta, flops, bytes_, registers, smem,
                              executed=executed, l2=l2)
        # a horizontal kernel: N ranges side by side (tiles padded per range), each block
        # of a range running that range's products (SwiGLU: gate and up)
        ranges = meta.get("ranges") or [N]
        products = meta.get("products") or [1] * len(ranges)
        col_blocks = [-(-n // bn) for n in ranges]
        columns = sum(p * c * bn for p, c in zip(products, col_blocks))
        executed = 2.0 * batch * (-(-M // bm) * bm) * columns * (-(-K // bk) * bk)
        b_cols = sum(p * n for p, n in zip(products, ranges))
        # a block reads its A tiles once per product (opfuse's horizontal kernels run the
        # products' main loops one after the other, restaging A), or once when its products
        # share them (``shared_a``: one loop with two accumulators, Triton's SwiGLU)
        a_reads = sum(c * (1 if meta.get("shared_a") else p) for p, c in zip(products, col_blocks))
        l2 = float(elem * batch * (M * K * a_reads + K * b_cols * -(-M // bm)))
    return _estimated(dev, grid, block, meta, flops, bytes_, registers, smem,
                      executed=executed, l2=l2)


def _estimated(dev: Device, grid, block, meta: dict, flops: float, bytes_: float,
               registers: int | None, smem: int | None, *, executed: float, l2: float,
               sfu: float = 0.0) -> dict:
    """:func:`kernel_estimate` of the FLOPs a kernel executes, with the report's figures
    and the roofline of its problem (the dense tensor peak for f16/bf16 operands, and TF32
    when the kernel uses it; FFMA for f32) beside it."""
    kind = meta.get("mma")
    operands = meta.get("operands", "f32")
    est = kernel_estimate(
        dev,
        grid=tuple(grid),
        threads=math.prod(block),
        registers=registers or 128,
        smem=smem or 0,
        flops=executed,
        bytes_=bytes_,
        kind=kind,
        l2_bytes=l2,
        sfu_ops=sfu,
        instruction=meta.get("instruction"),
    )
    best = kind or (operands if operands in ("f16", "bf16") else None)
    est.update(
        {
            "flops": float(flops),
            "executed_flops": executed,
            "bytes": float(bytes_),
            "registers": registers or 128,
            "registers_from": "ptxas" if registers else "assumed",
            "roofline_s": roofline(dev, flops, bytes_, best),
        }
    )
    return est


def attention_kernel(
    dev: Device,
    *,
    grid: Sequence[int],
    block: Sequence[int],
    meta: dict,
    flops: float,
    bytes_: float,
    registers: int | None,
    smem: int | None,
) -> dict:
    """The estimate of one attention kernel (FlashAttention-2: backends/gpu/emit/attention_mma.py on
    tensor cores, backends/gpu/emit/attention.py on FFMA) from its KernelSpec facts (``meta``: the
    tile ``[block_m, block_n]``, the problem ``[batch x heads, M, N, D, Dv]``, the head
    dims as padded in shared memory, the causal offset, the MMA kind or none) and the
    report's FLOPs and bytes, next to the roofline.

    What it executes is counted per query block: its key tiles (all of them, or up to the
    causal diagonal), each ``2 block_m block_n (D + Dv)`` FLOPs at the padded head dims
    and ``block_m block_n`` exponentials (the SFU: 16 per clock per SM, added to the
    product time: FlashAttention-2 does not overlap them); every block reads its K and V
    tiles through L2."""
    G, M, N, D, Dv = meta["problem"]
    bm, bn = meta["tile"]
    dp, dvp = meta.get("padded", (D, Dv))
    c = meta.get("causal")
    elem = 4 if meta.get("operands", "f32") == "f32" else 2
    key_slots = 0
    for b in range(-(-M // bm)):
        end = N if c is None else min(N, max(0, b * bm + bm + c))
        key_slots += -(-end // bn) * bn
    exps = float(G * bm * key_slots)
    est = _estimated(dev, grid, block, meta, flops, bytes_, registers, smem,
                     executed=2.0 * G * bm * key_slots * (dp + dvp),
                     l2=float(G * key_slots * (D + Dv) * elem), sfu=exps)
    est["exponentials"] = exps
    return est


def for_emitter(emitter: str):
    """The estimate function of an emitter's kernels (:func:`matmul_kernel`,
    :func:`attention_kernel`); None for kernels not estimated."""
    return {
        "mma": matmul_kernel,
        "matmul": matmul_kernel,
        # one matmul over the concatenated N ranges (meta's problem N is their sum)
        "horizontal_mma": matmul_kernel,
        "horizontal": matmul_kernel,
        "wgmma": matmul_kernel,
        "horizontal_wgmma": matmul_kernel,
        "attention_mma": attention_kernel,
        "attention": attention_kernel,
    }.get(emitter)


__all__ = [
    "A100",
    "DEVICES",
    "Device",
    "H200",
    "attention_kernel",
    "blocks_per_sm",
    "device",
    "for_emitter",
    "kernel_estimate",
    "matmul_kernel",
    "roofline",
]
