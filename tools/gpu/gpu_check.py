"""gpu-check: the prepared GPU check of opfuse, for a lent GPU machine (an H200).

Two steps, because the GPU machine has no MLIR and no network:

  here (with the compiler):   tools/gpu/gpu-check prepare .gpu-check
      builds AOT bundles (PTX and cubins for sm_90, the CPU library) of the G graphs at
      benchmark size: G1-G8 in f32, the matmul graphs (G1, G5, G6, G7) in bf16 and f16;
      per graph the fused program, the unfused one, and the other matmul variants
      (bf16/f16: SIMT, ``matmul=simt``, and warpgroup MMA, ``matmul=wgmma``, built for
      sm_90a; f32: TF32 tensor cores, ``allow_tf32``); G6 and G7
      also at 1/8 size for the CPU reference; G5 also the attention section's cases
      (tools/gpu/gpu_check_attention.py). inputs.json says how to make every input.
      PyCUDA's sdist goes into .gpu-check/wheels (``--no-pycuda`` skips it).

  there (carry .gpu-check):   tools/gpu/gpu-check run .gpu-check
      writes $OUT/gpu-check.json, rewritten after every graph (a hang or a kill leaves
      what was measured), and prints a summary. Each graph runs in a child process of its
      own (a kernel fault poisons only that process's context), under a deadline the
      child checks between phases and the parent enforces. Per graph:
        * correctness: the fused program run with a synchronize and a check after every
          kernel (a fault names its kernel), against the CPU library; fused vs unfused;
        * fused and unfused program times: hot (many launches between one pair of CUDA
          events after a fixed warm-up, parameters packed once) and cold (L2 flushed);
        * per fused kernel: hot and cold time, GB/s, TFLOP/s, their fractions of the
          device's measured peaks (a D2D copy; cuBLAS through torch for FLOP/s), the H200
          estimate (cost/gpu_time.py) for matmul kernels;
        * the other matmul variants: same results, per-kernel times side by side (SIMT
          vs mma.sync vs wgmma);
        * G5: opfuse's attention kernels (tensor-core and SIMT) against torch's
          scaled_dot_product_attention on the same inputs, causal or not, head dims 64
          and 128, grouped-query heads: correctness against float64, hot and cold times,
          TFLOP/s, fraction of the estimate, opfuse/SDPA (tools/gpu/gpu_check_attention.py);
        * at the end, in one process, the same graphs in eager PyTorch and torch.compile
          on the device (torch is on the image): times, correctness, ratio to opfuse.
      The exit status is 0 only if every graph ran every phase and was correct; a graph
      skipped (out of time) or failed is named in the JSON (``skipped``, ``failed``).
      PyCUDA is built from the carried sdist in the background while the checks run on
      cuda-python, then G1-G3 run through it. Budget: under 6 minutes, start-up included.

Only the standard library and numpy are needed to run (the repository's python/, tools/
and bench/ are put on sys.path; nothing is installed). This module runs the plan (child
processes, deadlines, the JSON, the exit status); gpu_check_prepare.py has the plan and
``prepare``, gpu_check_graph.py one graph's phases, gpu_check_torch.py the PyTorch
figures, gpu_check_pycuda.py the PyCUDA build and check.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

# tools/gpu/ is not part of the installed package: the check runs from a checkout.
ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "python", ROOT / "tools" / "gpu", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

SCRIPT = ROOT / "tools" / "gpu" / "gpu-check"
BUDGET_S = 330  # stay under 6 minutes, start-up included
GRAPH_MIN_S = 12  # a graph is not started with less left than this
RESERVE_S = 25  # kept for the PyCUDA check and the last write

from gpu_check_graph import check_graph, device_info, section, section_failures, torch_section  # noqa: E402
from gpu_check_prepare import _write_json, prepare  # noqa: E402
from gpu_check_pycuda import finish_pycuda, start_pycuda_build  # noqa: E402


# ----- run (there) --------------------------------------------------------------------------
class Clock:
    def __init__(self, budget: float):
        self.start = time.time()
        self.budget = budget

    def left(self) -> float:
        return self.budget - (time.time() - self.start)


def run(
    folder: Path,
    out_dir: Path,
    *,
    budget: float = BUDGET_S,
    only: set[str] | None = None,
    dry_run: bool = False,
    isolate: bool = True,
    stub: str | None = None,
    pycuda: bool = True,
) -> int:
    """Run every planned graph (see the module docstring); returns the exit status."""
    clock = Clock(budget)
    out_path = out_dir / "gpu-check.json"
    result: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "budget_s": budget,
        "mode": "dry run (the CPU library stands in for the GPU)" if dry_run else (
            f"stub driver {stub}" if stub else "device"),
        "graphs": {},
        "failed": [],
        "skipped": [],
        "errors": [],
    }
    write = lambda: _write_json(out_path, result)  # noqa: E731
    try:
        spec = json.loads((folder / "inputs.json").read_text())
    except (OSError, ValueError) as e:
        result["errors"].append(f"no usable {folder / 'inputs.json'} ({e}): run prepare first")
        return _finish(result, write, clock)
    entries = [e for e in spec["entries"] if only is None or e["key"] in only or e["graph"] in only]
    build = start_pycuda_build(folder, result) if (pycuda and not dry_run and not stub) else None
    write()
    # torch last, in one process for every graph (importing torch and initializing its
    # CUDA state once, not once per graph)
    tasks = ["device"] + [e["key"] for e in entries] + ["torch"]
    reserve = RESERVE_S if build is not None else 2  # the PyCUDA check needs its time
    for n, key in enumerate(tasks):
        left = clock.left() - reserve
        # a fair share: no task may take more than twice what is left per remaining task
        share = max(GRAPH_MIN_S, 2 * left / (len(tasks) - n))
        if left < GRAPH_MIN_S:
            why = f"out of time: {max(0, left):.0f} s left"
            if key == "torch":  # the peers' figures, not a check of opfuse: no failure
                result["torch"] = {"not_available": why}
            else:
                result["skipped"].append({"key": key, "why": why})
            write()
            continue
        t0 = time.time()
        context = {
            "peaks": result.get("device_info", {}).get("peaks", {}),
            "only": sorted(result["graphs"]),
            "fused_s": {k: g.get("program", {}).get("fused_hot", {}).get("median_s")
                        for k, g in result["graphs"].items()},
        }
        entry = run_task(folder, key, min(left, share), out_dir, isolate=isolate,
                         dry_run=dry_run, stub=stub, context=context)
        entry["task_s"] = round(time.time() - t0, 1)
        if key == "torch":
            result["torch"] = {k: v for k, v in entry.items() if k != "graphs"}
            for k, t in entry.get("graphs", {}).items():
                result["graphs"].setdefault(k, {})["torch"] = t
        elif key == "device":
            result["device_info"] = entry
            result["binding"] = entry.get("binding")
            if entry.get("error"):
                result["errors"].append(f"device: {entry['error']}")
        else:
            result["graphs"][key] = entry
            if _failed(entry):
                result["failed"].append(key)
        print(summary_line(key, entry), flush=True)
        write()
    if build is not None:
        result["pycuda_check"] = finish_pycuda(build, folder, clock)
        print(f"pycuda: {json.dumps(result['pycuda_check'])[:1500]}", flush=True)
    return _finish(result, write, clock)


def _failed(entry: dict) -> bool:
    return bool(entry.get("error") or entry.get("not_run") or not entry.get("correct", {}).get("ok")
                or section_failures(entry))


def _finish(result: dict, write, clock: Clock) -> int:
    result["elapsed_s"] = round(time.time() - clock.start, 1)
    bad = result["failed"] or result["skipped"] or not result["graphs"] or result["errors"]
    result["exit_status"] = 1 if bad else 0
    write()
    for key in result["failed"]:
        g = result["graphs"][key]
        print(f"FAILED {key}: {g.get('error') or g.get('not_run') or '; '.join(section_failures(g)) or 'results differ'}")
    for s in result["skipped"]:
        print(f"SKIPPED {s['key']}: {s['why']}")
    print(f"exit status {result['exit_status']}; {result['elapsed_s']} s")
    return result["exit_status"]


def run_task(folder, key, seconds, out_dir, *, isolate, dry_run, stub, context) -> dict:
    """One task (``device`` or a graph key) with ``seconds`` to finish: in a child process
    (the default) or here."""
    deadline = time.time() + seconds
    if not isolate:
        entry: dict = {}
        task(folder, key, deadline, entry, lambda: None, dry_run=dry_run, stub=stub, context=context)
        return entry
    part = out_dir / f".gpu-check.{key}.json"
    cmd = [sys.executable, str(SCRIPT), "task", str(folder), key, "--out", str(part),
           "--deadline", str(deadline)]
    if dry_run:
        cmd.append("--dry-run")
    if stub:
        cmd += ["--stub", stub]
    cmd += ["--context", json.dumps(context)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 10)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = None, str(e.stdout or "")[-3000:]
    try:
        entry = json.loads(part.read_text())
        part.unlink()
    except (OSError, ValueError):
        entry = {}
    if rc is None:
        entry["error"] = entry.get("error") or f"timed out after {seconds:.0f} s (killed)"
    elif rc != 0 and not entry.get("error"):
        entry["error"] = f"the child exited with status {rc}"
    if rc != 0:
        entry["output_tail"] = tail
    return entry


def task(folder, key, deadline, entry, save, *, dry_run=False, stub=None, context=None) -> None:
    """Run task ``key`` (``device``, a graph key, ``torch``) into ``entry`` (``save()``
    after every phase). ``context``: the device's peaks, the graphs run so far and their
    fused program times."""
    context = context or {}
    try:
        if stub:
            _install_stub(stub, folder, key)
        spec = json.loads((folder / "inputs.json").read_text()) if key != "device" else {}
        if key == "device":
            device_info(entry, deadline, dry_run)
        elif key == "torch":
            if dry_run or stub:
                entry["not_available"] = "no device for torch (dry run or stub driver)"
            else:
                torch_section(folder, spec, entry, deadline, save, context)
        else:
            (e,) = [x for x in spec["entries"] if x["key"] == key]
            check_graph(folder, spec, e, entry, deadline, save, dry_run=dry_run,
                        peaks=context.get("peaks") or {})
    except Exception as exc:  # noqa: BLE001  (the JSON says what went wrong, never a lost run)
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc()[-3000:]
    save()


def _install_stub(stub: str, folder: Path, key: str) -> None:
    """``path.py:factory[:arg]``: a driver standing in for the GPU (tests)."""
    path, factory, *arg = stub.split(":")
    spec = importlib.util.spec_from_file_location("gpu_check_stub", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from opfuse.runtime import cuda_driver

    drv = getattr(mod, factory)(folder, key, *([":".join(arg)] if arg else []))
    cuda_driver.install(drv)
    attention = section("attention")
    if hasattr(mod, "make_torch") and attention is not None:  # torch's CUDA calls too
        attention.install_torch(mod.make_torch(drv))


def summary_line(key: str, e: dict) -> str:
    if e.get("error"):
        return f"{key:28s} ERROR {e['error']}"
    if key == "torch":
        rows = []
        for k, g in e.get("graphs", {}).items():
            eager, comp = g.get("eager", {}), g.get("compile", {})
            fig = lambda r: f"{r['median_s'] * 1e3:.3f}ms" if "median_s" in r else "n/a"  # noqa: E731
            rows.append(f"{k}: eager {fig(eager)} compile {fig(comp)}")
        return f"{key:28s} " + ("; ".join(rows) or e.get("not_available", "nothing measured"))
    if key == "device":
        peaks = e.get("peaks", {})
        return f"{key:28s} {e.get('binding')} {e.get('chip', '')} " + " ".join(
            f"{k}={v:.3g}" for k, v in peaks.items() if isinstance(v, (int, float)))
    c = e.get("correct", {})
    p = e.get("program", {})
    times = ""
    if p:
        times = (f" fused={p['fused_hot']['median_s'] * 1e3:.3f}ms "
                 f"unfused={p['unfused_hot']['median_s'] * 1e3:.3f}ms x{p['speedup_hot']:.2f}")
    torch_ = e.get("torch", {}).get("eager", {})
    if isinstance(torch_, dict) and "median_s" in torch_:
        times += f" eager={torch_['median_s'] * 1e3:.3f}ms"
    missing = f" NOT RUN: {e['not_run']}" if e.get("not_run") else ""
    line = f"{key:28s} correct={c.get('ok')} (max err {c.get('max_abs_err', float('nan')):.2e}){times}{missing}"
    attention = section("attention") if isinstance(e.get("attention"), dict) else None
    if attention is not None:
        line += f"\n{'':28s} attention vs SDPA: {attention.summary(e['attention'])}"
    return line


# ----- command line ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the bundles (needs the compiler)")
    p.add_argument("folder", nargs="?", default=".gpu-check", type=Path)
    p.add_argument("--targets", default="sm_90")
    p.add_argument("--graphs", help="comma-separated graph names (default: the whole plan)")
    p.add_argument("--dtypes", help="comma-separated: f32, bf16, f16 (default: all)")
    p.add_argument("--scale", type=int, default=1, help="divide every size by this (tests)")
    p.add_argument("--no-pycuda", action="store_true", help="do not fetch PyCUDA's sdist (offline)")
    r = sub.add_parser("run", help="run the bundles on the GPU, write $OUT/gpu-check.json")
    r.add_argument("folder", nargs="?", default=".gpu-check", type=Path)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    r.add_argument("--dry-run", action="store_true",
                   help="no GPU: run the CPU library in place of the GPU (checks the script)")
    r.add_argument("--only", help="comma-separated graph keys (g1_mlp.bf16) or names")
    r.add_argument("--budget", type=float, default=BUDGET_S, help="seconds (default %(default)s)")
    r.add_argument("--in-process", action="store_true", help="no child process per graph")
    r.add_argument("--no-pycuda", action="store_true", help="do not build and check PyCUDA")
    r.add_argument("--stub", help=argparse.SUPPRESS)  # tests: path.py:factory[:arg]
    t = sub.add_parser("task", help=argparse.SUPPRESS)  # one graph, in a child process
    t.add_argument("folder", type=Path)
    t.add_argument("key")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--deadline", type=float, required=True)
    t.add_argument("--dry-run", action="store_true")
    t.add_argument("--stub")
    t.add_argument("--context", help="JSON: peaks, graphs run, fused times")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        from opfuse.errors import OpfuseError

        split = lambda s: set(s.split(",")) if s else None  # noqa: E731
        try:
            return prepare(args.folder, args.targets.split(","), graphs=split(args.graphs),
                           dtypes=split(args.dtypes), scale=args.scale,
                           fetch_pycuda=not args.no_pycuda)
        except OpfuseError as e:
            print(f"gpu-check: {e}", file=sys.stderr)
            return 1
    if args.cmd == "task":
        entry: dict = {}
        task(args.folder, args.key, args.deadline, entry, lambda: _write_json(args.out, entry),
             dry_run=args.dry_run, stub=args.stub,
             context=json.loads(args.context) if args.context else None)
        return 1 if entry.get("error") else 0
    only = set(args.only.split(",")) if args.only else None
    return run(args.folder, args.out, budget=args.budget, only=only, dry_run=args.dry_run,
               isolate=not args.in_process, stub=args.stub, pycuda=not args.no_pycuda)


if __name__ == "__main__":
    sys.exit(main())
