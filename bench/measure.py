"""Interleaved timing: every contender of a graph measured in the same rounds.

The machines are shared and noisy, so absolute times drift; ratios measured side by side
do not (much). Method:

1. calibration: each contender runs twice untimed-for-the-result (a warm-up, then one
   call whose time estimates the per-call cost);
2. each contender gets ``calls`` per round (enough calls for ~``block_s`` seconds, 1 to
   50), and the number of rounds follows from the time budget (``min_rounds`` to
   ``max_rounds``);
3. rounds run the contenders in turn, forwards in even rounds and backwards in odd ones
   (A B C, C B A, ...), so a linear drift hits every contender alike;
4. a contender's time is the median of all its per-call samples; a ratio X/Y is the
   median over rounds of (X's round median / Y's round median), with its min and max,
   and beside it the ratio of the two overall medians (when the two disagree, the rounds
   did: the machine was noisy).

Beside the wall time, each round records the calling thread's CPU time per call
(``time.thread_time`` around the round's calls). On a machine shared with other work a
single-threaded contender's wall time mostly measures how long it waited for a core; its
thread CPU time is what it computed. It means nothing for a contender whose work runs on
other threads (a thread pool): the runner reports it only for single-threaded ones.

opfuse's programs are timed with ``Executable.time(repeat=calls, warmup=0)`` (inputs
marshalled outside the timed calls; the output array is fresh for each round, so the
first call of a round writes to untouched pages, as the peers' calls do).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

#: ``block(calls)`` runs ``calls`` calls and returns each one's seconds.
Block = Callable[[int], list[float]]


@dataclass
class Samples:
    """What one contender measured."""

    calls: int = 1
    rounds: list[float] = field(default_factory=list)  # median of each round
    all: list[float] = field(default_factory=list)
    cpu_rounds: list[float] = field(default_factory=list)  # thread CPU s per call, per round

    @property
    def median_s(self) -> float:
        return statistics.median(self.all)


def timed_calls(fn: Callable[[], object], calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls of ``fn``."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def interleave(
    blocks: dict[str, Block],
    *,
    budget_s: float,
    block_s: float = 0.2,
    min_rounds: int = 7,
    max_rounds: int = 30,
) -> dict[str, Samples]:
    """Measure every contender in interleaved rounds (module docstring)."""
    estimate = {}
    for name, block in blocks.items():
        block(1)  # warm-up: first-call effects (page faults, lazy init) stay out
        estimate[name] = max(block(1)[0], 1e-7)
    samples = {n: Samples(calls=max(1, min(50, int(block_s / t)))) for n, t in estimate.items()}
    round_s = sum(samples[n].calls * t for n, t in estimate.items())
    rounds = max(min_rounds, min(max_rounds, int(budget_s / max(round_s, 1e-9))))
    order = list(blocks)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            c0 = time.thread_time()
            times = blocks[name](samples[name].calls)
            cpu = (time.thread_time() - c0) / samples[name].calls
            samples[name].rounds.append(statistics.median(times))
            samples[name].all.extend(times)
            samples[name].cpu_rounds.append(cpu)
    return samples


def ratio(num: Samples, den: Samples) -> dict[str, float]:
    """num/den per round: median, min and max over the rounds; and the ratio of the two
    overall medians, as a cross-check."""
    per_round = [a / b for a, b in zip(num.rounds, den.rounds)]
    return {
        "median": statistics.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
        # far from "median" means the rounds disagreed: a noisy run, read with care
        "of_medians": num.median_s / den.median_s,
    }


def cpu_ratio(num: Samples, den: Samples) -> dict[str, float]:
    """Like :func:`ratio`, of the calling thread's CPU time per call (single-threaded
    contenders only: see the module docstring)."""
    per_round = [a / b for a, b in zip(num.cpu_rounds, den.cpu_rounds) if b > 0]
    if not per_round:
        raise ValueError("no thread CPU time was measured")
    return {
        "median": statistics.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
        "of_medians": statistics.median(num.cpu_rounds) / statistics.median(den.cpu_rounds),
    }


def summary(s: Samples) -> dict[str, float | int]:
    """The JSON figures of one contender."""
    return {
        "median_s": s.median_s,
        "min_s": min(s.all),
        "max_s": max(s.all),
        "samples": len(s.all),
        "calls_per_round": s.calls,
        "rounds": len(s.rounds),
    }
