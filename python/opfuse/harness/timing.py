"""Timing fuse-run's programs: calls interleaved so drift falls on all of them alike."""

from __future__ import annotations

import time
from typing import Sequence

from .programs import Program


def time_interleaved(programs: Sequence[Program], repeat: int, warmup: int) -> None:
    """Append ``repeat`` timed calls to each program's ``times``, alternating the order
    (A B, B A, ...) so that drift and order effects fall on both alike."""
    for _ in range(warmup):
        for p in programs:
            p.run()
    for i in range(repeat):
        for p in programs if i % 2 == 0 else programs[::-1]:
            device_time = getattr(p.run, "device_time", None)
            if device_time is not None:  # cuda: kernels only, timed with CUDA events
                p.times.append(device_time())
                continue
            t0 = time.perf_counter()
            p.run()
            p.times.append(time.perf_counter() - t0)
