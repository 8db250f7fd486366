"""The cost guard's decision on numbers (``cost.guard``): bytes first, then launches.

The bytes decide alone when they clear delta; a merge that saves under delta of the bytes
but strictly saves bytes and a launch is judged again in time (``kernels * T_launch +
Q / B_mem``, sm_90: 3 us and 4.8 TB/s), so it is taken while launches dominate and refused
once the bytes do. A merge that moves more bytes is never taken for its launches.
"""

from __future__ import annotations

import pytest

from opfuse import cost

OPTS = cost.GuardOptions()
SM90 = cost.get_target("sm_90")


def test_bytes_above_delta_decide_alone():
    v = cost.guard(30, 1000, 500, OPTS)
    assert v.fuse and v.reason.startswith("saving 0.50 > delta 0.10")
    assert "t_saving" not in v.numbers


def test_a_launch_takes_a_small_merge_under_delta():
    """A bias after a matmul whose weight is most of the bytes: 8% of Q, but a launch."""
    v = cost.guard(30, 1000, 920, OPTS)
    assert v.fuse
    assert v.reason.startswith("saving 0.08 <= delta 0.10 in bytes, time saving 0.50 > delta "
                               "with 1 launch saved")
    assert v.numbers["launches_saved"] == 1 and v.numbers["t_saving"] == pytest.approx(0.5, abs=1e-3)


def test_bytes_dominate_a_large_merge_under_delta():
    """The same 8% of a 1 GB kernel pair: the launch is noise, the bytes refuse it, and the
    ledger names the delta (in time) that would take it."""
    q = 10**9
    v = cost.guard(30, q, int(q * 0.92), OPTS)
    assert not v.fuse
    t_u = 2 * SM90.t_launch_s + q / SM90.b_mem
    t_f = SM90.t_launch_s + 0.92 * q / SM90.b_mem
    want = (t_u - t_f) / t_u
    assert 0.08 < want < 0.1
    assert v.numbers["t_saving"] == pytest.approx(want, abs=1e-4)
    assert v.would_fuse_with == f"delta < {want:.4f}"


@pytest.mark.parametrize("q_fused", [1000, 1100])
def test_no_bytes_saved_is_never_fused_for_its_launch(q_fused):
    v = cost.guard(30, 1000, q_fused, OPTS)
    assert not v.fuse and v.reason.startswith("saving") and "time" not in v.reason


def test_no_launch_saved_is_the_bytes_guard():
    """A merge that needs as many kernels as it removes (attention with a copy beside it)."""
    v = cost.guard(30, 1000, 950, OPTS, launches_saved=0)
    assert not v.fuse and v.reason == "saving 0.05 <= delta 0.10"


def test_registers_still_bind_first():
    v = cost.guard(200, 1000, 920, OPTS)
    assert not v.fuse and v.reason.startswith("R_fused 200 >= R_limit")


def test_several_launches_saved_count_each():
    v = cost.guard(30, 1000, 990, OPTS, launches_saved=3)
    assert v.fuse and "with 3 launches saved" in v.reason
    assert v.numbers["t_saving"] == pytest.approx(0.75, abs=1e-3)
