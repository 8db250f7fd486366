"""Integer tensors end to end (i64 and i32: token ids, positions, masks built from them) and
``cumsum``: the builder's numpy reference against numpy, CPU runs fused and unfused, and the
GPU kernels in the emulator (race check on), and the torch importer on the position ids
RoBERTa builds from its attention mask (int32 arithmetic, a cumsum, casts)."""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.builder import Graph
from test_codegen_common import assert_everywhere as _check

RNG = np.random.default_rng(0)


def test_position_ids_from_an_attention_mask():
    """RoBERTa: ``(cumsum(mask.int(), 1) * mask).long() + padding_idx``, in int32 then
    int64, with float results of the same ids."""
    g = Graph("positions")
    ids = g.input("ids", (2, 9), "i64")
    m = g.cast(g.ne(ids, 1), "i32")
    pos = g.add(g.cast(g.mul(g.cumsum(m, 1), m), "i64"), 1)
    g.output(pos, g.cast(pos, "f32") * 0.5)
    I = RNG.integers(0, 4, (2, 9))
    M = (I != 1).astype(np.int32)
    P = (np.cumsum(M, 1) * M).astype(np.int64) + 1
    _check(g, [I], [P, P.astype(np.float32) * 0.5])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_float_cumsum_along_any_axis(axis):
    g = Graph("cumsum")
    x = g.input("x", (3, 5, 4))
    g.output(g.cumsum(x * 2.0, axis) + 1.0)
    X = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    _check(g, [X], [np.cumsum(X * 2.0, axis).astype(np.float32) + 1.0])


def test_int32_and_int64_casts_keep_their_sign():
    g = Graph("casts")
    a = g.input("a", (6,), "i32")
    b = g.input("b", (6,), "i64")
    wide = g.cast(a, "i64")
    g.output(g.add(wide, b), g.cast(g.sub(b, 3), "i32"), g.cast(g.cast(a, "f32") * -1.5, "i32"))
    A = np.array([-5, -1, 0, 1, 7, 100], np.int32)
    B = np.array([3, -2, 0, 9, -8, 1], np.int64)
    _check(g, [A, B], [A.astype(np.int64) + B, (B - 3).astype(np.int32),
                       np.trunc(A * -1.5).astype(np.int32)])
