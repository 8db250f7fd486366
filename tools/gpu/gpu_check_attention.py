"""gpu-check's attention section: opfuse's attention kernels against PyTorch's
``scaled_dot_product_attention`` on the same inputs, on the device (tools/gpu/gpu_check.py).

Cases (``CASES``), at benchmark size for every ``g5_attention`` entry of the plan (f32,
f16, bf16): G5 itself ([8, 8, 512, 64], not causal: the entry's own bundles), G5 causal,
head dim 128 with and without the causal mask, and grouped-query attention (8 query heads
over 2 K/V heads, causal: K and V broadcast by reshape/broadcast as ``repeat_kv`` does,
``enable_gqa`` for SDPA). The causal mask is the graph's own ``iota >= iota`` in i64 (an
iota in bf16 is not exact past 256 and would not be a causal mask). Each case is
prepared here (``prepare_entry``) as the default bundle (f16/bf16: the tensor-core
``attention_mma`` kernel; f32: the SIMT ``attention`` kernel) and, for f16/bf16, the
SIMT variant (``matmul=simt``); the bundles join the entry's, so the GPU run loads them
like any other.

There (``run_graph``, called by gpu_check_graph for each entry that has cases), per case:

* correctness: each opfuse variant (run with a synchronize and a check after every
  kernel, so a fault names its kernel) and SDPA against a float64 reference computed
  here with numpy (``softmax(Q Kᵀ / sqrt(d) [causal]) V``), within gpu-check's stated
  tolerances (gpu_check_graph.compare: f32 rtol 1e-3 / atol 1e-4; f16 1e-2 and bf16
  3e-2 of max(1, max |reference|)), and opfuse against SDPA with the same tolerances;
* times, by runtime/cuda_timing.py's measurement (hot: many launches between one pair of
  events after a warm-up; cold: the L2 flushed by a memset before each launch): opfuse's
  program (its kernels, parameters packed once) through the CUDA driver, SDPA through
  torch's events on torch's stream (:class:`TorchCuda` speaks cuda_timing's driver
  protocol);
* per opfuse kernel gpu_check_graph.per_kernel's row (hot and cold, GB/s, the H200
  estimate of cost/gpu_time.py), and ``fraction_of_estimate`` = estimate / measured;
* TFLOP/s of both from the useful FLOPs, ``2 (D + Dv)`` per attended (query, key) pair
  (a causal row attends to its keys up to the diagonal: FlashAttention's convention), and
  ``opfuse_over_sdpa`` = opfuse's hot time / SDPA's (below 1: opfuse is faster).

The section's entry is rewritten after every case (a kill leaves what was measured). A
case that fails (a kernel fault, wrong results) is named in the case and makes the
section's ``ok`` false, which fails the graph (the exit status is 1); the other cases
still run. SDPA's own disagreement with the reference is reported, not failed (a peer's
figures, not a check of opfuse); a device without torch gives SDPA figures
``{"not_available": why}``.
"""

from __future__ import annotations

import math
import time
import traceback
from pathlib import Path

#: The attention cases at full size: (name, batch, heads, K/V heads, sequence, head dim,
#: causal). ``g5`` is the g5_attention graph itself (its entry's bundles).
CASES = (
    ("g5", 8, 8, 8, 512, 64, False),
    ("g5_causal", 8, 8, 8, 512, 64, True),
    ("d128", 8, 8, 8, 512, 128, False),
    ("d128_causal", 8, 8, 8, 512, 128, True),
    ("gqa4_causal", 8, 8, 2, 512, 64, True),
)
GRAPH = "g5_attention"
#: Seconds a case needs to start (loads, the reference, a correctness run, timings).
CASE_MIN_S = 4.0
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


# ----- here: the cases' bundles ---------------------------------------------------------------
def case_graph(name: str, batch: int, heads: int, kv_heads: int, seq: int, dim: int,
               causal: bool, dtype: str):
    """softmax(Q Kᵀ / sqrt(dim) [causal]) V with K/V broadcast to the query heads."""
    from opfuse.builder import Graph

    g = Graph(f"attention_{name}", dtype=dtype)
    q = g.input("q", (batch, heads, seq, dim))
    k = g.input("k", (batch, kv_heads, seq, dim))
    v = g.input("v", (batch, kv_heads, seq, dim))
    if kv_heads != heads:
        def repeat(x):
            x = g.reshape(x, (batch, kv_heads, 1, seq, dim))
            x = g.broadcast_to(x, (batch, kv_heads, heads // kv_heads, seq, dim))
            return g.reshape(x, (batch, heads, seq, dim))

        k, v = repeat(k), repeat(v)
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2)), name="qk"), 1.0 / math.sqrt(dim),
              name="scale")
    if causal:
        keep = g.ge(g.iota((seq, seq), 0, dtype="i64"), g.iota((seq, seq), 1, dtype="i64"),
                    name="causal")
        s = g.where(keep, s, float("-inf"), name="causal_mask")
    g.output(g.matmul(g.softmax(s), v, name="pv"))
    return g


def _sizes(case: tuple, scale: int) -> dict:
    name, b, h, kvh, t, d, causal = case
    s = lambda n: max(1, n // scale)  # noqa: E731  (batch and sequence; heads, dims kept)
    return {"name": name, "batch": s(b), "heads": h, "kv_heads": kvh, "seq": s(t), "dim": d,
            "causal": causal}


def prepare_entry(folder: Path, entry: dict, *, targets, scale: int, graph) -> dict | None:
    """The attention cases of a ``g5_attention`` entry (None for other graphs): bundles
    written to ``folder`` and added to ``entry["bundles"]``; what ``run_graph`` needs."""
    if entry["graph"] != GRAPH:
        return None
    import opfuse

    dtype, key, files = entry["dtype"], entry["key"], entry["bundles"]
    half = dtype in ("f16", "bf16")
    cases = []
    for case in CASES:
        c = _sizes(case, scale)
        inputs = None
        if c["name"] == "g5":  # the entry's own graph and bundles
            (q,) = [t for t in graph.inputs if t.name == "q"]
            c.update(batch=q.shape[0], heads=q.shape[1], kv_heads=q.shape[1], seq=q.shape[2],
                     dim=q.shape[3])
            variants = {"fused": "fused", **({"simt": "simt"} if half else {})}
            inputs = entry["inputs"]
        else:
            g = case_graph(dtype=dtype, **c)
            exe = opfuse.compile(g, backend="cpu")
            variants = {}
            for variant, options in (("fused", {}), *((("simt", {"matmul": "simt"}),) if half else ())):
                bname = f"attention.{c['name']}.{variant}"
                files[bname] = f"{key}.{bname}.opfuse"
                exe.save_bundle(folder / files[bname], targets=targets, **options)
                variants[variant] = bname
            inputs = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "scale": 1.0}
                      for t in g.inputs]
        cases.append({**c, "bundles": variants, "inputs": inputs})
    return {"cases": cases}


# ----- there: torch's device ------------------------------------------------------------------
class TorchCuda:
    """PyTorch on the CUDA device: SDPA, and cuda_timing's driver protocol (``elapsed``,
    ``alloc``, ``memset``, ``attribute``) on torch's own stream and events, so SDPA is
    timed the way opfuse's kernels are."""

    name = "torch"
    device = "cuda"

    def __init__(self):
        import torch
        import torch.nn.functional as F

        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device here")
        self.torch, self.F = torch, F

    def tensor(self, values, dtype: str):
        """float64 ``values`` (exact in ``dtype``) as a device tensor of ``dtype``."""
        t = self.torch.from_numpy(values)
        return t.to(device=self.device, dtype=getattr(self.torch, TORCH_DTYPES[dtype]))

    def sdpa(self, q, k, v, causal: bool):
        return self.F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])

    def values(self, t):
        return t.double().cpu().numpy()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def elapsed(self, work) -> float:
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def alloc(self, nbytes: int):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def memset(self, buf, byte: int, nbytes: int) -> None:
        buf[:nbytes].fill_(byte)

    def attribute(self, name: str) -> int:
        if name == "L2_CACHE_SIZE":
            return int(self.torch.cuda.get_device_properties(0).L2_cache_size)
        raise KeyError(name)


_TORCH: dict = {}


def install_torch(dev) -> None:
    """Make ``dev`` the torch device (a stand-in: gpu-check's tests on a stubbed driver)."""
    _TORCH["device"] = dev


def torch_device():
    """(the torch device, None) or (None, why it is not available)."""
    if "device" not in _TORCH:
        try:
            _TORCH["device"] = TorchCuda()
        except Exception as e:  # noqa: BLE001  (no torch, no CUDA device: figures say so)
            _TORCH["device"] = None
            _TORCH["why"] = f"{type(e).__name__}: {e}"
    return _TORCH["device"], _TORCH.get("why")


# ----- there: the section ---------------------------------------------------------------------
def reference(values, causal: bool):
    """float64 ``softmax(Q Kᵀ / sqrt(d) [causal]) V``, K/V repeated to the query heads."""
    import numpy as np

    q, k, v = values
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return (s / s.sum(axis=-1, keepdims=True)) @ v


def useful_flops(c: dict) -> float:
    """``2 (D + Dv)`` per attended (query, key) pair, over batch x heads."""
    t = c["seq"]
    pairs = t * (t + 1) // 2 if c["causal"] else t * t
    return 2.0 * (2 * c["dim"]) * pairs * c["batch"] * c["heads"]


def run_graph(context: dict) -> dict:
    """The section for one entry (see the module docstring); fills ``context["out"]``
    (saved with ``context["save"]()`` after every case) and returns it."""
    out = context.get("out", {})
    save = context.get("save", lambda: None)
    spec = context["entry"].get("attention") or {}
    out.update(cases=[], ok=True)
    if not context.get("dry_run"):
        dev, why = torch_device()
        out["sdpa"] = {"torch": dev.torch.__version__} if dev is not None else {"not_available": why}
    for c in spec.get("cases", []):
        left = context["deadline"] - time.time()
        if left < CASE_MIN_S:
            out.setdefault("not_run", []).append(f"{c['name']} (out of time: {left:.0f} s left)")
            out["ok"] = False
            save()
            continue
        row = {k: c[k] for k in ("name", "batch", "heads", "kv_heads", "seq", "dim", "causal")}
        row["flops"] = useful_flops(c)
        out["cases"].append(row)
        t0 = time.time()
        try:
            _case(context, c, row)
        except Exception as e:  # noqa: BLE001  (named in the case; the other cases still run)
            row["error"] = f"{type(e).__name__}: {e}"
            row["traceback"] = traceback.format_exc()[-2000:]
        row["case_s"] = round(time.time() - t0, 2)
        if row.get("error") or not all(v.get("correct", {}).get("ok") for v in row.get("opfuse", {}).values()):
            out["ok"] = False
        save()
    return out


def _case(context: dict, c: dict, row: dict) -> None:
    import gpu_check_graph as gg

    dtype, dry = context["dtype"], context.get("dry_run")
    args, values = gg.make_inputs(c["inputs"], context.get("seed", 0))
    want = reference(values, c["causal"])
    compare = context["compare"]
    row["opfuse"] = {}
    outs = {}
    for variant, bname in c["bundles"].items():
        bundle = context["bundles"][bname]
        emitters = sorted({k.emitter for k in bundle.kernels.values()})
        label = next((e for e in emitters if e.startswith("attention")), variant)
        prog = context["program"](bname)
        r = row["opfuse"][label] = {"bundle": bname, "emitters": emitters,
                                    "kernels_n": len(bundle.kernels)}
        (got,) = gg._run_checked(prog, args)
        outs[label] = got
        r["correct"] = compare([got], [want]) | {"against": "float64 reference"}
    dev, why = (None, "dry run: no device") if dry else torch_device()
    sdpa: dict = {}
    if dev is None:
        sdpa["not_available"] = why
    else:
        q, k, v = (dev.tensor(x, dtype) for x in values)
        run = lambda: dev.sdpa(q, k, v, c["causal"])  # noqa: E731
        got = dev.values(run())
        sdpa["correct"] = compare([got], [want]) | {"against": "float64 reference"}
        for label, o in outs.items():
            row["opfuse"][label]["vs_sdpa"] = compare([o], [got])
    row["sdpa"] = sdpa
    if dry:
        row["times"] = {"not_available": "dry run: no device timers"}
        return
    from opfuse.runtime import cuda_timing

    flops = row["flops"]
    for label, r in row["opfuse"].items():
        prog = context["program"](r["bundle"])
        drv = prog._impl.drv
        flush = cuda_timing.L2Flush(drv)
        bound = prog._impl.bind(*args)
        hot = cuda_timing.hot(drv, bound.launch_only)
        cold = cuda_timing.cold(drv, bound.launch_only, flush)
        r.update(_times(hot, cold, flops))
        r["kernels"] = gg.per_kernel(context["bundles"][r["bundle"]], bound, flush,
                                     context.get("peaks") or {}, dtype)
        att = [k for k in r["kernels"] if k["emitter"].startswith("attention")]
        if att and att[0].get("h200_estimate_us"):
            r["h200_estimate_us"] = att[0]["h200_estimate_us"]
            r["fraction_of_estimate"] = round(att[0]["h200_estimate_us"] / att[0]["hot_us"], 3)
        del bound, flush
    if dev is not None:
        flush = cuda_timing.L2Flush(dev)
        sdpa.update(_times(cuda_timing.hot(dev, run), cuda_timing.cold(dev, run, flush), flops))
        del flush
        for r in row["opfuse"].values():
            r["opfuse_over_sdpa"] = round(r["hot_us"] / sdpa["hot_us"], 3)
            r["opfuse_over_sdpa_cold"] = round(r["cold_us"] / sdpa["cold_us"], 3)


def _times(hot: dict, cold: dict, flops: float) -> dict:
    t = hot["median_s"]
    return {"hot_us": round(t * 1e6, 3), "cold_us": round(cold["median_s"] * 1e6, 3),
            "TFLOPs": round(flops / t / 1e12, 3),
            "TFLOPs_cold": round(flops / cold["median_s"] / 1e12, 3),
            "launch_bound": hot["launch_bound"], "launches_per_window": hot["launches_per_window"]}


def failures(section: dict) -> list[str]:
    """What failed in a section entry, by case (empty: nothing)."""
    bad = [f"{c['name']}: {c['error']}" for c in section.get("cases", []) if c.get("error")]
    for c in section.get("cases", []):
        for label, r in c.get("opfuse", {}).items():
            if not r.get("correct", {}).get("ok", True):
                bad.append(f"{c['name']} {label}: results differ from the float64 reference "
                           f"(max err {r['correct'].get('max_abs_err', float('nan')):.3g})")
    bad += [f"not run: {n}" for n in section.get("not_run", [])]
    return bad


def summary(section: dict) -> str:
    """One line per case for gpu-check's printed summary."""
    rows = []
    for c in section.get("cases", []):
        if c.get("error"):
            rows.append(f"{c['name']} ERROR")
            continue
        parts = []
        for label, r in c.get("opfuse", {}).items():
            fig = f"{r['hot_us']:.1f}us {r['TFLOPs']:.1f}TF/s" if "hot_us" in r else "ok" if r["correct"]["ok"] else "WRONG"
            parts.append(f"{label} {fig}")
        s = c.get("sdpa", {})
        if "hot_us" in s:
            parts.append(f"sdpa {s['hot_us']:.1f}us {s['TFLOPs']:.1f}TF/s")
        rows.append(f"{c['name']}: " + ", ".join(parts))
    return "; ".join(rows)


__all__ = ["CASES", "TorchCuda", "failures", "install_torch", "prepare_entry", "run_graph", "summary"]
