"""The benchmark run: every case through opfuse (fused and unfused) and the peers.

Per case, in this order (cold compile times need the first compile of the graph):
compile time per stage (cold, then warm) -> ``opfuse.compile`` fused and unfused ->
inputs and the reference -> peers prepared (their compile time and kernel count) ->
correctness of every contender -> interleaved timing. Then the compile-time scaling
section. :func:`run` returns the JSON document (SCHEMA.md).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

import opfuse
from opfuse.errors import OpfuseError

from . import SCHEMA_ID, compile_time, measure, scaling
from .cases import Case, uniform_inputs
from .contractions import contractions_alone
from .peers import PEERS, Peer, Prepared, not_available, version_of

#: A result matches when max|out - ref| <= TOLERANCE * max(1, max|ref|) (f32 throughout;
#: the largest reductions, G7's 2816-long dot products, stay near 1e-5).
TOLERANCE = 2e-3

#: The issue's targets, recorded beside the figures (the benchmark reports, never fails).
TARGETS = {"g2_speedup_min": 2.0, "planning_largest_s_max": 2.0, "planning_exponent_max": 1.2}

#: Issue 13's targets for opfuse fused / IREE on one thread over the G graphs.
IREE_TARGETS = {"geomean": 1.0, "worst": 1.5}

#: Issue 13's fusion-win target: fused at least this much faster than unfused on these.
FUSION_WIN = {"min": 1.5, "graphs": ("g2_elementwise_chain", "g3_softmax", "g4_layernorm",
                                     "g6_encoder_layer")}

_TINY = """func.func @warmup(%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %e = tensor.empty() : tensor<4x4xf32>
  %r = linalg.add ins(%a, %b : tensor<4x4xf32>, tensor<4x4xf32>)
                  outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
"""


@dataclass
class Settings:
    """How to measure (recorded in the JSON)."""

    backend: str = "cpu"
    threads: int = 1
    budget_s: float = 20.0  # interleaved timing, per case
    block_s: float = 0.2
    min_rounds: int = 7
    max_rounds: int = 30
    scaling_sizes: tuple[int, ...] = scaling.SIZES
    scaling_repeat: tuple[int, int] = (5, 3)  # sizes <= 1000, larger
    quick: bool = False
    triton: bool = True  # the Triton GPU peer in gpu_estimate (--no-peers: off)
    log: Callable[[str], None] = field(default=print)


def run(cases: Sequence[Case], peers: dict[str, Peer], missing: dict[str, str],
        settings: Settings, command: Sequence[str]) -> dict[str, Any]:
    """The whole benchmark; returns the JSON document."""
    t0 = time.perf_counter()
    log = settings.log
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command),
        "quick": settings.quick,
        "machine": _machine(settings),
        "versions": _versions(),
        "settings": _settings_json(settings),
        "peers": {n: ({"version": peers[n].version, "init_s": peers[n].init_s}
                      if n in peers else not_available(missing[n])) for n in PEERS},
    }
    init_s = compile_time.process_init(_TINY)
    doc["compile_time"] = {"meaning": compile_time.MEANING, "process_init_s": init_s,
                           "stages": list(compile_time.STAGES) + ["ptxas"]}
    doc["graphs"], doc["skipped"] = [], []
    for case in cases:
        log(f"{case.name} (scale {case.scale if case.scale is not None else '-'}):")
        try:
            doc["graphs"].append(bench_case(case, peers, settings))
        except OpfuseError as e:  # e.g. a file opfuse cannot compile: the others still run
            log(f"  skipped: opfuse failed: {e}")
            doc["skipped"].append({"name": case.name, "source": case.source,
                                   "reason": f"opfuse failed: {e}"[:2000]})
    log("compile-time scaling:")
    doc["scaling"] = scaling.run(settings.scaling_sizes, *settings.scaling_repeat, log=log)
    log("GPU matmul and attention kernels (H200 estimates):")
    doc["gpu_estimate"] = _gpu_estimate(settings, log)
    doc["summary"] = _summary(doc)
    doc["total_run_s"] = time.perf_counter() - t0
    return doc


def bench_case(case: Case, peers: dict[str, Peer], settings: Settings) -> dict[str, Any]:
    """One graph: kernels, bytes, correctness, times, compile times (SCHEMA.md)."""
    log = settings.log
    compile_figures = _compile_times(case, settings)
    fused = opfuse.compile(case.text, backend=settings.backend, fusion=True,
                           threads=settings.threads)
    unfused = opfuse.compile(case.text, backend=settings.backend, fusion=False,
                             threads=settings.threads)
    arrays = case.inputs(fused.signature)
    reference = case.reference(arrays)
    outputs = {"unfused": _as_list(unfused(*arrays)), "fused": _as_list(fused(*arrays))}
    prepared: dict[str, Prepared | dict] = {}
    for name in PEERS:
        if name not in peers:
            prepared[name] = not_available("peer not found")
        elif peers[name].source == "mlir":  # IREE: the very text opfuse compiles
            prepared[name] = _prepare(peers[name], case, arrays, log, case.text)
        elif case.model is None:
            prepared[name] = not_available("no peer version of a graph given as a file")
        else:
            prepared[name] = _prepare(peers[name], case, arrays, log)
    totals = fused.report["totals"]
    entry: dict[str, Any] = {
        "name": case.name,
        "source": case.source,
        "scale": case.scale if case.scale is not None else not_available("file: full size"),
        "doc": case.doc,
        "inputs": [{"shape": list(s.shape), "dtype": s.element_type}
                   for s in fused.signature.inputs],
        "kernels": {
            "before": totals["before"]["kernels"],
            "after": totals["after"]["kernels"],
            "inductor": _peer_kernels(prepared["torch_compile"], "count"),
            "xla": _peer_kernels(prepared["jax_jit"], "count"),
            "iree": _peer_kernels(prepared["iree_st"], "count"),
            "iree_cuda": _iree_cuda(prepared["iree_st"]),
            "inductor_detail": _peer_kernels(prepared["torch_compile"], None),
            "xla_detail": _peer_kernels(prepared["jax_jit"], None),
            "iree_detail": _peer_kernels(prepared["iree_st"], None),
        },
        "bytes": {"before": totals["before"]["bytes"], "after": totals["after"]["bytes"],
                  "saved": totals["bytes_saved"]},
        "flops": {"before": totals["before"]["flops"], "after": totals["after"]["flops"]},
        "correctness": _correctness(outputs, prepared, reference),
    }
    entry["time"] = _timing(fused, unfused, arrays, prepared, settings, _alone(case, settings))
    compile_figures["peers"] = {
        name: (p.compile_s if isinstance(p, Prepared) else p)
        for name, p in prepared.items() if name in ("torch_compile", "jax_jit", "iree_st")
    }
    entry["compile"] = compile_figures
    _log_case(entry, log)
    return entry


def _compile_times(case: Case, settings: Settings) -> dict[str, Any]:
    if settings.backend != "cpu":
        na = not_available("per-stage compile time is wired for the cpu backend only")
        return {"fused": {"cold": na, "warm": na}, "unfused": {"cold": na, "warm": na}}
    return compile_time.cold_and_warm(case.text, f"{case.name}.mlir")


def _prepare(peer: Peer, case: Case, arrays: list[np.ndarray], log,
             source: Any = None) -> Prepared | dict:
    try:
        return peer.prepare(case.model if source is None else source, arrays)
    except Exception as e:  # a peer that cannot run a graph is a figure, not a crash
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        log(f"  {peer.name}: failed: {reason}")
        return not_available(f"failed: {reason}")


def _as_list(out: Any) -> list[np.ndarray]:
    return list(out) if isinstance(out, tuple) else [out]


def _peer_kernels(p: Prepared | dict, key: str | None) -> Any:
    if not isinstance(p, Prepared):
        return p
    if key is None or "not_available" in p.kernels:
        return p.kernels
    return p.kernels[key]


def _iree_cuda(p: Prepared | dict) -> Any:
    """IREE's dispatch count for CUDA sm_80 (bench/peers/iree.py), or why there is none."""
    if not isinstance(p, Prepared) or "not_available" in p.kernels:
        return _peer_kernels(p, None)
    cuda = p.kernels["cuda"]
    return cuda.get("count", cuda)


def _error(out: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> dict[str, Any]:
    err = 0.0
    for o, r in zip(out, ref):
        o, r = np.asarray(o, dtype=np.float64), np.asarray(r, dtype=np.float64)
        if o.shape != r.shape:
            return {"max_scaled_error": not_available(f"shape {o.shape} != {r.shape}"),
                    "ok": False}
        if r.size:
            scale = max(1.0, float(np.max(np.abs(r))))
            err = max(err, float(np.max(np.abs(o - r))) / scale)
    if not math.isfinite(err):
        return {"max_scaled_error": not_available("non-finite output"), "ok": False}
    return {"max_scaled_error": err, "ok": bool(err <= TOLERANCE)}


def _correctness(outputs: dict, prepared: dict, reference) -> dict[str, Any]:
    ref = reference if reference is not None else outputs["unfused"]
    result: dict[str, Any] = {
        "against": "builder float64 reference" if reference is not None else "opfuse unfused",
        "tolerance": TOLERANCE,
        "unfused": _error(outputs["unfused"], ref),
        "fused": _error(outputs["fused"], ref),
    }
    for name, p in prepared.items():
        result[name] = _error([p.output], ref) if isinstance(p, Prepared) else p
    return result


def _alone(case: Case, settings: Settings) -> tuple[Any, list[np.ndarray]] | dict[str, str]:
    """The graph's contractions alone (bench/contractions.py), compiled unfused as the
    unfused program's contractions are, with its inputs; or why there is none."""
    text = contractions_alone(case.text)
    if text is None:
        return not_available("no contraction in the graph")
    exe = opfuse.compile(text, backend=settings.backend, fusion=False, threads=settings.threads)
    return exe, uniform_inputs(exe.signature)


def _timing(fused, unfused, arrays, prepared, settings: Settings,
            alone: tuple[Any, list[np.ndarray]] | dict[str, str]) -> dict[str, Any]:
    blocks: dict[str, measure.Block] = {
        "unfused": lambda r: unfused.time(*arrays, repeat=r, warmup=0),
        "fused": lambda r: fused.time(*arrays, repeat=r, warmup=0),
    }
    if not _na(alone):
        exe, alone_arrays = alone
        blocks["contractions_alone"] = lambda r: exe.time(*alone_arrays, repeat=r, warmup=0)
    for name, p in prepared.items():
        if isinstance(p, Prepared):
            blocks[name] = lambda r, run=p.run: measure.timed_calls(run, r)
    samples = measure.interleave(blocks, budget_s=settings.budget_s, block_s=settings.block_s,
                                 min_rounds=settings.min_rounds, max_rounds=settings.max_rounds)
    out: dict[str, Any] = {
        "backend": settings.backend,
        "unfused": measure.summary(samples["unfused"]),
        "fused": measure.summary(samples["fused"]),
        "speedup": measure.ratio(samples["unfused"], samples["fused"]),
        "contractions_alone": alone if _na(alone) else {
            **measure.summary(samples["contractions_alone"]),
            "unfused_over": measure.ratio(samples["unfused"], samples["contractions_alone"])},
        "peers": {},
    }
    for name, p in prepared.items():
        if name in samples:
            figures = measure.summary(samples[name])
            figures["ratio_to_fused"] = measure.ratio(samples[name], samples["fused"])
            out["peers"][name] = figures
        else:
            out["peers"][name] = p
    out["thread_cpu"] = _thread_cpu(samples, settings)
    return out


#: Contenders whose work runs on the calling thread when limited to one thread (jax.jit
#: runs on XLA's own threads; iree_mt on its task pool).
_CALLING_THREAD = ("unfused", "fused", "numpy", "torch_eager", "torch_compile", "iree_st")


def _thread_cpu(samples: dict[str, measure.Samples], settings: Settings) -> dict[str, Any]:
    """Thread CPU time per call of the single-threaded contenders, and their ratios to
    fused (measure.py: on a shared machine, what they computed rather than how long they
    waited for a core)."""
    names = [n for n in _CALLING_THREAD if n in samples
             and (settings.threads == 1 or n == "iree_st")]
    if "fused" not in names:
        return not_available(f"opfuse ran on {settings.threads or 'every core'} threads: "
                             "thread CPU time is compared on one thread only")
    fused = samples["fused"]
    per = {}
    for n in names:
        if n == "fused":
            continue
        per[n] = {"median_s": statistics.median(samples[n].cpu_rounds),
                  "ratio_to_fused": measure.cpu_ratio(samples[n], fused)}
    return {"fused_s": statistics.median(fused.cpu_rounds), "contenders": per}


def _log_case(e: dict[str, Any], log) -> None:
    t, k = e["time"], e["kernels"]
    peers = ", ".join(
        f"{n} {v['median_s'] * 1e3:.2f} ms" for n, v in t["peers"].items() if "median_s" in v
    )
    bad = [n for n, c in e["correctness"].items() if isinstance(c, dict) and c.get("ok") is False]
    log(f"  kernels {k['before']} -> {k['after']}; "
        f"unfused {t['unfused']['median_s'] * 1e3:.2f} ms, "
        f"fused {t['fused']['median_s'] * 1e3:.2f} ms, speedup {t['speedup']['median']:.2f}x"
        + (f"; {peers}" if peers else "") + (f"; MISMATCH: {', '.join(bad)}" if bad else ""))


def _gpu_estimate(settings: Settings, log) -> dict[str, Any]:
    """Per matmul and attention kernel, the analytic H200 estimate and the roofline
    (bench/gpu_estimate.py): G1, G5, G6, G7 at full size in bf16 and f32, beside the Triton
    peer's kernels for the same work; --quick: G1 and G5 in bf16 at 1/8 size, no Triton."""
    from . import gpu_estimate

    try:
        if settings.quick:
            return gpu_estimate.run(("g1_mlp", "g5_attention"), ("bf16",), scale=8, log=log,
                                    triton="skipped (--quick)")
        return gpu_estimate.run(log=log, triton=settings.triton or "skipped (--no-peers)")
    except OpfuseError as e:
        return not_available(f"opfuse failed: {e}"[:2000])


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    g2 = next((g for g in doc["graphs"] if g["name"] == "g2_elementwise_chain"), None)
    s = doc["scaling"]
    speedup = g2["time"]["speedup"]["median"] if g2 else not_available("G2 not in this run")
    met = {
        "g2_speedup": (speedup >= TARGETS["g2_speedup_min"]) if g2 else speedup,
        "planning_largest": s["planning_largest_s"] < TARGETS["planning_largest_s_max"],
        "planning_exponent": s["planning_exponent"] <= TARGETS["planning_exponent_max"],
    }
    if doc["quick"]:  # smoke sizes say nothing about the targets
        met = {k: not_available("--quick smoke run: sizes too small to judge") for k in met}
    return {
        "g2_speedup": speedup,
        "g2_scale": g2["scale"] if g2 else not_available("G2 not in this run"),
        "fused_over_iree_st": _fused_over_iree(doc),
        "fusion_win": _fusion_win(doc),
        "planning_largest_s": s["planning_largest_s"],
        "planning_largest_cpu_s": s["planning_largest_cpu_s"],
        "planning_largest_target_ops": s["largest_target_ops"],
        "planning_exponent": s["planning_exponent"],
        "targets": dict(TARGETS),
        "met": met,
        "all_correct": all(
            c.get("ok", True) for g in doc["graphs"] for c in g["correctness"].values()
            if isinstance(c, dict)
        ),
    }


def _fusion_win(doc: dict[str, Any]) -> dict[str, Any]:
    """Issue 13's fusion-win target per graph of :data:`FUSION_WIN` in this run: the
    speedup, and beside it unfused / contractions alone (about the most fusion can reach
    with the same contraction code; bench/contractions.py)."""
    per = {}
    for g in doc["graphs"]:
        if g["name"] in FUSION_WIN["graphs"] and g["source"] == "builder":
            t = g["time"]
            alone = t["contractions_alone"]
            per[g["name"]] = {
                "speedup": t["speedup"]["median"],
                "unfused_over_contractions": (alone if _na(alone)
                                              else alone["unfused_over"]["median"]),
                "met": t["speedup"]["median"] >= FUSION_WIN["min"]}
    if not per:
        return not_available("none of its graphs in this run")
    if doc["quick"]:
        return not_available("--quick smoke run: sizes too small to judge")
    return {"target_min": FUSION_WIN["min"], "per_graph": per,
            "met": all(p["met"] for p in per.values())}


def _na(v: Any) -> bool:
    return isinstance(v, dict) and "not_available" in v


def _fused_over_iree(doc: dict[str, Any]) -> dict[str, Any]:
    """opfuse fused / IREE one-thread time over the G graphs of the run (each the median
    of the per-round ratios): geometric mean and worst, beside issue 13's targets."""
    wall, cpu = {}, {}
    for g in doc["graphs"]:
        peer = g["time"]["peers"].get("iree_st", {})
        if g["source"] == "builder" and "ratio_to_fused" in peer:
            wall[g["name"]] = 1.0 / peer["ratio_to_fused"]["median"]
            tc = g["time"]["thread_cpu"]
            if "contenders" in tc and "iree_st" in tc["contenders"]:
                cpu[g["name"]] = 1.0 / tc["contenders"]["iree_st"]["ratio_to_fused"]["median"]
    if not wall:
        return not_available("no G graph ran on IREE in this run")
    out = _geomean_worst(wall)
    out.update(threads=doc["settings"]["threads"], target_geomean=IREE_TARGETS["geomean"],
               target_worst=IREE_TARGETS["worst"])
    out["thread_cpu"] = (_geomean_worst(cpu) if len(cpu) == len(wall) else
                         not_available("opfuse did not run on one thread"))
    return out


def _geomean_worst(ratios: dict[str, float]) -> dict[str, Any]:
    worst = max(ratios, key=ratios.get)
    geomean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    return {"graphs": len(ratios), "geomean": geomean, "worst": ratios[worst],
            "worst_graph": worst, "per_graph": ratios,
            "met": bool(geomean <= IREE_TARGETS["geomean"]
                        and ratios[worst] <= IREE_TARGETS["worst"])}


def _machine(settings: Settings) -> dict[str, Any]:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 0
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "cpus": cpus,
        "backend": settings.backend,
        "gpu": not_available("CPU run (opfuse has no GPU runtime yet)")
        if settings.backend == "cpu" else settings.backend,
    }


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"opfuse": opfuse.__version__}
    for key, module in (("mlir_bindings", None), ("numpy", "numpy"), ("torch", "torch"),
                        ("jax", "jax"), ("jaxlib", "jaxlib"), ("matplotlib", "matplotlib")):
        v = _dist_version("xtc-mlir-python-bindings") if module is None else version_of(module)
        out[key] = v if v else not_available("not installed")
    out["opfuse_tree"] = _tree_state()
    return out


def _tree_state() -> dict[str, Any]:
    """The opfuse checkout measured: HEAD and whether its sources had uncommitted changes
    (a benchmark of a dirty tree is still a figure, but not one a commit reproduces)."""
    import subprocess
    from pathlib import Path

    root = Path(opfuse.__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "python", "passes", "tools"], cwd=root,
            capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return not_available("not a git checkout (or git missing)")
    return {"commit": head, "uncommitted_source_files": len(changed)}


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _settings_json(s: Settings) -> dict[str, Any]:
    return {
        "backend": s.backend,
        "threads": s.threads,
        "threads_meaning": (
            "opfuse's CPU code compiled for this many threads (0 = every usable core) and "
            "the peers limited to as many (torch.set_num_threads, OMP/OpenBLAS/MKL "
            "variables, XLA_FLAGS; 0 = library defaults); iree_st always runs on one "
            "thread (local-sync), iree_mt on every usable core (local-task) unless this "
            "is above 1"
        ),
        "time_budget_s": s.budget_s,
        "block_s": s.block_s,
        "min_rounds": s.min_rounds,
        "max_rounds": s.max_rounds,
        "timing_method": (measure.__doc__ or "").strip(),
        "tolerance": TOLERANCE,
    }
