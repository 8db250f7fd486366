"""What the driver says while it works: a progress line per stage, and stage timing.

Every stage of a compile (:mod:`opfuse.driver.stages`: ``linalg``, ``fused``, ``cpu``,
``ptx``, ...) runs inside :func:`stage`, and so do the steps inside a stage worth timing on
their own (``report``: the fusion report; ``jit``: LLVM's JIT of the ``cpu`` module;
``gpu``: one GPU compile, which builds ``kernels``, ``nvvm``, ``ptx`` and cubins
together). Two things read those spans:

* progress: once a compile has run for more than a second, each stage that ends prints
  ``<tool>: <stage> <seconds>s`` on stderr, so a 30-second compile is not silent. Only
  where stderr is a terminal, or ``OPFUSE_PROGRESS=1`` (``0`` turns it off everywhere):
  logs and pipes that check stderr stay as they were.
* timing (``--timing``, like ``mlir-opt --mlir-timing``): a :class:`Timing` collects every
  span and prints a table of wall time per stage at the end.

Spans nest (a bundle's stage inside a ``fused`` program's); the table lists each at its
depth, and the percentages are of the total wall time.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Iterator

from .. import config

#: A compile is "long" once it has run this many seconds: its stages then print progress.
PROGRESS_AFTER_S = 1.0


@dataclass
class Span:
    name: str
    depth: int
    seconds: float = 0.0


@dataclass
class Timing:
    """The spans of one tool run, for ``--timing``."""

    spans: list[Span] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)

    def table(self) -> str:
        """The timing report, one line per span in the order they began."""
        total = time.perf_counter() - self.start
        rule = "===" + "-" * 73 + "==="
        lines = [rule, "opfuse stage timing".center(79).rstrip(), rule,
                 f"  Total Execution Time: {total:.4f} seconds", "",
                 "  ----Wall Time----  ----Name----"]
        for s in self.spans:
            share = 100.0 * s.seconds / total if total > 0 else 0.0
            lines.append(f"  {s.seconds:8.4f} ({share:5.1f}%)  {'  ' * s.depth}{s.name}")
        lines.append(f"  {total:8.4f} (100.0%)  Total")
        return "\n".join(lines) + "\n"


@dataclass
class _Run:
    tool: str
    stream: IO[str]
    progress: bool
    timing: Timing | None
    start: float = field(default_factory=time.perf_counter)
    depth: int = 0


_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("opfuse_progress",
                                                                       default=None)


def wants_progress(stream: IO[str]) -> bool:
    """``OPFUSE_PROGRESS`` if set (1 or 0), else whether ``stream`` is a terminal."""
    value = config.PROGRESS.get()
    if value:
        return config.PROGRESS.flag()
    return bool(getattr(stream, "isatty", lambda: False)())


@contextlib.contextmanager
def run(tool: str, *, timing: Timing | None = None, stream: IO[str] | None = None,
        progress: bool | None = None) -> Iterator[Timing | None]:
    """The stages inside report to ``tool``'s progress lines and to ``timing``."""
    stream = stream if stream is not None else sys.stderr
    progress = wants_progress(stream) if progress is None else progress
    token = _CURRENT.set(_Run(tool, stream, progress, timing))
    try:
        yield timing
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """One stage of a compile; outside :func:`run` it costs two clock reads."""
    current = _CURRENT.get()
    if current is None:
        yield
        return
    span = Span(name, current.depth)
    if current.timing is not None:
        current.timing.spans.append(span)
    current.depth += 1
    t0 = time.perf_counter()
    try:
        yield
    finally:
        span.seconds = time.perf_counter() - t0
        current.depth -= 1
        if current.progress and time.perf_counter() - current.start > PROGRESS_AFTER_S:
            print(f"{current.tool}: {'  ' * span.depth}{name} {span.seconds:.1f}s",
                  file=current.stream, flush=True)


__all__ = ["PROGRESS_AFTER_S", "Span", "Timing", "run", "stage", "wants_progress"]
