#!/usr/bin/env python
"""The seed's demo: Linear(256,256) -> GELU -> Linear(256,256) -> GELU on a 2048x256 input,
timed eager vs opfuse-compiled (``opfuse.torch.compile`` and ``torch.compile(backend="opfuse")``)
and vs ``torch.compile``'s default backend (inductor) where it works.

    pip install -e '.[torch]'
    python examples/seed_mlp.py                  # the seed's sizes
    python examples/seed_mlp.py --batch 256 --iters 5 --no-inductor   # a quick look

Without a GPU opfuse runs its fused program on the CPU backend (MLIR ExecutionEngine:
tiled, vectorized LLVM code whose tile loops run on ``--threads`` threads, the same number
torch gets); the kernel counts are those of the fused GPU program either way. The variants
are timed in interleaved rounds (A B C, C B A, ...: drift on a shared machine hits each
alike); each one's time is the median of all its calls.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any, Callable

import torch
from torch import nn

import opfuse.torch
from opfuse.backends.cpu.threads import resolve_threads


def seed_model(dim: int) -> nn.Module:
    """The seed's MLP (nn.GELU's default, exact erf)."""
    return nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU())


def time_interleaved(fns: dict[str, Callable[[], Any]], iters: int, warmup: int,
                     rounds: int = 10) -> dict[str, float]:
    """Median milliseconds per call of each function: ``warmup`` untimed calls each, then
    ``iters`` timed calls each spread over ``rounds`` rounds, the order reversed every
    other round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    rounds = max(1, min(rounds, iters))
    order = list(fns)
    for r in range(rounds):
        calls = iters // rounds + (1 if r < iters % rounds else 0)
        for name in order if r % 2 == 0 else reversed(order):
            fn = fns[name]
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def inductor(model: nn.Module, x: torch.Tensor) -> tuple[Callable | None, str]:
    """``torch.compile`` with its default backend, or None and why it does not work here."""
    try:
        compiled = torch.compile(model)
        compiled(x)  # compiles now, so a missing C++ toolchain shows here
        return compiled, ""
    except Exception as e:  # noqa: BLE001  (any failure just means "not available here")
        line = (str(e).strip().splitlines() or [""])[0]
        return None, f"{type(e).__name__}: {line[:120]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2048, help="rows of the input (default 2048)")
    p.add_argument("--dim", type=int, default=256, help="feature size (default 256)")
    p.add_argument("--iters", type=int, default=50, help="timed calls per variant (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"),
                   help="opfuse backend (default auto: cuda with a GPU runtime, else cpu)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads for torch (intra-op) and for opfuse's CPU code alike "
                   "(default 0: every usable core)")
    p.add_argument("--no-inductor", action="store_true",
                   help="skip torch.compile's default backend (its compile takes a while)")
    args = p.parse_args(argv)

    threads = resolve_threads(args.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = seed_model(args.dim).eval()
    x = torch.randn(args.batch, args.dim)
    fused = opfuse.torch.compile(model, (x,), backend=args.backend, threads=threads)
    totals = fused.report["totals"]
    before, after = totals["before"]["kernels"], totals["after"]["kernels"]

    print(f"seed MLP: Linear({args.dim},{args.dim}) -> GELU -> Linear({args.dim},{args.dim}) "
          f"-> GELU on a {args.batch}x{args.dim} float32 input")
    on_cpu = fused.executable.backend == "cpu"
    print(f"opfuse backend: {fused.executable.backend}"
          + (f", {fused.executable.threads} thread(s)" if on_cpu else "")
          + f"; torch threads: {torch.get_num_threads()}")
    print(f"kernels: {before} before fusion -> {after} after fusion "
          f"({totals['bytes_saved'] / 1e6:.1f} MB less memory traffic)")

    with torch.no_grad():
        want = model(x)
        err = (fused(x) - want).abs().max().item()
        print(f"max |opfuse - eager| = {err:.2e}")
        opfuse.torch.register()  # no-op where the torch_dynamo_backends entry point exists
        by_name = torch.compile(model, backend="opfuse", dynamic=False,
                                options={"backend": args.backend, "threads": threads})
        by_name(x)  # compiles now, not in the first timed round
        fns = {
            "eager": lambda: model(x),
            f"opfuse.torch.compile ({fused.executable.backend})": lambda: fused(x),
            'torch.compile("opfuse")': lambda: by_name(x),
        }
        if args.no_inductor:
            skipped = "skipped (--no-inductor)"
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled, skipped = inductor(model, x)
            if compiled is not None:
                fns["torch.compile (inductor)"] = lambda: compiled(x)
        times = time_interleaved(fns, args.iters, args.warmup)
        rows = list(times.items())
        eager_ms = times["eager"]

    print(f"time per call, median of {args.iters} calls each, interleaved rounds:")
    for name, ms in rows:
        print(f"  {name:30s} {ms:8.3f} ms   speedup vs eager {eager_ms / ms:5.2f}x")
    if len(rows) == 3:
        print(f"  {'torch.compile (inductor)':30s} {skipped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
