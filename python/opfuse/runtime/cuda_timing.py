"""Timing kernels on the device: many launches between one pair of CUDA events.

A launcher (:meth:`.cuda_driver.Driver.prepare`, or a bound program's ``launch_only``)
costs one driver call per launch; timing one launch between two events would still
measure the event and launch latencies (several microseconds, more than most kernels
here). So:

* :func:`hot`: launch for ``warmup_s`` of device time first (clocks up, caches and TLBs
  warm, the module loaded), then ``rounds`` windows of ``n`` back-to-back launches between
  one pair of events, ``n`` sized so a window lasts about ``window_s``; the time per launch
  is the window's time / ``n`` (median and min over the windows). The host's time to
  enqueue the window is measured too: when it is about the device's (``launch_bound``),
  the device idled between launches and the figure is an upper bound of the kernel's time.
* :func:`cold`: the L2 flushed before each launch (:class:`L2Flush`: a memset of twice the
  L2's size, enqueued before the start event, so it is not timed), one launch per pair of
  events: what a kernel costs when its inputs come from HBM.

Everything returns seconds in plain dicts (the JSON of tools/gpu/gpu-check).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

Launch = Callable[[], None]


def _repeat(launch: Launch, n: int) -> Launch:
    def run() -> None:
        for _ in range(n):
            launch()

    return run


def hot(
    drv,
    launch: Launch,
    *,
    warmup_s: float = 0.02,
    window_s: float = 0.004,
    rounds: int = 5,
    max_launches: int = 4096,
) -> dict:
    """Warm per-launch time of ``launch`` (see the module docstring)."""
    spent = drv.elapsed(launch)
    batch = 1
    per = spent
    while spent < warmup_s:  # batches of 1, 2, 4, ... launches until warmup_s has passed
        t = drv.elapsed(_repeat(launch, batch))
        spent += t
        per = t / batch
        batch = min(max_launches, batch * 2)
    n = max(1, min(max_launches, int(window_s / max(per, 1e-7))))
    window = _repeat(launch, n)
    device, host = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        device.append(drv.elapsed(window) / n)
        host.append((time.perf_counter() - t0) / n)
    med = statistics.median(device)
    return {
        "median_s": med,
        "min_s": min(device),
        "launches_per_window": n,
        "windows": rounds,
        "warmup_s": spent,
        "host_enqueue_s": statistics.median(host),
        "launch_bound": statistics.median(host) >= 0.9 * med,
    }


class L2Flush:
    """Evicts the L2: a memset of a buffer twice its size (``L2_CACHE_SIZE``)."""

    def __init__(self, drv, l2_bytes: int | None = None):
        self.drv = drv
        if l2_bytes is None:
            try:
                l2_bytes = drv.attribute("L2_CACHE_SIZE")
            except Exception:  # noqa: BLE001  (a binding without it: H200's 50 MB, twice)
                l2_bytes = 50 << 20
        self.nbytes = 2 * int(l2_bytes)
        self.buf = drv.alloc(self.nbytes)
        self._value = 0

    def __call__(self) -> None:
        self._value ^= 1  # a different value each time: nothing to skip
        self.drv.memset(self.buf, self._value, self.nbytes)


def cold(drv, launch: Launch, flush: L2Flush, *, reps: int = 5) -> dict:
    """Per-launch time with the L2 flushed before each launch (median and min)."""
    times = []
    for _ in range(reps):
        flush()
        times.append(drv.elapsed(launch))
    return {"median_s": statistics.median(times), "min_s": min(times), "reps": reps}


__all__ = ["L2Flush", "cold", "hot"]
