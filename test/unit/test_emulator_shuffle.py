"""The emulator's ``gpu.shuffle`` against hand-made examples of PTX's ``shfl.sync`` (ISA,
"shfl.sync": the source lane is ``lane - b`` (up), ``lane + b`` (down), ``lane ^ b``
(bfly) or ``b`` (idx) within the thread's segment of ``width`` lanes; a source outside
the segment leaves the thread its own value and the predicate false). Two warps of 32
threads; thread ``t`` offers ``100 + t``."""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.testing.emulator import emulate
from opfuse.ir import make_context, parse_module

KERNEL = """
func.func @k(%out: memref<64xi32>, %ok: memref<64xi32>) {
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c100 = arith.constant 100 : i32
  %off = arith.constant OFF : i32
  %width = arith.constant WIDTH : i32
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c64, %sy = %c1, %sz = %c1) {
    %t = arith.index_cast %tx : index to i32
    %v = arith.addi %t, %c100 : i32
    %r, %valid = gpu.shuffle MODE %v, %off, %width : i32
    memref.store %r, %out[%tx] : memref<64xi32>
    %p = arith.extui %valid : i1 to i32
    memref.store %p, %ok[%tx] : memref<64xi32>
    gpu.terminator
  }
  return
}
"""


def _shuffle(mode: str, off: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    text = KERNEL.replace("MODE", mode).replace("OFF", str(off)).replace("WIDTH", str(width))
    out, ok = np.zeros(64, np.int32), np.zeros(64, np.int32)
    emulate.Emulator(parse_module(text, make_context())).run("k", [out, ok])
    return out - 100, ok.astype(bool)  # the source thread of each value


def test_up_reads_the_lane_below_and_keeps_its_own_at_the_segment_start():
    src, ok = _shuffle("up", 2, 32)
    assert list(src[:5]) == [0, 1, 0, 1, 2] and list(ok[:5]) == [False, False, True, True, True]
    assert list(src[32:35]) == [32, 33, 32]  # the second warp starts its own segment
    assert src[63] == 61 and ok[63]


def test_down_reads_the_lane_above_and_keeps_its_own_at_the_segment_end():
    src, ok = _shuffle("down", 3, 32)
    assert list(src[27:32]) == [30, 31, 29, 30, 31]
    assert list(ok[27:32]) == [True, True, False, False, False]
    assert src[32] == 35 and ok[32]


def test_idx_broadcasts_one_lane_of_each_warp():
    src, ok = _shuffle("idx", 31, 32)
    assert list(src[:32]) == [31] * 32 and list(src[32:]) == [63] * 32 and ok.all()


def test_xor_swaps_within_the_butterfly():
    src, ok = _shuffle("xor", 1, 32)
    assert list(src[:4]) == [1, 0, 3, 2] and src[63] == 62 and ok.all()


@pytest.mark.parametrize("mode, want", [
    ("up", [8, 8, 9, 10]),  # lanes 8..11: lane 8 starts a segment of 8
    ("down", [9, 10, 11, 12]),
    ("idx", [9, 9, 9, 9]),  # lane 1 of the segment 8..15
])
def test_segments_of_a_narrower_width(mode, want):
    src, ok = _shuffle(mode, 1, 8)
    assert list(src[8:12]) == want
    if mode == "up":
        assert not ok[8] and ok[9]
    if mode == "down":
        assert src[15] == 15 and not ok[15]  # the segment's last lane
