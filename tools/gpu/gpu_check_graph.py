"""gpu-check, there: one graph's checks and measurements (``check_graph``), the device's
figures (``device_info``), the torch task (``torch_section``); see tools/gpu/gpu_check.py."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import subprocess
import time
from pathlib import Path

#: Sections other modules add per graph: ``tools/gpu_check_<name>.py`` with
#: ``prepare_entry(folder, entry, targets=, scale=, graph=) -> dict | None`` (here: what the
#: section needs in the plan entry, under ``entry[name]``; its bundles join the entry's),
#: ``run_graph(context) -> dict`` (there, for entries that have ``entry[name]``: its entry
#: in the graph's JSON; context: graph, dtype, key, entry, seed, bundles, program(name) ->
#: program, args, values, deadline, dry_run, peaks, compare(got, want), out (the dict to
#: fill) and save() (after each step)) and ``failures(section) -> list[str]`` (what makes
#: the graph fail).
SECTIONS = ("attention",)
#: Tolerances against the CPU reference: f32 rtol/atol (approximate exp/tanh, FMAs, another
#: summation order); f16/bf16 relative to max(1, max |reference|), as the emulator tests.
F32_RTOL, F32_ATOL = 1e-3, 1e-4
HALF_TOL = {"f16": 1e-2, "bf16": 3e-2}


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

    def run_sections() -> None:
        """Other engineers' sections (gpu_check_<name>.py) for this entry, when present."""
        for name in SECTIONS:
            mod = section(name)
            if mod is None or not e.get(name):
                continue
            with phase(entry, name, deadline, 5, save) as go:
                if go:
                    entry[name] = {}
                    context = {"graph": e["graph"], "dtype": dtype, "key": key, "entry": e,
                               "seed": spec["seed"], "bundles": bundles, "program": program,
                               "args": args, "values": values, "deadline": deadline,
                               "dry_run": dry_run, "peaks": peaks, "out": entry[name], "save": save,
                               "compare": lambda a, b: compare(a, b, dtype)}
                    entry[name] = mod.run_graph(context)

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
        run_sections()
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
    run_sections()

def section(name: str):
    """The module of section ``name`` (tools/gpu_check_<name>.py), or None."""
    if importlib.util.find_spec(f"gpu_check_{name}") is None:
        return None
    return importlib.import_module(f"gpu_check_{name}")


def section_failures(entry: dict) -> list[str]:
    """What failed in a graph entry's sections (``<section>: <what>``)."""
    out = []
    for name in SECTIONS:
        if isinstance(entry.get(name), dict) and (mod := section(name)) is not None:
            out += [f"{name}: {f}" for f in mod.failures(entry[name])]
    return out


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
    bytes and FLOPs and the device's measured peaks; matmul and attention kernels also
    their H200 estimate (cost/gpu_time.py)."""
    from opfuse.cost import gpu_time as estimate
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
        estimated = estimate.for_emitter(spec.emitter)
        if estimated is not None:
            res = spec.resources.get("sm_90", {})
            est = estimated(
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


