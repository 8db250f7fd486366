"""gpu-check's PyTorch section: the same graphs in eager PyTorch and torch.compile on the
device, and the device's measured matmul peak (cuBLAS through torch) that per-kernel
TFLOP/s are compared with.

Torch is on the GPU image, not in the project's run requirements: every function here
returns ``{"not_available": why}`` figures when torch (or its CUDA device, or Inductor)
is not there, never an exception. The graphs are bench/peers/models.py's torch versions,
checked against the same CPU reference as opfuse's kernels. Times: CUDA events around
many calls after a warm-up (a call is one Python-level forward: for eager that includes
the dispatch of every op, which is what an eager user pays).
"""

from __future__ import annotations

import time

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
#: torch.compile of a graph starts only with this much of the torch task's time left
#: (Inductor's first compile of a graph takes seconds to tens of seconds).
COMPILE_S = 30


def _torch():
    try:
        import torch
    except ImportError as e:
        return None, f"torch is not installed ({e})"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device here"
    return torch, None


def _time(torch, fn, deadline: float, *, warmup_s: float = 0.05, window_s: float = 0.02) -> dict:
    """Median seconds per call of ``fn`` (CUDA events around a window of calls)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < warmup_s:
        fn()
        n += 1
    torch.cuda.synchronize()
    per = max((time.perf_counter() - t0) / max(n, 1), 1e-6)
    calls = max(1, min(2000, int(window_s / per)))
    samples = []
    for _ in range(5):
        if time.time() > deadline:
            break
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / calls)
    if not samples:
        return {"not_available": "out of time"}
    samples.sort()
    return {"median_s": samples[len(samples) // 2], "min_s": samples[0], "calls": calls,
            "windows": len(samples)}


def peak_flops(deadline: float) -> dict:
    """Measured matmul FLOP/s per type (8192³ bf16/f16, 4096³ f32 IEEE and TF32): the
    device's practical peak, what per-kernel TFLOP/s are a fraction of."""
    torch, why = _torch()
    if torch is None:
        return {"flops_peaks": {"not_available": why}}
    out: dict = {}
    sizes = {"bf16": 8192, "f16": 8192, "f32": 4096, "tf32": 4096}
    for kind, n in sizes.items():
        if time.time() > deadline - 2:
            out[f"{kind}_flops"] = {"not_available": "out of time"}
            continue
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(kind, torch.float32)
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
        try:
            t = _time(torch, lambda: torch.matmul(a, b), deadline, warmup_s=0.1, window_s=0.05)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        out[f"{kind}_flops"] = 2.0 * n**3 / t["median_s"] if "median_s" in t else t
        del a, b
    return out


def run_graph(graph: str, dtype: str, values, reference, fused_s, deadline: float, compare,
              *, compile_: bool = False) -> dict:
    """Eager (or, with ``compile_``, torch.compile) time of ``graph`` on ``values`` (float64
    inputs), its correctness against ``reference`` (None: not at this size) and its ratio
    to opfuse's fused program time ``fused_s``: ``{"eager": ...}`` or ``{"compile": ...}``."""
    torch, why = _torch()
    if torch is None:
        return {"compile" if compile_ else "eager": {"not_available": why}}
    from bench.peers import models, torch_ops

    model = models.MODELS[graph]
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    inputs = [torch.tensor(v, dtype=torch.float32).to(device="cuda", dtype=tdtype) for v in values]
    with torch.no_grad():
        eager = lambda: model(torch_ops, *inputs)  # noqa: E731
        if not compile_:
            return {"eager": _measure(torch, eager, reference, fused_s, deadline, compare),
                    "version": torch.__version__}
        try:
            t0 = time.perf_counter()
            compiled = torch.compile(eager)
            compiled()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            row = _measure(torch, compiled, reference, fused_s, deadline, compare)
            row["compile_s"] = compile_s
        except Exception as e:  # noqa: BLE001  (Inductor may not work on the image)
            row = {"not_available": f"torch.compile failed: {type(e).__name__}: {e}"[:500]}
    return {"compile": row}


def _measure(torch, fn, reference, fused_s, deadline, compare) -> dict:
    row = _time(torch, fn, deadline)
    if reference is not None:
        got = fn()
        got = [got] if not isinstance(got, (list, tuple)) else list(got)
        row["correct"] = compare([g.float().cpu().numpy() for g in got], reference)
    if fused_s and "median_s" in row:
        row["opfuse_speedup"] = row["median_s"] / fused_s
    return row


__all__ = ["peak_flops", "run_graph"]
