"""gpu-check: the prepared GPU check of opfuse, for a lent GPU machine (an H200).

Two steps, because the GPU machine has no MLIR and no network:

  here (with the compiler):   tools/gpu-check prepare .gpu-check
      builds AOT bundles (PTX and cubins for sm_90, the CPU library) of the G graphs at
      benchmark size: G1-G8 in f32, the matmul graphs (G1, G5, G6, G7) in bf16; per graph
      the fused program, the unfused one, and the other matmul variant (bf16: SIMT,
      ``matmul=simt``; f32: TF32 tensor cores, ``allow_tf32``); G6 and G7
      also at 1/8 size for the CPU reference. inputs.json says how to make every input.
      PyCUDA's sdist goes into .gpu-check/wheels (``--no-pycuda`` skips it).

  there (carry .gpu-check):   tools/gpu-check run .gpu-check
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
          estimate (codegen/estimate.py) for matmul kernels;
        * the other matmul variant: same results, per-kernel times side by side (SIMT vs
          MMA);
        * at the end, in one process, the same graphs in eager PyTorch and torch.compile
          on the device (torch is on the image): times, correctness, ratio to opfuse.
      The exit status is 0 only if every graph ran every phase and was correct; a graph
      skipped (out of time) or failed is named in the JSON (``skipped``, ``failed``).
      PyCUDA is built from the carried sdist in the background while the checks run on
      cuda-python, then G1-G3 run through it. Budget: under 6 minutes, start-up included.

Only the standard library and numpy are needed to run (the repository's python/, tools/
and bench/ are put on sys.path; nothing is installed).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT / "python", ROOT / "tools", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

SCRIPT = ROOT / "tools" / "gpu-check"
BUDGET_S = 330  # stay under 6 minutes, start-up included
GRAPH_MIN_S = 12  # a graph is not started with less left than this
RESERVE_S = 25  # kept for the PyCUDA check and the last write
PYCUDA_CHECK_S = 60
PYCUDA_GRAPHS = ("g1_mlp.f32", "g2_elementwise_chain.f32", "g3_softmax.f32")
PYCUDA_SITE = Path("/tmp/opfuse-site")
PYCUDA_SCRATCH = Path("/tmp/opfuse-pycuda")
PYCUDA_LOG = "/tmp/opfuse-pycuda-build.log"
SEED = 0
ALL_GRAPHS = (
    "g1_mlp",
    "g2_elementwise_chain",
    "g3_softmax",
    "g4_layernorm",
    "g5_attention",
    "g6_encoder_layer",
    "g7_rmsnorm_swiglu",
    "g8_x_minus_mean",
)
MATMUL_GRAPHS = ("g1_mlp", "g5_attention", "g6_encoder_layer", "g7_rmsnorm_swiglu")
SMALL_REFERENCE = ("g6_encoder_layer", "g7_rmsnorm_swiglu")  # slow on the CPU at full size
BANDWIDTH = ("g2_elementwise_chain", "g3_softmax", "g4_layernorm", "g8_x_minus_mean")
#: Sections other modules add per graph: ``tools/gpu_check_<name>.py`` with
#: ``run_graph(context) -> dict`` (its entry in the graph's JSON), run when the module
#: exists (context: graph, dtype, key, bundles, program(name) -> cuda program, args,
#: values, deadline, compare(got, want)).
SECTIONS = ("attention",)
#: Tolerances against the CPU reference: f32 rtol/atol (approximate exp/tanh, FMAs, another
#: summation order); f16/bf16 relative to max(1, max |reference|), as the emulator tests.
F32_RTOL, F32_ATOL = 1e-3, 1e-4
HALF_TOL = {"f16": 1e-2, "bf16": 3e-2}


# ----- the plan -----------------------------------------------------------------------------
def default_plan() -> list[dict]:
    """What to run, in order: the tensor-core graphs first (what matters most), then f32."""
    out = []
    # f16 is left out: its bundles get no CPU library (the CPU lowering leaves an
    # arith.fastmath attribute on llvm.fpext that mlir-translate rejects), so there would be
    # no reference to check the GPU against
    for dtype, names in (("bf16", MATMUL_GRAPHS), ("f32", ALL_GRAPHS)):
        for name in names:
            variants: dict = {}
            if name in MATMUL_GRAPHS:
                variants = {"tf32": {"allow_tf32": True}} if dtype == "f32" else {"simt": {"matmul": "simt"}}
            out.append({"key": f"{name}.{dtype}", "graph": name, "dtype": dtype, "variants": variants})
    return out


# ----- prepare (here) -----------------------------------------------------------------------
def prepare(
    folder: Path,
    targets: list[str],
    *,
    graphs: set[str] | None = None,
    dtypes: set[str] | None = None,
    scale: int = 1,
    fetch_pycuda: bool = True,
) -> int:
    import opfuse
    from opfuse.frontends.graphs import graphs as make_graphs

    folder.mkdir(parents=True, exist_ok=True)
    entries = [
        e
        for e in default_plan()
        if (graphs is None or e["graph"] in graphs) and (dtypes is None or e["dtype"] in dtypes)
    ]
    spec: dict = {"seed": SEED, "scale": scale, "targets": targets, "entries": []}
    for e in entries:
        t0 = time.time()
        key, name, dtype = e["key"], e["graph"], e["dtype"]
        g = make_graphs(scale=scale, dtype=dtype)[name]
        fused = opfuse.compile(g, backend="cpu")
        unfused = opfuse.compile(g, backend="cpu", fusion=False)
        files = {"fused": f"{key}.fused.opfuse", "unfused": f"{key}.unfused.opfuse"}
        fused.save_bundle(folder / files["fused"], targets=targets)
        unfused.save_bundle(folder / files["unfused"], targets=targets)
        for variant, options in e["variants"].items():
            files[variant] = f"{key}.{variant}.opfuse"
            fused.save_bundle(folder / files[variant], targets=targets, **options)
        entry = {**e, "inputs": _describe(g), "bundles": files, "reference": "full"}
        if name in SMALL_REFERENCE:
            small = make_graphs(scale=scale * 8, dtype=dtype)[name]
            files["small"] = f"{key}.small.opfuse"
            opfuse.compile(small, backend="cpu").save_bundle(folder / files["small"], targets=targets)
            entry.update(reference="1/8 size", small_inputs=_describe(small))
        _require_cpu_library(folder / files.get("small", files["fused"]), key)
        spec["entries"].append(entry)
        print(f"prepared {key} in {time.time() - t0:.1f}s", flush=True)
    _write_json(folder / "inputs.json", spec)
    if fetch_pycuda:
        import pycuda_build

        print(pycuda_build.fetch(folder / "wheels"))
    total = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"{folder}: {total / 2**20:.1f} MiB")
    return 0


def _require_cpu_library(path: Path, key: str) -> None:
    """The run checks the GPU against the bundle's CPU library: a bundle without one is
    an error here, not a failed graph there."""
    from opfuse.errors import OpfuseError
    from opfuse.runtime import bundle as rb

    manifest = rb.load(path).manifest
    if not manifest.get("cpu"):
        raise OpfuseError(f"gpu-check prepare: {key}: {path.name} has no CPU library "
                          f"({manifest.get('cpu_missing', 'unknown reason')})")


def _describe(g) -> list[dict]:
    return [
        {
            "name": t.name,
            "shape": list(t.shape),
            "dtype": t.dtype,
            "scale": (1.0 / t.shape[0] ** 0.5) if (t.name.startswith("w") and len(t.shape) == 2) else 1.0,
        }
        for t in g.inputs
    ]


def make_inputs(entries: list[dict], seed: int):
    """Device-format arrays (bf16 as its bits) and their float64 values (for torch)."""
    import numpy as np

    from opfuse.runtime.schedule import float32_to_bf16_bits

    rng = np.random.default_rng(seed)
    device, values = [], []
    for e in entries:
        x = rng.uniform(-1.0, 1.0, e["shape"]) * e["scale"]
        if e["dtype"] == "bf16":
            bits = float32_to_bf16_bits(x.astype(np.float32))
            device.append(bits)
        else:
            device.append(x.astype({"f32": np.float32, "f16": np.float16}[e["dtype"]]))
        values.append(_as_float(device[-1]))
    return device, values


def _as_float(a):
    import numpy as np

    from opfuse.runtime.schedule import bf16_bits_to_float32

    a = np.asarray(a)
    return (bf16_bits_to_float32(a) if a.dtype == np.uint16 else a).astype(np.float64)


def compare(got, want, dtype: str) -> dict:
    import numpy as np

    worst, ok = 0.0, len(got) == len(want)
    for g, w in zip(got, want):
        g64, w64 = _as_float(g), _as_float(w)
        err = np.abs(g64 - w64)
        worst = max(worst, float(err.max()) if err.size else 0.0)
        if dtype in HALF_TOL:
            scale = max(1.0, float(np.abs(w64).max()) if w64.size else 1.0)
            good = bool(np.all(err <= HALF_TOL[dtype] * scale))
        else:
            good = bool(np.all(err <= F32_ATOL + F32_RTOL * np.abs(w64)))
        ok = ok and good and not np.isnan(g64).any()
    return {"ok": ok, "max_abs_err": worst}


# ----- run (there) --------------------------------------------------------------------------
class Clock:
    def __init__(self, budget: float):
        self.start = time.time()
        self.budget = budget

    def left(self) -> float:
        return self.budget - (time.time() - self.start)


def _write_json(path: Path, data: dict) -> None:
    """Atomically (a temporary file, then a rename): a kill never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


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
    return bool(entry.get("error") or entry.get("not_run") or not entry.get("correct", {}).get("ok"))


def _finish(result: dict, write, clock: Clock) -> int:
    result["elapsed_s"] = round(time.time() - clock.start, 1)
    bad = result["failed"] or result["skipped"] or not result["graphs"] or result["errors"]
    result["exit_status"] = 1 if bad else 0
    write()
    for key in result["failed"]:
        print(f"FAILED {key}: {result['graphs'][key].get('error') or result['graphs'][key].get('not_run') or 'results differ'}")
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

    cuda_driver.install(getattr(mod, factory)(folder, key, *([":".join(arg)] if arg else [])))


@contextlib.contextmanager
def phase(entry: dict, name: str, deadline: float, need_s: float, save):
    """Run a phase if ``need_s`` seconds are left before the deadline, else record it as
    not run; time it; save the entry afterwards."""
    left = deadline - time.time()
    if left < need_s:
        entry.setdefault("not_run", []).append(f"{name} (out of time: {left:.0f} s left)")
        yield False
        return
    t0 = time.time()
    try:
        yield True
    finally:
        entry.setdefault("phase_s", {})[name] = round(time.time() - t0, 2)
        save()


def device_info(entry: dict, deadline: float, dry_run: bool) -> None:
    if dry_run:
        entry["binding"] = "dry run"
        return
    from opfuse.runtime import cuda

    drv = cuda.driver()
    entry["binding"] = drv.name
    entry["chip"] = cuda.device_chip()
    for attr in ("MULTIPROCESSOR_COUNT", "L2_CACHE_SIZE", "CLOCK_RATE", "MEMORY_CLOCK_RATE"):
        try:
            entry[attr.lower()] = drv.attribute(attr)
        except Exception as e:  # noqa: BLE001
            entry[attr.lower()] = {"not_available": str(e)}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        entry["nvidia_smi"] = smi.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    stub = drv.name == "stub"
    peaks = {"copy_Bps": cuda.copy_bandwidth(1 << 20 if stub else 1 << 30)}
    if stub:
        peaks["flops_peaks"] = {"not_available": "a stub driver: no device for torch"}
    else:
        import gpu_check_torch

        peaks.update(gpu_check_torch.peak_flops(deadline - 5))
    entry["peaks"] = peaks


def check_graph(folder, spec, e, entry, deadline, save, *, dry_run, peaks) -> None:
    from opfuse.runtime import bundle as rb

    key, dtype = e["key"], e["dtype"]
    entry.update(graph=e["graph"], dtype=dtype, reference=e["reference"])
    args, values = make_inputs(e["inputs"], spec["seed"])
    bundles = {n: rb.load(folder / f) for n, f in e["bundles"].items()}
    backend = "cpu" if dry_run else "cuda"
    programs: dict = {}

    def program(name):
        if name not in programs:
            programs[name] = bundles[name].program(backend)
        return programs[name]

    fused = program("fused")
    entry["kernels"] = {"fused": len(bundles["fused"].kernels), "unfused": len(bundles["unfused"].kernels)}
    entry["code"] = dict(getattr(fused._impl, "code", {}))
    with phase(entry, "correctness", deadline, 5, save) as go:
        if go:
            out_f = _run_checked(fused, args)
            out_u = _run_checked(program("unfused"), args)
            entry["fused_vs_unfused"] = compare(out_f, out_u, dtype)
            if e["reference"] == "full":
                ref = _outputs(bundles["fused"].program("cpu")(*args))
                entry["correct"] = compare(out_f, ref, dtype) | {"against": "CPU library, full size"}
            else:
                sargs, _ = make_inputs(e["small_inputs"], spec["seed"])
                small = bundles["small"]
                got = _run_checked(program("small"), sargs)
                entry["correct"] = compare(got, _outputs(small.program("cpu")(*sargs)), dtype) | {
                    "against": "CPU library, 1/8 size"}
            entry["correct"]["ok"] = entry["correct"]["ok"] and entry["fused_vs_unfused"]["ok"]
    if dry_run:
        entry["times"] = {"not_available": "dry run: no device timers"}
        return
    from opfuse.runtime import cuda_timing

    drv = fused._impl.drv
    flush = cuda_timing.L2Flush(drv)
    bound_f = fused._impl.bind(*args)
    with phase(entry, "program_times", deadline, 5, save) as go:
        if go:
            bound_u = program("unfused")._impl.bind(*args)
            entry["program"] = {
                "fused_hot": cuda_timing.hot(drv, bound_f.launch_only),
                "fused_cold": cuda_timing.cold(drv, bound_f.launch_only, flush),
                "unfused_hot": cuda_timing.hot(drv, bound_u.launch_only),
            }
            p = entry["program"]
            p["speedup_hot"] = p["unfused_hot"]["median_s"] / p["fused_hot"]["median_s"]
            del bound_u
    with phase(entry, "kernel_times", deadline, 3 + len(bound_f.kernels()), save) as go:
        if go:
            entry["fused_kernels"] = per_kernel(bundles["fused"], bound_f, flush, peaks, dtype)
    for variant in e["variants"]:
        with phase(entry, f"variant {variant}", deadline, 5, save) as go:
            if go:
                prog = program(variant)
                same = compare(_run_checked(prog, args), _run_checked(fused, args), dtype)
                rows = per_kernel(bundles[variant], prog._impl.bind(*args), flush, peaks, dtype)
                entry.setdefault("variants", {})[variant] = {"same_results": same, "kernels": rows}
                entry["variants"][variant]["side_by_side"] = _side_by_side(entry.get("fused_kernels"), rows)
    for name in SECTIONS:  # other engineers' sections (gpu_check_<name>.py), when present
        if importlib.util.find_spec(f"gpu_check_{name}") is None:
            continue
        with phase(entry, name, deadline, 5, save) as go:
            if go:
                mod = importlib.import_module(f"gpu_check_{name}")
                context = {"graph": e["graph"], "dtype": dtype, "key": key, "bundles": bundles,
                           "program": program, "args": args, "values": values,
                           "deadline": deadline, "compare": lambda a, b: compare(a, b, dtype)}
                entry[name] = mod.run_graph(context)


def torch_section(folder, spec, entry, deadline, save, context) -> None:
    """Every graph that ran, in eager PyTorch (all first), then torch.compile while time
    is left (gpu_check_torch.py)."""
    import gpu_check_torch
    from opfuse.runtime import bundle as rb

    entries = [e for e in spec["entries"] if e["key"] in set(context.get("only", []))]
    graphs = entry.setdefault("graphs", {})
    for compile_ in (False, True):
        for e in entries:
            if time.time() > deadline - (gpu_check_torch.COMPILE_S if compile_ else 3):
                graphs.setdefault(e["key"], {}).setdefault(
                    "compile" if compile_ else "eager", {"not_available": "out of time"})
                continue
            args, values = make_inputs(e["inputs"], spec["seed"])
            ref = None
            if e["reference"] == "full":
                ref = _outputs(rb.load(folder / e["bundles"]["fused"]).program("cpu")(*args))
            dtype = e["dtype"]
            graphs.setdefault(e["key"], {}).update(gpu_check_torch.run_graph(
                e["graph"], dtype, values, ref, context.get("fused_s", {}).get(e["key"]),
                deadline - 3, lambda got, want, d=dtype: compare(got, want, d), compile_=compile_))
            save()


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run_checked(program, args):
    """Outputs of one run: on the GPU with a synchronize and a check after every kernel
    (a fault names its kernel); the CPU library (dry run) just runs."""
    impl = program._impl
    if hasattr(impl, "kernels") and hasattr(impl, "bind"):
        return impl.bind(*args).run_checked()
    return _outputs(program(*args))


def per_kernel(bundle, bound, flush, peaks: dict, dtype: str) -> list[dict]:
    """Each kernel of ``bound``: hot and cold time and what they mean against the report's
    bytes and FLOPs and the device's measured peaks; matmul kernels also their H200
    estimate (codegen/estimate.py)."""
    from opfuse.codegen import estimate
    from opfuse.runtime import cuda_timing

    drv = bound.drv
    report = {k["name"]: k for k in (bundle.manifest.get("report") or {}).get("kernels", [])}
    rows = []
    for name, launch in bound.kernels():
        spec = bundle.kernels[name]
        hot = cuda_timing.hot(drv, launch)
        cold = cuda_timing.cold(drv, launch, flush)
        t = hot["median_s"]
        r = report.get(name, {})
        row = {"kernel": name, "emitter": spec.emitter, "hot_us": round(t * 1e6, 3),
               "cold_us": round(cold["median_s"] * 1e6, 3), "launch_bound": hot["launch_bound"],
               "launches_per_window": hot["launches_per_window"]}
        if spec.meta:
            row["meta"] = spec.meta
        if r.get("bytes"):
            row["GBps"] = round(r["bytes"] / t / 1e9, 1)
            if peaks.get("copy_Bps"):
                row["fraction_of_copy"] = round(r["bytes"] / t / peaks["copy_Bps"], 3)
        flops_peak = peaks.get(f"{spec.meta.get('mma') or dtype}_flops")  # tf32 kernels: TF32's
        if r.get("flops"):
            row["TFLOPs"] = round(r["flops"] / t / 1e12, 3)
            if flops_peak:
                row["fraction_of_peak_flops"] = round(r["flops"] / t / flops_peak, 3)
        if spec.emitter in ("mma", "matmul"):
            res = spec.resources.get("sm_90", {})
            est = estimate.matmul_kernel(
                estimate.H200, grid=spec.grid, block=spec.block, meta=spec.meta,
                flops=r.get("flops", 0), bytes_=r.get("bytes", 0),
                registers=res.get("registers"), smem=res.get("smem"))
            row["h200_estimate_us"] = est.get("estimate_s", 0) * 1e6  # an estimate
            row["roofline_us"] = est.get("roofline_s", 0) * 1e6
        rows.append(row)
    return rows


def _side_by_side(default_rows, variant_rows) -> list[dict]:
    by_name = {r["kernel"]: r for r in default_rows or []}
    out = []
    for r in variant_rows:
        d = by_name.get(r["kernel"])
        if d is None or d["emitter"] == r["emitter"]:
            continue
        out.append({"kernel": r["kernel"], d["emitter"] + "_us": d["hot_us"],
                    r["emitter"] + "_us": r["hot_us"], "ratio": round(r["hot_us"] / d["hot_us"], 3)})
    return out


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
    return f"{key:28s} correct={c.get('ok')} (max err {c.get('max_abs_err', float('nan')):.2e}){times}{missing}"


# ----- PyCUDA (built in the background) ---------------------------------------------------------
def start_pycuda_build(folder: Path, result: dict):
    """Start building PyCUDA from the carried sdist in the background (tools/pycuda_build.py,
    about a minute of one core) and run the main checks on the image's cuda-python binding
    meanwhile; None when PyCUDA imports already or no sdist was carried."""
    if importlib.util.find_spec("pycuda") is not None:
        result["pycuda"] = "already installed"
        return None
    wheels = folder / "wheels"
    if not sorted(wheels.glob("pycuda-*.tar.gz")):
        result["pycuda"] = "no sdist carried: the cuda-python binding runs every check"
        return None
    os.environ["OPFUSE_CUDA_BINDING"] = "cuda-python"
    log = open(PYCUDA_LOG, "w")  # noqa: SIM115  (the child writes it until it exits)
    cmd = [sys.executable, str(ROOT / "tools" / "pycuda_build.py"), "build", str(wheels)]
    proc = subprocess.Popen(cmd + [str(PYCUDA_SITE), str(PYCUDA_SCRATCH)], stdout=log,
                            stderr=subprocess.STDOUT)
    proc.started = time.time()  # type: ignore[attr-defined]
    result["pycuda"] = "built in the background; checked on a few graphs after the main run"
    return proc


def finish_pycuda(proc, folder: Path, clock: Clock) -> dict:
    """Wait for the PyCUDA build (as long as the budget allows), then run a few graphs
    through PyCUDA in a child run; what it saw, for the JSON."""
    out: dict = {}
    try:
        rc = proc.wait(timeout=max(1.0, clock.left() - PYCUDA_CHECK_S))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    out["build_s"] = round(time.time() - proc.started, 1)
    log = Path(PYCUDA_LOG).read_text(errors="replace") if Path(PYCUDA_LOG).exists() else ""
    if rc != 0:
        out["built"] = False
        out["why"] = "build still running: stopped" if rc is None else f"build exit {rc}"
        out["log_tail"] = log[-2000:]
        return out
    out["built"] = True
    budget = int(clock.left() - 10)
    if budget < 30:
        out["checked"] = "no time left for the PyCUDA run"
        return out
    env = dict(os.environ, OPFUSE_CUDA_BINDING="pycuda")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYCUDA_SITE), env.get("PYTHONPATH")) if p)
    sub_out = PYCUDA_SCRATCH / "out"
    cmd = [sys.executable, str(SCRIPT), "run", str(folder), "--no-pycuda", "--only",
           ",".join(PYCUDA_GRAPHS), "--out", str(sub_out), "--budget", str(budget)]
    try:
        sub = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget + 20)
        out["exit"] = sub.returncode
        out["output_tail"] = (sub.stdout + sub.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        out["exit"] = "timed out"
    report = sub_out / "gpu-check.json"
    if report.exists():
        data = json.loads(report.read_text())
        out["binding"] = data.get("binding")
        keep = ("correct", "fused_vs_unfused", "program", "error", "not_run")
        out["graphs"] = {n: {k: e[k] for k in keep if k in e} for n, e in data.get("graphs", {}).items()}
    return out


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
