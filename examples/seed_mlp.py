#!/usr/bin/env python
"""The seed's demo: Linear(256,256) -> GELU -> Linear(256,256) -> GELU on a 2048x256 input,
timed eager vs opfuse-compiled (``opfuse.torch.compile`` and ``torch.compile(backend="opfuse")``)
and vs ``torch.compile``'s default backend (inductor) where it works.

    pip install -e '.[torch]'
    python examples/seed_mlp.py                  # the seed's sizes
    python examples/seed_mlp.py --batch 256 --iters 5 --no-inductor   # a quick look

Without a GPU opfuse runs its fused program on the CPU backend (MLIR ExecutionEngine,
single-threaded LLVM code); the kernel counts are those of the fused GPU program either way.
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


def seed_model(dim: int) -> nn.Module:
    """The seed's MLP (nn.GELU's default, exact erf)."""
    return nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim), nn.GELU())


def time_ms(fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Median milliseconds per call over ``iters`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


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
                   help="torch intra-op threads (default: torch's choice; opfuse's CPU code "
                   "is single-threaded, so --threads 1 compares like with like)")
    p.add_argument("--no-inductor", action="store_true",
                   help="skip torch.compile's default backend (its compile takes a while)")
    args = p.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = seed_model(args.dim).eval()
    x = torch.randn(args.batch, args.dim)
    fused = opfuse.torch.compile(model, (x,), backend=args.backend)
    totals = fused.report["totals"]
    before, after = totals["before"]["kernels"], totals["after"]["kernels"]

    print(f"seed MLP: Linear({args.dim},{args.dim}) -> GELU -> Linear({args.dim},{args.dim}) "
          f"-> GELU on a {args.batch}x{args.dim} float32 input")
    print(f"opfuse backend: {fused.executable.backend}; torch threads: {torch.get_num_threads()}")
    print(f"kernels: {before} before fusion -> {after} after fusion "
          f"({totals['bytes_saved'] / 1e6:.1f} MB less memory traffic)")

    with torch.no_grad():
        want = model(x)
        err = (fused(x) - want).abs().max().item()
        print(f"max |opfuse - eager| = {err:.2e}")
        eager_ms = time_ms(lambda: model(x), args.iters, args.warmup)
        opfuse_ms = time_ms(lambda: fused(x), args.iters, args.warmup)
        opfuse.torch.register()  # no-op where the torch_dynamo_backends entry point exists
        by_name = torch.compile(model, backend="opfuse", dynamic=False)
        rows = [
            ("eager", eager_ms),
            (f"opfuse.torch.compile ({fused.executable.backend})", opfuse_ms),
            ('torch.compile("opfuse")', time_ms(lambda: by_name(x), args.iters, args.warmup)),
        ]
        if args.no_inductor:
            skipped = "skipped (--no-inductor)"
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled, skipped = inductor(model, x)
            if compiled is not None:
                rows.append(("torch.compile (inductor)",
                             time_ms(lambda: compiled(x), args.iters, args.warmup)))

    print(f"time per call, median of {args.iters}:")
    for name, ms in rows:
        print(f"  {name:30s} {ms:8.3f} ms   speedup vs eager {eager_ms / ms:5.2f}x")
    if len(rows) == 3:
        print(f"  {'torch.compile (inductor)':30s} {skipped}")
    if fused.executable.backend == "cpu":
        print("note: opfuse's CPU backend is the correctness reference (LLVM-compiled loop "
              "nests on one thread, no BLAS); the time fusion saves shows on the cuda backend")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
