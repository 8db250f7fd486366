"""``python -m bench --zoo``: the model zoo (``bench.zoo_models``) through
``torch.compile(backend="opfuse")`` on the CPU, next to eager and Inductor.

For each model, called the normal way (token ids and ``attention_mask``; pixels; audio
features) under ``torch.no_grad()``:

* **kernels unfused -> fused**: summed over the compiled partitions of every graph Dynamo
  hands opfuse, plus one per op left eager (PyTorch runs each as at least one kernel);
* **Inductor kernels**: kernel call sites in Inductor's output code for the same model
  (``bench.peers.kernels.count_inductor``: generated + library + fallback calls);
* **ops left eager**: each ATen op opfuse did not compile, with how many times;
* **max error**: max |opfuse - eager| over every output tensor, relative to max |eager|;
* **opfuse vs eager time**: the two called alternately (A B A B ...), median of each, on
  this machine's CPU with the thread count of ``--threads``.

Writes ``zoo.json`` and ``zoo.md`` (the table) into ``--out``.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from .zoo_models import ZOO, ZooModel


def flat_tensors(out: Any) -> list[Any]:
    """Every tensor of a model output (a tensor, tuple, dict or Hugging Face ModelOutput)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat_tensors(o)]
    if hasattr(out, "key_cache") or hasattr(out, "layers"):  # a Cache object
        return [t for layer in getattr(out, "layers", []) for t in
                flat_tensors([getattr(layer, "keys", None), getattr(layer, "values", None)])]
    return []


def max_error(got: Any, want: Any) -> float:
    """max |got - want| / max(1, max |want|) over every output tensor (f32)."""
    g, w = flat_tensors(got), flat_tensors(want)
    if len(g) != len(w) or not w:
        raise AssertionError(f"{len(g)} output tensors, eager has {len(w)}")
    worst = 0.0
    for a, b in zip(g, w):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise AssertionError(f"output {tuple(a.shape)} {a.dtype} vs eager {tuple(b.shape)} {b.dtype}")
        if b.numel() == 0:
            continue
        scale = max(1.0, b.double().abs().max().item())
        worst = max(worst, (a.double() - b.double()).abs().max().item() / scale)
    return worst


def compile_with_opfuse(entry: ZooModel) -> dict[str, Any]:
    """The model through ``torch.compile(backend="opfuse")``: its programs, output, warnings."""
    import torch

    from opfuse import torch_backend

    programs: list[Any] = []
    real = torch_backend.PartitionedProgram

    class Recorded(real):  # keeps every graph's partitioned program for its report
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            programs.append(self)

    model, inputs = entry.build(), entry.inputs()
    torch._dynamo.reset()
    torch_backend.PartitionedProgram = Recorded
    try:
        fast = torch.compile(model, backend="opfuse", options={"backend": "cpu"})
        with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = fast(**inputs)
            want = model(**inputs)
    finally:
        torch_backend.PartitionedProgram = real
    eager = Counter(e.op for p in programs for e in p.eager)
    return {
        "model": model,
        "fast": fast,
        "inputs": inputs,
        "programs": programs,
        "got": got,
        "want": want,
        "eager": dict(eager),
        "graphs": len(programs),
        "partitions": sum(len(p.partitions) for p in programs),
        "unfused": sum(p.report["totals"]["before"]["kernels"] for p in programs) + sum(eager.values()),
        "fused": sum(p.report["totals"]["after"]["kernels"] for p in programs) + sum(eager.values()),
        "warnings": [str(w.message) for w in seen if "opfuse" in str(w.message)],
    }


def inductor_kernels(entry: ZooModel) -> dict[str, Any]:
    """Inductor's kernel call sites for the same model and inputs."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from .peers.kernels import count_inductor

    model, inputs = entry.build(), entry.inputs()
    torch._dynamo.reset()
    fast = torch.compile(model, backend="inductor")
    with torch.no_grad():
        _, codes = run_and_get_code(lambda: fast(**inputs))
    return count_inductor(codes)


def interleaved_ms(a: Any, b: Any, budget_s: float) -> tuple[float, float]:
    """Median ms of ``a()`` and ``b()`` called alternately for about ``budget_s``."""
    ta, tb = [], []
    end = time.perf_counter() + budget_s
    while time.perf_counter() < end or len(ta) < 3:
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ta), statistics.median(tb)


def run(names: list[str] | None, out: Path, budget_s: float) -> list[dict[str, Any]]:
    import torch

    rows = []
    for entry in ZOO:
        if names and entry.name not in names:
            continue
        t0 = time.perf_counter()
        r = compile_with_opfuse(entry)
        compile_s = time.perf_counter() - t0
        err = max_error(r["got"], r["want"])
        with torch.no_grad():
            opfuse_ms, eager_ms = interleaved_ms(
                lambda: r["fast"](**r["inputs"]), lambda: r["model"](**r["inputs"]), budget_s)
        ind = inductor_kernels(entry)
        row = {
            "model": entry.name,
            "family": entry.family,
            "graphs": r["graphs"],
            "partitions": r["partitions"],
            "kernels_unfused": r["unfused"],
            "kernels_fused": r["fused"],
            "inductor_kernels": ind["count"],
            "inductor_detail": {k: ind[k] for k in ("generated", "extern", "fallback")},
            "eager_ops": r["eager"],
            "max_error": err,
            "opfuse_ms": opfuse_ms,
            "eager_ms": eager_ms,
            "opfuse_vs_eager": eager_ms / opfuse_ms,
            "compile_s": compile_s,
        }
        rows.append(row)
        print(f"{entry.name:22s} kernels {row['kernels_unfused']:4d} -> {row['kernels_fused']:3d} "
              f"(Inductor {row['inductor_kernels']:3d}) eager {r['eager'] or '-'} "
              f"err {err:.1e} opfuse {opfuse_ms:.2f} ms eager {eager_ms:.2f} ms", flush=True)
    from opfuse.backends.cpu.threads import resolve_threads

    out.mkdir(parents=True, exist_ok=True)
    (out / "zoo.json").write_text(json.dumps(
        {"schema": "opfuse-zoo/1", "torch": torch.__version__, "transformers": _tf_version(),
         "threads": torch.get_num_threads(), "opfuse_threads": resolve_threads(),
         "budget_s": budget_s, "rows": rows}, indent=1) + "\n")
    (out / "zoo.md").write_text(table(rows))
    return rows


def _tf_version() -> str:
    import transformers

    return transformers.__version__


def table(rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks.md's table."""
    lines = [
        "| model | kernels unfused → fused | Inductor kernels | ops left eager | max error | "
        "opfuse vs eager time (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        eager = ", ".join(f"{op.removeprefix('aten.')} ×{n}" for op, n in r["eager_ops"].items()) or "none"
        lines.append(
            f"| {r['model']} | {r['kernels_unfused']} → {r['kernels_fused']} | "
            f"{r['inductor_kernels']} | {eager} | {r['max_error']:.1e} | "
            f"{r['opfuse_vs_eager']:.2f}× ({r['opfuse_ms']:.2f} vs {r['eager_ms']:.2f} ms) |"
        )
    return "\n".join(lines) + "\n"


def main(names: list[str] | None, out: Path, budget_s: float) -> int:
    run(names, out, budget_s)
    print(f"wrote {out / 'zoo.json'} and {out / 'zoo.md'}")
    return 0
