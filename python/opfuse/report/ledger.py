"""The decision ledger: one entry per fusion candidate, fused or not, with its numbers.

Passes append to the ledger of the running pipeline (``current()``); the pipeline driver
installs one per run. With no ledger installed, entries go nowhere, so a pass can run alone.
The ledger is output, never input: passes communicate only through the IR.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator


@dataclass
class Decision:
    """One fusion candidate and what the cost guard said about it.

    Attributes:
        pass_name: the pass that considered it, e.g. ``opfuse-fuse-elementwise``.
        producer, consumer: labels of the two sides (``%name`` or ``op@file:line:col``).
        location: ``file:line:col`` of the consumer, where the remark is attached.
        fused: the verdict.
        reason: the binding reason, with numbers (``saving 0.04 <= delta 0.10``).
        action: ``merge`` or ``duplicate`` (a producer recomputed in its consumers).
        numbers: r_fused, r_limit, q_unfused, q_fused, saving, delta, w_fused, t_saved_s, ...
        would_fuse_with: the threshold that would flip a refusal (``R_limit >= 136``).
    """

    pass_name: str
    producer: str
    consumer: str
    location: str
    fused: bool
    reason: str
    action: str = "merge"
    numbers: dict[str, float] = field(default_factory=dict)
    would_fuse_with: str | None = None

    def remark(self) -> str:
        """The entry as an MLIR remark line (FileCheck-able)."""
        verdict = "fused" if self.fused else "not fused"
        text = f"{self.location}: remark: [{self.pass_name}] {verdict}: {self.producer} -> {self.consumer}: {self.reason}"
        if self.would_fuse_with:
            text += f" (would fuse with {self.would_fuse_with})"
        return text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Ledger:
    """All decisions of one pipeline run, in order."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def add(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def remarks(self) -> list[str]:
        return [d.remark() for d in self.decisions]

    def to_json(self) -> list[dict[str, Any]]:
        return [d.to_json() for d in self.decisions]


_CURRENT: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("opfuse_ledger", default=None)


def current() -> Ledger | None:
    """The ledger of the pipeline now running, or None."""
    return _CURRENT.get()


def record(decision: Decision) -> None:
    """Append to the current ledger, if any."""
    ledger = _CURRENT.get()
    if ledger is not None:
        ledger.add(decision)


@contextlib.contextmanager
def collecting(ledger: Ledger | None = None) -> Iterator[Ledger]:
    """Install ``ledger`` (or a new one) as the current ledger for the block."""
    ledger = ledger or Ledger()
    token = _CURRENT.set(ledger)
    try:
        yield ledger
    finally:
        _CURRENT.reset(token)
