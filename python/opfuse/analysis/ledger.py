"""The decision ledger: one entry per fusion candidate, fused or not, with its numbers.

Passes append to the ledger of the running pipeline (``current()``); the pipeline driver
installs one per run. With no ledger installed, entries go nowhere, so a pass can run alone.
The ledger is output, never input: passes communicate only through the IR.

It also holds the run's *fusion fuel* (``--fusion-fuel=N``): a budget of fusions to apply.
Every fusion a pass is about to apply (a merge, or the duplication of a producer into its
consumers) first asks :func:`spend_fuel`; the answer numbers it (``Decision.step``), and
once the budget is spent the candidate is recorded as refused ("fusion fuel exhausted")
and left alone. Planning is deterministic, so the first N fusions of a run with fuel N are
the first N of a run without a limit: bisecting over N finds the first fusion that changes
a result (``fuse-run --bisect``).
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
        step: for an applied fusion, its 1-based rank among the fusions applied in the run
            (what ``--fusion-fuel`` counts); a duplication's entries share one step.
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
    step: int | None = None

    def remark(self) -> str:
        """The entry as an MLIR remark line (FileCheck-able)."""
        verdict = "fused" if self.fused else "not fused"
        text = f"{self.location}: remark: [{self.pass_name}] {verdict}: {self.producer} -> {self.consumer}: {self.reason}"
        if self.would_fuse_with:
            text += f" (would fuse with {self.would_fuse_with})"
        return text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


FUEL_EXHAUSTED = "fusion fuel exhausted"


class Ledger:
    """All decisions of one pipeline run, in order, and the run's fusion fuel.

    Args:
        fuel: fusions this run may apply (None: no limit; default: the enclosing
            :func:`fuel_limit`, if any).
    """

    def __init__(self, fuel: int | None = None) -> None:
        self.decisions: list[Decision] = []
        self.fuel = fuel if fuel is not None else _FUEL.get()
        self.applied = 0  # fusions applied so far

    def spend_fuel(self) -> int | None:
        """One unit of fuel for a fusion about to be applied: its step number (1-based),
        or None when the fuel is exhausted (the fusion must then not be applied)."""
        if self.fuel is not None and self.applied >= self.fuel:
            return None
        self.applied += 1
        return self.applied

    def fuel_refusal(self) -> tuple[str, str | None]:
        """(reason, would_fuse_with) of a candidate refused for lack of fuel."""
        return f"{FUEL_EXHAUSTED} ({self.fuel} applied)", f"fusion-fuel >= {self.applied + 1}"

    def add(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def remarks(self) -> list[str]:
        return [d.remark() for d in self.decisions]

    def to_json(self) -> list[dict[str, Any]]:
        return [d.to_json() for d in self.decisions]


_CURRENT: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("opfuse_ledger", default=None)
_FUEL: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "opfuse_fuel", default=None
)


def current() -> Ledger | None:
    """The ledger of the pipeline now running, or None."""
    return _CURRENT.get()


def record(decision: Decision) -> None:
    """Append to the current ledger, if any."""
    ledger = _CURRENT.get()
    if ledger is not None:
        ledger.add(decision)


def spend_fuel() -> int | None:
    """Ask the current ledger for one unit of fusion fuel (see :meth:`Ledger.spend_fuel`);
    0 (apply, unnumbered) when no ledger is collecting."""
    ledger = _CURRENT.get()
    return 0 if ledger is None else ledger.spend_fuel()


def fuel_refusal() -> tuple[str, str | None]:
    """(reason, would_fuse_with) for a candidate refused because the fuel ran out."""
    ledger = _CURRENT.get()
    return ledger.fuel_refusal() if ledger is not None else (FUEL_EXHAUSTED, None)


@contextlib.contextmanager
def fuel_limit(fuel: int | None) -> Iterator[None]:
    """Give every pipeline run in the block (each new Ledger) ``fuel`` fusions; None: no
    limit. For callers that reach the pipeline through ``opfuse.compile``."""
    token = _FUEL.set(fuel)
    try:
        yield
    finally:
        _FUEL.reset(token)


@contextlib.contextmanager
def collecting(ledger: Ledger | None = None) -> Iterator[Ledger]:
    """Install ``ledger`` (or a new one) as the current ledger for the block."""
    ledger = ledger or Ledger()
    token = _CURRENT.set(ledger)
    try:
        yield ledger
    finally:
        _CURRENT.reset(token)
