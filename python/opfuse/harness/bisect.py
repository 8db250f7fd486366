"""``fuse-run --bisect``: the search over the fusion fuel for the first fusion whose
program's outputs differ from the unfused program's beyond the tolerance."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.report import render as render_mod
from opfuse.runtime.signature import Signature

from .compare import EXIT_MISMATCH, Comparison, compare, default_tolerance
from .programs import build_program
from .run_summary import _json_safe, _num


@dataclass
class Trial:
    """One fused program compiled with ``fuel`` fusions, checked against the unfused one."""

    fuel: int | None
    checks: list[Comparison]
    report: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def applied(self) -> int:
        return max((d.get("step") or 0 for d in self.report["decisions"]), default=0)

    def line(self) -> str:
        fuel = "all" if self.fuel is None else str(self.fuel)
        if self.ok:
            return f"  fuel {fuel:>4}: ok"
        bad = next(c for c in self.checks if not c.ok)
        index = self.checks.index(bad)
        return (f"  fuel {fuel:>4}: MISMATCH (output #{index}: {bad.mismatches} of "
                f"{bad.elements} elements differ, max abs {_num(bad.max_abs)})")


class Bisection:
    """``fuse-run --bisect``: the smallest fuel N whose fused program differs from the
    unfused one; the N-th fusion applied is the first that changes the results."""

    def __init__(self, args: argparse.Namespace, filename: str, signature: Signature,
                 inputs: list[np.ndarray], inputs_from: str, module: Any,
                 where: Callable[[str], dict[str, Any]], fused_args: dict[str, Any],
                 common: dict[str, Any]) -> None:
        self.args, self.filename, self.signature = args, filename, signature
        self.inputs, self.inputs_from, self.module = inputs, inputs_from, module
        self.where, self.fused_args = where, fused_args
        unfused = build_program("unfused", module, inputs, fusion=False, **common,
                                **where("unfused"))
        self.reference = [a.copy() for a in unfused.run()]
        self.backend = unfused.exe.backend
        self.trials: list[Trial] = []

    def trial(self, fuel: int | None) -> Trial:
        name = "fused" if fuel is None else f"fuel-{fuel}"
        program = build_program(name, self.module, self.inputs, fuel=fuel, **self.fused_args,
                                **self.where(name))
        checks = [
            compare(f, u, spec.element_type,
                    *(self.args.tolerance or default_tolerance(spec.element_type)))
            for f, u, spec in zip(program.run(), self.reference, self.signature.outputs)
        ]
        result = Trial(fuel, checks, program.exe.report)
        self.trials.append(result)
        return result

    def search(self) -> int | None:
        """The step of the first fusion that makes the outputs differ; 0 when they differ
        with no fusion at all; None when the full fused program agrees."""
        full = self.trial(None)
        if full.ok:
            return None
        if not self.trial(0).ok:
            return 0
        lo, hi = 0, full.applied  # fuel lo agrees; fuel hi (all fusions: the full run) differs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if not self.trial(mid).ok else (mid, hi)
        return hi

    def report(self, step: int | None) -> OpfuseError | None:
        """Print the search's trials and verdict (text, or JSON with --json); the error
        to exit with (exit code EXIT_MISMATCH) when a fusion, or no fusion, breaks the
        results, else None."""
        # Planning is deterministic, so the full run's first N fusions are those of the run
        # with fuel N: the culprit's ledger entries are read from the full run.
        full = self.trials[0]
        lines = [f"fuse-run --bisect: {self.filename} @{self.signature.name} on {self.backend}",
                 f"inputs: {self.inputs_from}",
                 f"fusions applied by the full pipeline: {full.applied}", "trials:"]
        lines += [t.line() for t in self.trials]
        doc: dict[str, Any] = {"file": self.filename, "entry": self.signature.name,
                               "fusions": full.applied,
                               "trials": [{"fuel": t.fuel, "ok": t.ok} for t in self.trials],
                               "first_bad_fusion": None, "decisions": []}
        error = None
        if step is None:
            lines.append(f"all {full.applied} fusions keep the outputs within the tolerance")
        elif step == 0:
            lines.append("the outputs differ with no fusion applied (fuel 0): the difference "
                         "comes from the pipeline's other passes, not from a fusion")
            error = OpfuseError("fused and unfused outputs differ even with --fusion-fuel=0",
                                exit_code=EXIT_MISMATCH)
        else:
            culprit = [d for d in full.report["decisions"] if d.get("step") == step]
            doc["first_bad_fusion"], doc["decisions"] = step, culprit
            lines.append(f"first fusion that changes the results beyond the tolerance: "
                         f"#{step} of {full.applied}")
            lines += [f"  {render_mod.decision_line(d)}" for d in culprit]
            lines.append(f"reproduce: fuse-run {self.filename} --fusion-fuel={step} (differs), "
                         f"--fusion-fuel={step - 1} (agrees)")
            what = culprit[0] if culprit else {}
            error = OpfuseError(
                f"fusion #{step} changes the results beyond the tolerance: "
                f"[{what.get('pass_name', '?')}] {what.get('producer', '?')} -> "
                f"{what.get('consumer', '?')} at {what.get('location', '?')}",
                exit_code=EXIT_MISMATCH)
        if self.args.json:
            sys.stdout.write(json.dumps(_json_safe(doc), indent=2) + "\n")
        else:
            sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        return error
