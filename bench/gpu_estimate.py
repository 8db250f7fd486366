"""Per matmul and attention kernel: an analytic H200 time estimate next to the roofline
(no GPU needed).

For the matmul graphs (G1, G5, G6, G7) at full size, in f32 and bf16, every matmul and
attention kernel opfuse generates is described by what the compiler knows of it (launch
shape, tile, ``ptxas -v`` registers and shared memory for sm_90 when ptxas is installed,
the fusion report's FLOPs and bytes) and estimated with
:func:`opfuse.cost.gpu_time.matmul_kernel` or :func:`~opfuse.cost.gpu_time.attention_kernel`:
blocks per SM, occupancy, waves, compute and memory time, and the roofline of the problem
(FLOPs at the dense tensor peak for bf16, at the FFMA peak for f32; bytes at HBM
bandwidth). Every variant of each kernel is estimated: the default (bf16: tensor cores,
``mma.sync``; f32: SIMT) and the others (bf16: ``matmul=simt``, and ``matmul=wgmma``
compiled for sm_90a, the warpgroup MMA at the dense tensor peak; f32: TF32 tensor cores,
for matmuls only: attention has no TF32 kernel, nor a wgmma one), so the gap between them,
and to the roofline, shows without a GPU. Every figure is an **estimate**
(the model is in cost/gpu_time.py); tools/gpu/gpu-check measures the same kernels on a GPU.

Beside them, ``triton``: the same work as Triton kernels compiled for sm_90 and sm_80
without a GPU and estimated with the same model (bench/peers/triton_peer.py), or why not
(triton not installed; skipped by ``--quick`` / ``--no-peers``).
"""

from __future__ import annotations

from typing import Any

from opfuse.cost import gpu_time as estimate
from opfuse.backends.gpu.lower import ptxas as ptxas_mod
from opfuse.backends.gpu.compiler import compile_module
from opfuse.frontends.builder.graphs import graphs

GRAPHS = ("g1_mlp", "g5_attention", "g6_encoder_layer", "g7_rmsnorm_swiglu")
DTYPES = ("bf16", "f32")
CHIP = "sm_90"
#: The chip of the wgmma variant (sm_90's architecture-specific instructions).
WGMMA_CHIP = "sm_90a"
#: (variant name, compile_module options) per dtype: the default first
VARIANTS = {
    "bf16": (("mma", {}), ("simt", {"matmul": "simt"}), ("wgmma", {"matmul": "wgmma"})),
    "f16": (("mma", {}), ("simt", {"matmul": "simt"}), ("wgmma", {"matmul": "wgmma"})),
    "f32": (("simt", {}), ("tf32", {"allow_tf32": True})),
}


def chip_of(options: dict) -> str:
    """The chip a variant is compiled for."""
    return WGMMA_CHIP if options.get("matmul") == "wgmma" else CHIP


METHOD = (
    "estimate, not a measurement: the busiest SM's share of the device peak (mma.sync for "
    "tensor-core kernels, the dense tensor peak for wgmma ones, FFMA otherwise) for the FLOPs "
    "the kernel executes (tiles padded), "
    "against HBM bytes and L2 tile traffic; occupancy from ptxas registers and shared memory "
    "(cost/gpu_time.py); roofline: max(FLOPs / dense peak of the operand type, bytes / "
    "HBM bandwidth); attention kernels add their exponentials at the SFU rate and skip the "
    "key tiles a causal mask removes"
)


def run(names=GRAPHS, dtypes=DTYPES, scale: int = 1, log=print,
        triton: bool | str = True) -> dict[str, Any]:
    """The ``gpu_estimate`` section of bench.json (``triton``: False or the reason to skip
    the Triton peer, which compiles some 150 kernels: a few minutes)."""
    from opfuse import compile as opfuse_compile

    dev = estimate.device(CHIP)
    have_ptxas = ptxas_mod.find_ptxas() is not None
    rows = []
    for dtype in dtypes:
        gs = graphs(scale=scale, dtype=dtype)
        for name in names:
            exe = opfuse_compile(gs[name], backend="cpu")
            report = {k["name"]: k for k in exe.report.get("kernels", [])}
            default_emitters: dict[str, str] = {}
            for variant, options in VARIANTS[dtype]:
                chip = chip_of(options)
                program = compile_module(
                    exe._source, targets=(chip,), ptxas=have_ptxas, **options
                )
                for k in program.kernels.values():
                    estimated = estimate.for_emitter(k.emitter)
                    if estimated is None:
                        continue
                    if variant == VARIANTS[dtype][0][0]:
                        default_emitters[k.name] = k.emitter
                    elif default_emitters.get(k.name) == k.emitter:
                        continue  # another variant built the same kernel (f32, wgmma: attention)
                    res = k.resources.get(chip, {})
                    r = report.get(k.name, {})
                    est = estimated(
                        dev,
                        grid=k.grid,
                        block=k.block,
                        meta=k.meta,
                        flops=r.get("flops", 0),
                        bytes_=r.get("bytes", 0),
                        registers=res.get("registers"),
                        smem=res.get("smem"),
                    )
                    rows.append(
                        {
                            "graph": name,
                            "dtype": dtype,
                            "variant": variant,
                            "default": variant == VARIANTS[dtype][0][0],
                            "kernel": k.name,
                            "emitter": k.emitter,
                            "grid": list(k.grid),
                            "block": list(k.block),
                            "tile": k.meta.get("tile"),
                            "stages": k.meta.get("stages", 1),
                            "smem": res.get("smem", 0),
                            "spills": res.get("spill_stores", 0) + res.get("spill_loads", 0),
                            **{key: est[key] for key in _KEEP if key in est},
                        }
                    )
            log(f"  gpu estimate: {name} {dtype} ({len(rows)} kernel rows so far)")
    if triton is True:
        from .peers import triton_peer

        triton_section = triton_peer.section(names, dtypes, scale, dev, log)
    else:
        triton_section = {"not_available": str(triton or "skipped")}
    return {
        "device": dev.name,
        "chip": CHIP,
        "scale": scale,
        "method": METHOD,
        "registers_from": "ptxas" if have_ptxas else "assumed (no ptxas: 128 per thread)",
        "kernels": rows,
        "graphs": _totals(rows),
        "triton": triton_section,
    }


_KEEP = ("estimate_s", "roofline_s", "compute_s", "memory_s", "bound", "blocks",
         "blocks_per_sm", "waves", "occupancy", "registers", "flops", "executed_flops", "bytes")


def _totals(rows: list[dict]) -> list[dict]:
    """Per graph, dtype and variant: the matmul and attention kernels' estimates and
    rooflines summed."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["graph"], r["dtype"], r["variant"])
        t = out.setdefault(key, {"graph": key[0], "dtype": key[1], "variant": key[2],
                                 "default": r["default"], "kernels": 0, "estimate_s": 0.0,
                                 "roofline_s": 0.0})
        t["kernels"] += 1
        t["estimate_s"] += r["estimate_s"]
        t["roofline_s"] += r["roofline_s"]
    return list(out.values())


def markdown(section: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md table: one row per matmul or attention kernel (estimates in µs)."""
    lines = [
        f"Matmul and attention kernels on an {section['device']}: **estimates** from the generated kernels "
        f"(registers from {section['registers_from']}), not measurements; "
        "roofline = max(FLOPs / peak of the operand type, bytes / HBM bandwidth).",
        "",
        "| graph | dtype | kernel | variant | tile | grid | blocks/SM | occupancy | GFLOP | MB "
        "| estimate µs | roofline µs | bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in section["kernels"]:
        tile = "x".join(map(str, r["tile"])) if r.get("tile") else "-"
        lines.append(
            f"| {r['graph']} | {r['dtype']} | {r['kernel']} | {r['variant']} | {tile} "
            f"| {'x'.join(map(str, r['grid']))} | {r.get('blocks_per_sm', '-')} "
            f"| {r.get('occupancy', 0):.2f} | {r['flops'] / 1e9:.2f} | {r['bytes'] / 1e6:.1f} "
            f"| {r['estimate_s'] * 1e6:.1f} | {r['roofline_s'] * 1e6:.1f} | {r.get('bound', '-')} |"
        )
    from .peers import triton_peer

    lines += ["", "Summed per graph, dtype and variant, beside Triton for the same work "
              "(the same model on both sides):", ""] + readme_totals(section)
    triton = section.get("triton", {"not_available": "not in this run"})
    if "not_available" in triton:  # readme_totals said why
        return lines
    return lines + [""] + triton_peer.markdown(triton)


def readme_totals(section: dict[str, Any]) -> list[str]:
    """docs/benchmarks.md's summary: per graph, dtype and opfuse variant, opfuse's estimate summed
    over its matmul and attention kernels beside Triton's for the same work (bf16 vs
    Triton bf16; f32 SIMT vs Triton IEEE; f32 TF32 vs Triton TF32), and the roofline."""
    triton = section.get("triton", {})
    peer = {(t["graph"], t["dtype"], t["compare_with"]): t for t in triton.get("graphs", [])}
    lines = [
        "| graph | dtype | opfuse variant | opfuse kernels | opfuse µs | Triton kernels "
        "| Triton µs | Triton µs at the wgmma peak | roofline µs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in section["graphs"]:
        p = peer.get((t["graph"], t["dtype"], t["variant"]))
        tri = (f"{p['kernels']} ({p['precision']}) | {p['estimate_s'] * 1e6:.1f} "
               f"| {p['estimate_wgmma_s'] * 1e6:.1f}") if p else "- | - | -"
        variant = f"{t['variant']}{' (default)' if t['default'] else ''}"
        lines.append(
            f"| {t['graph']} | {t['dtype']} | {variant} | {t['kernels']} "
            f"| {t['estimate_s'] * 1e6:.1f} | {tri} | {t['roofline_s'] * 1e6:.1f} |"
        )
    if "not_available" in triton:
        lines += ["", f"Triton: n/a ({triton['not_available']})."]
    return lines


def readme_table(section: dict[str, Any]) -> list[str]:
    """docs/benchmarks.md's table: the default variant of each kernel, the other variants'
    estimates beside it (bf16: SIMT, wgmma; f32: TF32), and the roofline."""
    other: dict[tuple, list] = {}
    for r in section["kernels"]:
        if not r["default"]:
            other.setdefault((r["graph"], r["dtype"], r["kernel"]), []).append(r)
    lines = [
        "| graph | dtype | kernel | tile | grid | blocks/SM | occupancy | GFLOP | MB "
        "| estimate µs | other variants µs | roofline µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in section["kernels"]:
        if not r["default"]:
            continue
        os_ = other.get((r["graph"], r["dtype"], r["kernel"]), [])
        alt = ", ".join(f"{o['estimate_s'] * 1e6:.1f} ({o['variant']})" for o in os_) or "-"
        tile = "×".join(map(str, r["tile"])) if r.get("tile") else "-"
        lines.append(
            f"| {r['graph']} | {r['dtype']} | {r['kernel']} ({r['variant']}) | {tile} "
            f"| {'×'.join(map(str, r['grid']))} | {r['blocks_per_sm']} | {r['occupancy']:.2f} "
            f"| {r['flops'] / 1e9:.2f} | {r['bytes'] / 1e6:.1f} | {r['estimate_s'] * 1e6:.1f} "
            f"| {alt} | {r['roofline_s'] * 1e6:.1f} |"
        )
    return lines
