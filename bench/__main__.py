"""``python -m bench``: run the benchmark and write bench.json, bench.md and the charts.

    python -m bench                         # G1–G8 at their default scales, every peer found
    python -m bench --graphs g2,g3 --scale 1
    python -m bench --quick --out /tmp/b    # smoke: one small graph, seconds, no torch/jax
    python -m bench my_graph.mlir           # a file too (opfuse fused vs unfused only)

Exit status: 0 written; 1 bad arguments or input; 2 the document failed its own schema
(written anyway, for inspection, as bench.invalid.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

_START = time.perf_counter()
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", metavar="FILE.mlir", help="extra graphs to benchmark")
    p.add_argument("--graphs", help="G graphs to run, comma-separated names or prefixes "
                   "(default: g1..g8; 'none' for files only)")
    p.add_argument("--scale", help="divide sizes by N for every graph, or per graph: "
                   "'g5=1,g7=4' (default: g5, g6, g7 at 2, the others full size)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder "
                   f"(default: {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="smoke run: G2 at scale 64, numpy "
                   "peer only, tiny scaling sizes; seconds (what CI runs)")
    p.add_argument("--no-peers", action="store_true", help="skip torch, jax and the Triton "
                   "GPU-estimate peer (numpy and IREE still run)")
    p.add_argument("--threads", type=int, default=1, help="threads for opfuse's CPU code and "
                   "the peers (default 1; 0 = every core for opfuse, library defaults for "
                   "the peers); IREE runs on 1 thread and on all cores either way")
    p.add_argument("--budget", type=float, default=None, help="seconds of interleaved timing "
                   "per graph (default 20; --quick 0.5)")
    p.add_argument("--zoo", nargs="?", const="all", metavar="MODELS",
                   help="the model zoo instead (bench/zoo.py): Hugging Face models from their "
                   "configs, a CNN, an embedding classifier through torch.compile(backend="
                   "'opfuse') beside eager and Inductor; optionally comma-separated names; "
                   "writes zoo.json and zoo.md (--budget: seconds of timing per model, "
                   "default 2)")
    p.add_argument("--decode", type=int, nargs="?", const=64, metavar="TOKENS",
                   help="the decode benchmark instead (bench/decode.py): greedy generate() "
                   "of TOKENS new tokens (default 64) on a tiny Llama and GPT-2 through "
                   "eager, Inductor and opfuse; writes decode.json and decode.md")
    p.add_argument("--train", nargs="?", const="all", metavar="MODELS",
                   help="the training benchmark instead (bench/train.py): one training step "
                   "(forward, loss, backward) of an MLP, the small CNN, tiny BERT, GPT-2 and "
                   "Llama through eager, Inductor and opfuse; optionally comma-separated "
                   "names; writes train.json and train.md (--budget: seconds of timing per "
                   "model, default 3)")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda", "auto"),
                   help="opfuse backend (default cpu)")
    return p.parse_args(argv)


def limit_threads(threads: int) -> None:
    """Thread limits for numpy's BLAS, torch and XLA; must run before they are imported."""
    if threads <= 0:
        return
    # OPFUSE_CPU_THREADS: the zoo compiles through torch.compile, which has no threads=
    # (it ran opfuse on every core against eager on one until 2026-12-02).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPFUSE_CPU_THREADS"):
        os.environ[var] = str(threads)
    if threads == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    limit_threads(args.threads)
    if args.decode:
        from . import decode

        decode.run(args.decode, 3, args.out)
        return 0
    if args.train:
        from . import train

        names = None if args.train == "all" else args.train.split(",")
        train.run(names, args.out, 3.0 if args.budget is None else args.budget)
        return 0
    if args.zoo:
        from . import zoo

        names = None if args.zoo == "all" else args.zoo.split(",")
        return zoo.main(names, args.out, 2.0 if args.budget is None else args.budget)
    # imported only now: numpy (via opfuse), torch and jax must see the thread limits
    from opfuse.errors import OpfuseError

    from . import cases as cases_mod
    from . import output, runner, schema
    from .peers import PEERS, discover

    try:
        cases = _cases(args, cases_mod)
    except (ValueError, OSError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    if args.quick:
        skip = [p for p in PEERS if p != "numpy"]
    else:  # --no-peers: torch and jax (IREE compiles the same .mlir and stays)
        skip = [p for p in PEERS if p.startswith(("torch", "jax"))] if args.no_peers else []
    peers, missing = discover(args.threads, skip)
    print("peers found: " + (", ".join(f"{n} {p.version}" for n, p in peers.items()) or "none"))
    for name, why in missing.items():
        print(f"peer not available: {name}: {why}")
    settings = _settings(args, runner)
    try:
        doc = runner.run(cases, peers, missing, settings, ["python", "-m", "bench", *sys.argv[1:]])
    except OpfuseError as e:
        print(f"bench: opfuse failed: {e}", file=sys.stderr)
        return 1
    doc["total_run_s"] = time.perf_counter() - _START
    output.write_all(doc, args.out)
    errors = schema.validate(doc)
    if errors:
        os.replace(args.out / output.JSON_NAME, args.out / "bench.invalid.json")
        print("bench: the document does not match bench/schema.py:\n  " + "\n  ".join(errors[:20]),
              file=sys.stderr)
        return 2
    _print_summary(doc, args.out)
    return 0


def _cases(args, cases_mod):
    if args.quick:
        graph = cases_mod.resolve_names(args.graphs)[0] if args.graphs else cases_mod.QUICK_GRAPH
        found = cases_mod.builder_cases([graph], cases_mod.QUICK_SCALE, {})
    else:
        every, per = cases_mod.parse_scales(args.scale)
        names = [] if args.graphs == "none" else cases_mod.resolve_names(args.graphs)
        found = cases_mod.builder_cases(names, every, per)
    return found + [cases_mod.file_case(f) for f in args.files]


def _settings(args, runner):
    if args.quick:
        return runner.Settings(backend=args.backend, threads=args.threads,
                               budget_s=args.budget or 0.5, block_s=0.02, min_rounds=3,
                               max_rounds=10, scaling_sizes=(10, 30, 100),
                               scaling_repeat=(1, 1), quick=True)
    return runner.Settings(backend=args.backend, threads=args.threads,
                           budget_s=args.budget or 20.0, triton=not args.no_peers)


def _print_summary(doc, out: Path) -> None:
    s = doc["summary"]
    g2 = s["g2_speedup"]
    print(f"G2 speedup (unfused/fused): "
          + (f"{g2:.2f}x" if isinstance(g2, float) else g2["not_available"]))
    print(f"planning, {s['planning_largest_target_ops']}-op graph: "
          f"{s['planning_largest_s']:.3f} s wall, {s['planning_largest_cpu_s']:.3f} s CPU; "
          f"fitted exponent {s['planning_exponent']:.2f}")
    r = s["fused_over_iree_st"]
    if "not_available" not in r:
        print(f"opfuse fused / IREE 1 thread (opfuse on {r['threads'] or 'all'} thread(s)): "
              f"geomean {r['geomean']:.2f}, worst {r['worst']:.2f} ({r['worst_graph']}) over "
              f"{r['graphs']} graphs; targets <= {r['target_geomean']}, <= {r['target_worst']}")
        c = r["thread_cpu"]
        if "not_available" not in c:
            print(f"  thread CPU time: geomean {c['geomean']:.2f}, worst {c['worst']:.2f} "
                  f"({c['worst_graph']})")
    print(f"all results match the reference: {s['all_correct']}")
    print(f"total {doc['total_run_s']:.0f} s; wrote {out / 'bench.json'}, bench.md, "
          + (", ".join(doc["files"]["charts"]) if isinstance(doc["files"]["charts"], list)
             else "no charts"))


if __name__ == "__main__":
    sys.exit(main())
