"""The one cost model. Every fusion decision asks ``guard``; nothing else decides.

    fuse(A, B)  <=>  R_fused < R_limit  and  (Q_unfused - Q_fused) / Q_unfused > delta

Q is bytes moved to and from device memory (each kernel reads its external inputs once and
writes each value that is used outside it once); R is registers per thread of the fused
kernel, estimated from its loads, stores and live scalars; W is flops. Also reported:
AI = W / Q and the seed's T_saved = (n - 1) * T_launch + sum(Q_intermediate) / B_mem.

A merge also saves launches (k groups become one kernel: k - 1 launches), which the
relative saving in bytes cannot see: a bias added after a matmul whose weight dominates
the bytes, or two kernels of a few hundred bytes each, save a launch (microseconds) and
some bytes, yet "save" under 10% of Q. So when the bytes alone do not clear delta, a merge
that strictly saves bytes is judged again in the seed's time, launches included:
``T = kernels * T_launch + Q / B_mem``, fused when ``(T_unfused - T_fused) / T_unfused >
delta`` (the ledger says so: "time saving ... with 1 launch saved"). The bytes decide
alone whenever they clear delta, so every merge the byte guard took is still taken, with
the same reason; a merge that moves more bytes is never taken for its launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import kinds
from ..errors import OpfuseError
from .targets import ATTENTION_THREADS, AttentionTile, Target, get_target  # noqa: F401


@dataclass(frozen=True)
class GuardOptions:
    """Thresholds of the guard; every fusion pass's Options carries these fields."""

    delta: float = 0.1
    r_limit: int = 0  # 0: the target's default_r_limit
    target: str = "sm_90"
    # R_fused from ptxas -v on the candidate kernel, built by the GPU emitters (falls back
    # to the estimate without ptxas); costs one kernel compilation per new candidate.
    measure_registers: bool = False

    def resolved_r_limit(self) -> int:
        return self.r_limit or get_target(self.target).default_r_limit


@dataclass
class Verdict:
    """The guard's answer, with every number it used."""

    fuse: bool
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    would_fuse_with: str | None = None


def guard(r_fused: int, q_unfused: int, q_fused: int, options: GuardOptions,
          launches_saved: int = 1) -> Verdict:
    """Decide one candidate. The first failing condition is the binding reason.

    ``launches_saved``: kernels the merge removes (a pair merged: 1; k groups as one
    candidate: k - 1, less any kernel the merge needs beside it). With none saved, or
    when the bytes alone clear delta, the decision is the bytes guard's; otherwise a merge
    that strictly saves bytes is fused if it saves delta of the time (module docstring).
    """
    r_limit = options.resolved_r_limit()
    saving = (q_unfused - q_fused) / q_unfused if q_unfused > 0 else 0.0
    numbers = {
        "r_fused": r_fused,
        "r_limit": r_limit,
        "q_unfused": q_unfused,
        "q_fused": q_fused,
        "saving": round(saving, 4),
        "delta": options.delta,
    }
    if r_fused >= r_limit:
        return Verdict(False, f"R_fused {r_fused} >= R_limit {r_limit}", numbers,
                       would_fuse_with=f"R_limit >= {r_fused + 1}")
    if saving <= options.delta and launches_saved > 0 and q_fused < q_unfused:
        target = get_target(options.target)
        t_unfused = (launches_saved + 1) * target.t_launch_s + q_unfused / target.b_mem
        t_fused = target.t_launch_s + q_fused / target.b_mem
        t_saving = (t_unfused - t_fused) / t_unfused
        numbers.update(launches_saved=launches_saved, t_unfused_us=round(t_unfused * 1e6, 3),
                       t_fused_us=round(t_fused * 1e6, 3), t_saving=round(t_saving, 4))
        launches = f"{launches_saved} launch{'es' if launches_saved > 1 else ''}"
        if t_saving > options.delta:
            return Verdict(True, f"saving {saving:.2f} <= delta {options.delta:.2f} in bytes, "
                                 f"time saving {t_saving:.2f} > delta with {launches} saved, "
                                 f"R_fused {r_fused} < R_limit {r_limit}", numbers)
        return Verdict(False, f"saving {saving:.2f} <= delta {options.delta:.2f} (time saving "
                              f"{t_saving:.2f} with {launches} saved)", numbers,
                       would_fuse_with=f"delta < {t_saving:.4f}" if t_saving > 0 else None)
    if saving <= options.delta:
        return Verdict(False, f"saving {saving:.2f} <= delta {options.delta:.2f}", numbers,
                       would_fuse_with=f"delta < {saving:.4f}" if saving > 0 else None)
    return Verdict(True, f"saving {saving:.2f} > delta {options.delta:.2f}, "
                         f"R_fused {r_fused} < R_limit {r_limit}", numbers)


def kernel_time_s(q: int, w: int, target: Target) -> float:
    """Roofline time of one kernel: its launch, then its bytes or its flops, whichever
    takes longer."""
    return target.t_launch_s + max(q / target.b_mem, w / target.f_peak)


def recompute_guard(r_fused: int, before: list[tuple[int, int]], after: list[tuple[int, int]],
                    options: GuardOptions) -> Verdict:
    """Decide recomputing a producer inside its consumers (it is read through a broadcast,
    so each consumer computes it again at every one of its own points).

    The seed's guard in time instead of bytes, because recomputation trades bytes for
    flops: ``before`` and ``after`` are the (Q, W) of each kernel concerned without and
    with the recomputation, each kernel takes ``kernel_time_s``, and

        fuse  <=>  R_fused < R_limit  and  (T_unfused - T_fused) / T_unfused > delta

    So extra flops W cost nothing while the kernel stays memory-bound, and a producer is
    never recomputed where its work would cost more time than its round trip through
    memory and its launch save.
    """
    target = get_target(options.target)
    r_limit = options.resolved_r_limit()
    t_unfused = sum(kernel_time_s(q, w, target) for q, w in before)
    t_fused = sum(kernel_time_s(q, w, target) for q, w in after)
    saving = (t_unfused - t_fused) / t_unfused if t_unfused > 0 else 0.0
    q_saved = sum(q for q, _ in before) - sum(q for q, _ in after)
    w_extra = sum(w for _, w in after) - sum(w for _, w in before)
    numbers = {
        "r_fused": r_fused,
        "r_limit": r_limit,
        "q_unfused": sum(q for q, _ in before),
        "q_fused": sum(q for q, _ in after),
        "w_extra": w_extra,
        "t_unfused_us": round(t_unfused * 1e6, 3),
        "t_fused_us": round(t_fused * 1e6, 3),
        "saving": round(saving, 4),
        "delta": options.delta,
    }
    if r_fused >= r_limit:
        return Verdict(False, f"R_fused {r_fused} >= R_limit {r_limit}", numbers,
                       would_fuse_with=f"R_limit >= {r_fused + 1}")
    what = f"W {w_extra:+d} flops, Q {-q_saved:+d} B"
    if saving <= options.delta:
        return Verdict(False, f"time saving {saving:.2f} <= delta {options.delta:.2f} ({what})",
                       numbers, would_fuse_with=f"delta < {saving:.4f}" if saving > 0 else None)
    return Verdict(True, f"time saving {saving:.2f} > delta {options.delta:.2f} ({what}), "
                         f"R_fused {r_fused} < R_limit {r_limit}", numbers)


# Register model, fitted to ptxas -v (CUDA 13.0, sm_90) on the kernels opfuse generates for
# G1-G8 at full size (`fuse-opt g.mlir --emit=cubin` measures, the ledger's R_fused
# estimates; `--measure-registers` uses the measurement instead). Measured: matmul kernels
# 39-56 whatever their epilogue (it runs on accumulators the tile already holds; the spread
# is ptxas scheduling the unrolled shared-memory slab), row kernels 27-40, the G2 loop
# kernel 29. The fit stays within +-10 registers of every measurement but one G7 matmul
# (+13), and grows with the kernel's buffers and live values, so the guard still binds on
# kernels that really hold many values at once.
REGS_PER_POINTER = 2  # 64-bit addresses
MATMUL_BASE_REGS = 41  # 4x4 accumulators, A/B fragments, staging values, slab addresses
MATMUL_FREE_LIVE = 5  # epilogue values that fit in registers the tile already uses
ROW_BASE_REGS = 24  # row index, lane/warp ids, loop bounds, the shuffle partners
# Convolution kernels (backends/gpu/emit/conv.py), measured the same way on 1x1 to 7x7 windows,
# strides 1-2, f32/f16/bf16, with and without padding: 32-80 (the unrolled window's loads
# are scheduled early); the fit (48 + pointers) is within +-25 of every one.
CONV_BASE_REGS = 48  # 4x4 accumulators, input vectors and filter values of the window
CONV_FREE_LIVE = 5  # epilogue values that fit in registers the tile already uses
LOOP_BASE_REGS = 4


def vector_width(element_bytes: int) -> int:
    """Elements per thread: one 16-byte vector."""
    return max(1, 16 // max(1, element_bytes))


def estimate_registers(kind: str, n_pointers: int, live_scalars: int, element_bytes: int) -> int:
    """Registers per thread of a fused kernel (see the fit above).

    Args:
        kind: the group's kind; its register model (:attr:`opfuse.kinds.Kind.registers`)
            picks the fit.
        n_pointers: distinct buffers read or written.
        live_scalars: peak scalars live per element (loaded values + payload temporaries).
        element_bytes: size of the widest element type.
    """
    pointers = REGS_PER_POINTER * n_pointers
    model = kinds.get(kind).registers
    if model == "conv":
        return CONV_BASE_REGS + pointers + max(0, live_scalars - CONV_FREE_LIVE)
    if model == "matmul":
        return MATMUL_BASE_REGS + pointers + max(0, live_scalars - MATMUL_FREE_LIVE)
    if model == "row":  # a row team (a scan's: row and lane ids, shuffles, a carry)
        return ROW_BASE_REGS + pointers + live_scalars
    # loop kernels: one 16-byte vector per value, about half of them live at once
    return LOOP_BASE_REGS + pointers + (vector_width(element_bytes) * live_scalars + 1) // 2


def attention_tile(target: Target | str, head_dim: int) -> AttentionTile:
    """The attention tile ``target`` uses for ``head_dim`` (the max of Q·Kᵀ's and V's)."""
    t = get_target(target) if isinstance(target, str) else target
    for tile in t.attention_tiles:
        if head_dim <= tile.head_dim:
            return tile
    return t.attention_tiles[-1]


# Attention kernels (backends/gpu/emit/attention.py), fitted to ptxas -v (CUDA 13.0, sm_90) like the
# matmul model: the per-thread S tile, O accumulators and row statistics, plus a base for
# indices, loop state and addresses.
ATTENTION_BASE_REGS = 40


def attention_registers(value_dim: int, n_pointers: int, target: str = "sm_90",
                        prologue_live: int = 0) -> int:
    """Registers per thread of an attention kernel whose result rows have ``value_dim``
    columns (the tile follows the head dim; see :func:`attention_tile`). A prologue on Q
    or K (rotary embedding) is evaluated an element at a time while its tile is staged,
    before that tile's S exists: its ``prologue_live`` values (one element's loads and
    temporaries) take S's registers, and only what exceeds them adds."""
    tile = attention_tile(target, value_dim)
    tx, ty = ATTENTION_THREADS
    rows = tile.block_m // ty
    s_regs = rows * (tile.block_n // tx)
    live = rows * (-(-value_dim // tx) + 3) + s_regs  # O, max/sum/Q, S
    extra = max(0, prologue_live - s_regs)
    return ATTENTION_BASE_REGS + REGS_PER_POINTER * n_pointers + live + extra


def prologue_l2_rereads(read_bytes: int, operand_bytes: int, reads_per_element: int) -> int:
    """Bytes an attention kernel reads again from L2 when a prologue computing its Q or K
    operand (``operand_bytes``) from ``read_bytes`` of inputs joins it. The kernel reads K
    once per query block (and per query head sharing a K/V head): with the prologue each
    of those ``reads_per_element`` reads fetches the prologue's inputs instead of the
    operand. Q is read once (``reads_per_element`` 1: nothing read again). Device memory
    sees each input once either way (the guard's bytes); this is L2 traffic (and the
    prologue's FLOPs, recomputed as often), which the guard does not weigh."""
    return max(0, read_bytes - operand_bytes) * max(0, reads_per_element - 1)


def t_saved(n_kernels: int, q_intermediate: int, target: Target) -> float:
    """Seconds saved by fusing n kernels: launches plus the intermediates' round trips."""
    return max(0, n_kernels - 1) * target.t_launch_s + q_intermediate / target.b_mem


def arithmetic_intensity(flops: int, q: int) -> float:
    return flops / q if q else float("inf")


__all__ = [
    "ATTENTION_BASE_REGS",
    "CONV_BASE_REGS",
    "CONV_FREE_LIVE",
    "GuardOptions",
    "LOOP_BASE_REGS",
    "MATMUL_BASE_REGS",
    "MATMUL_FREE_LIVE",
    "REGS_PER_POINTER",
    "ROW_BASE_REGS",
    "Verdict",
    "arithmetic_intensity",
    "attention_registers",
    "attention_tile",
    "estimate_registers",
    "guard",
    "kernel_time_s",
    "prologue_l2_rereads",
    "recompute_guard",
    "t_saved",
    "vector_width",
]
