"""Property test: random linalg programs nobody on the project wrote, against numpy.

Each seed draws a program as MLIR text (linalg_programs.py: generics with random indexing
maps, reductions over any subset of loops, outs that are read, named ops, tensor
reshapes/slices/concat/pad, scalar arithmetic between ops, f32/f16/bf16/i32/i64), and an
independent numpy interpreter of that text (linalg_interpreter.py, float64 for floats) is
the reference. The program is compiled with ``opfuse.compile`` fused and unfused and run on
the CPU; every ``GPU_EVERY``-th program also goes through the GPU kernels
(``Executable.gpu_program``) in the emulator, with result buffers poisoned with NaN (as
test_random_kernels does).

Checked: both CPU runs and the emulated kernels match the reference (floats within
``TOL`` of the program's lowest-precision float type, scaled by the largest magnitude
that flowed into the value; integers exactly; elements a near-tie comparison decided are
skipped, see linalg_interpreter), the input arrays are unchanged, nothing raises but
OpfuseError. On the GPU path a located refusal (exit 1: no emitter builds a kernel yet) is
allowed and counted; an internal error or a wrong value is not.

``OPFUSE_RANDOM_PROGRAMS`` (config.py) sets how many seeds run: 150 by default (the CI
subset, derandomized: seeds 0..149); 1500 is the full run. For a summary with the counts
of every outcome (refusal reasons, features drawn):
``python test/unit/test_random_linalg.py --programs 1500 --jobs 2``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest

import opfuse
from opfuse import config
from opfuse.errors import OpfuseError

import linalg_interpreter as interp
import linalg_programs as gen

#: Relative tolerances by the lowest-precision float type in the program (errors are
#: judged against max(1, scale) + |value|, see ``mismatches``).
TOL = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2}
#: Near-tie band of comparisons and float-to-int conversions (relative to the scale).
TIE = {"f32": 1e-5, "f16": 1e-2, "bf16": 5e-2}
#: Every GPU_EVERY-th program also runs through the GPU kernels, emulated.
GPU_EVERY = 4


def programs() -> int:
    return int(config.RANDOM_PROGRAMS.get())


@dataclass
class Outcome:
    """What happened to one program."""

    seed: int
    features: set[str]
    cpu: dict[str, str] = field(default_factory=dict)  # fused/unfused -> ok | problem
    gpu: str | None = None  # None: not tried; ok, refused: <reason>, or the problem
    text: str = ""

    @property
    def failed(self) -> list[str]:
        bad = [f"cpu {k}: {v}" for k, v in self.cpu.items() if v != "ok"]
        if self.gpu is not None and self.gpu != "ok" and not self.gpu.startswith("refused"):
            bad.append(f"gpu: {self.gpu}")
        return bad


def reference(p: gen.Program, args: list[np.ndarray]) -> list[interp.V]:
    values = [gen.to_float64(a, t.elem) for a, t in zip(args, p.args)]
    return interp.Interpreter(p.text, tie=TIE[p.lowest_float]).run(values)


def mismatches(p: gen.Program, got, ref: list[interp.V]) -> list[str]:
    """Where ``got`` (the program's outputs) differs from the reference, one line each."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    if len(got) != len(ref):
        return [f"{len(got)} results, expected {len(ref)}"]
    tol = TOL[p.lowest_float]
    out = []
    for k, (g, r, t) in enumerate(zip(got, ref, p.results)):
        g = np.asarray(g)
        if g.shape != r.a.shape:
            out.append(f"result {k}: shape {g.shape}, expected {r.a.shape}")
            continue
        g = gen.to_float64(g, t.elem)
        checked = ~r.u
        if gen.is_float(t.elem):
            err = np.abs(g - r.a)
            limit = tol * (max(1.0, r.s) + np.abs(r.a))
            bad = checked & ~(err <= limit)  # NaN is bad
        else:
            bad = checked & (g != r.a)
        if bad.any():
            i = tuple(int(x) for x in np.argwhere(bad)[0])
            out.append(f"result {k} ({t.type}): {int(bad.sum())} of {bad.size} elements differ, "
                       f"first at {i}: got {g[i]!r}, expected {r.a[i]!r} (scale {r.s:.3g})")
    return out


def _emulated(exe, args):
    from test_random_kernels import emulate_poisoned  # noqa: PLC0415  (its NaN-poisoning run)

    return emulate_poisoned(exe.gpu_program(lower=False), args)


def evaluate(seed: int, *, gpu: bool | None = None) -> Outcome:
    """Draw, compile, run and check program ``seed``."""
    p = gen.program(seed)
    result = Outcome(seed, p.features, text=p.text)
    args = p.inputs()
    ref = reference(p, args)
    exe_fused = None
    for fusion in (True, False):
        key = "fused" if fusion else "unfused"
        try:
            exe = opfuse.compile(p.text, backend="cpu", fusion=fusion)
            if fusion:
                exe_fused = exe
            kept = [a.copy() for a in args]
            got = exe(*args)
        except OpfuseError as e:
            result.cpu[key] = f"OpfuseError exit {e.exit_code}: {e}"
            continue
        except Exception as e:  # noqa: BLE001  (any other exception is the failure)
            result.cpu[key] = f"{type(e).__name__}: {e}"
            continue
        if any(not np.array_equal(a, b) for a, b in zip(args, kept)):
            result.cpu[key] = "an input array was changed"
            continue
        problems = mismatches(p, got, ref)
        result.cpu[key] = "ok" if not problems else "; ".join(problems)
    if (seed % GPU_EVERY == 0 if gpu is None else gpu) and exe_fused is not None:
        try:
            problems = mismatches(p, _emulated(exe_fused, args), ref)
            result.gpu = "ok" if not problems else "; ".join(problems)
        except OpfuseError as e:
            first = str(e).splitlines()[0]
            result.gpu = f"refused: {first}" if e.exit_code == 1 else f"OpfuseError exit {e.exit_code}: {first}"
        except Exception as e:  # noqa: BLE001
            result.gpu = f"{type(e).__name__}: {e}"
    return result


@pytest.mark.parametrize("seed", range(programs()))
def test_random_program_matches_numpy(seed):
    outcome = evaluate(seed)
    assert not outcome.failed, "\n".join(outcome.failed) + "\n\n" + outcome.text


# ----------------------------------------------------------------------------- the summary


def _refusal_kind(reason: str) -> str:
    """``refused: no GPU emitter can build fusion_3_loop (loop): loop: X; fallback: Y`` -> Y
    (the fallback's reason is the last word on why no emitter took it)."""
    text = reason.split(": ", 1)[1] if ": " in reason else reason
    last = text.rsplit("; ", 1)[-1]
    return last.split(": ", 1)[-1] if last.startswith("fallback") else last.split(": ", 2)[-1]


def _worker(seeds: list[int]) -> None:
    """Evaluate ``seeds``, one JSON line per program (after a ``start`` line, so the parent
    knows which program a process that dies was running)."""
    for seed in seeds:
        print(json.dumps({"start": seed}), flush=True)
        o = evaluate(seed)
        print(json.dumps({"seed": o.seed, "features": sorted(o.features), "cpu": o.cpu,
                          "gpu": o.gpu}), flush=True)


def _run_workers(seeds: list[int], jobs: int) -> list[Outcome]:
    """``seeds`` in ``jobs`` worker processes; a program that kills its process (a signal,
    an abort in the compiler) is recorded as that failure and the worker restarted."""
    import subprocess  # noqa: PLC0415
    import threading  # noqa: PLC0415

    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def run(todo: list[int]) -> None:
        while todo:
            proc = subprocess.Popen([sys.executable, __file__, "--worker", ",".join(map(str, todo))],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            current = None
            for line in proc.stdout:
                msg = json.loads(line)
                if "start" in msg:
                    current = msg["start"]
                    continue
                with lock:
                    outcomes.append(Outcome(msg["seed"], set(msg["features"]), msg["cpu"], msg["gpu"]))
                todo = todo[todo.index(msg["seed"]) + 1:]
                current = None
            err = proc.stderr.read()
            rc = proc.wait()
            if current is None:
                if rc != 0 and todo:
                    raise RuntimeError(f"worker failed outside a program: {err[-2000:]}")
                return
            why = err.strip().splitlines()[0] if err.strip() else ""
            with lock:
                outcomes.append(Outcome(current, set(), {"fused": f"the process died ({rc}): {why}"}))
            todo = todo[todo.index(current) + 1:]

    threads = [threading.Thread(target=run, args=(seeds[j::jobs],)) for j in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(outcomes, key=lambda o: o.seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=programs())
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker([int(x) for x in args.worker.split(",")])
        return 0
    seeds = list(range(args.start, args.start + args.programs))
    outcomes = _run_workers(seeds, max(1, args.jobs))
    cpu = collections.Counter(v if v == "ok" else "FAILED" for o in outcomes for v in o.cpu.values())
    gpu = collections.Counter("ok" if o.gpu == "ok" else "refused" if o.gpu.startswith("refused")
                              else "FAILED" for o in outcomes if o.gpu is not None)
    refusals = collections.Counter(_refusal_kind(o.gpu) for o in outcomes
                                   if o.gpu is not None and o.gpu.startswith("refused"))
    features = collections.Counter(f for o in outcomes for f in o.features)
    print(f"programs: {len(outcomes)} (seeds {seeds[0]}..{seeds[-1]})")
    print(f"cpu runs (fused + unfused): {dict(cpu)}")
    print(f"gpu kernels, emulated (every {GPU_EVERY}th program): {dict(gpu)}")
    for reason, n in refusals.most_common():
        print(f"  refused {n:4d}: {reason}")
    print("features: " + ", ".join(f"{k} {v}" for k, v in sorted(features.items())))
    failed = [o for o in outcomes if o.failed]
    for o in failed:
        print(f"\nseed {o.seed}:\n  " + "\n  ".join(o.failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
