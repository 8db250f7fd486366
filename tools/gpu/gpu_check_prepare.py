"""gpu-check, here: the plan (which graphs, types and variants) and ``prepare`` (the
bundles and inputs.json the GPU machine runs; see tools/gpu/gpu_check.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpu_check_graph import SECTIONS, section

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
#: The wgmma variant's targets (whatever the run's --targets: wgmma is sm_90a code).
WGMMA_TARGETS = ("sm_90a",)

# ----- the plan -----------------------------------------------------------------------------
def default_plan() -> list[dict]:
    """What to run, in order: the tensor-core graphs first (what matters most), then f32."""
    out = []
    for dtype, names in (("bf16", MATMUL_GRAPHS), ("f16", MATMUL_GRAPHS), ("f32", ALL_GRAPHS)):
        for name in names:
            variants: dict = {}
            if name in MATMUL_GRAPHS and dtype == "f32":
                variants = {"tf32": {"allow_tf32": True}}
            elif name in MATMUL_GRAPHS:
                # SIMT, and the warpgroup MMA (sm_90a code: it runs on sm_90 devices only)
                variants = {"simt": {"matmul": "simt"},
                            "wgmma": {"matmul": "wgmma", "targets": list(WGMMA_TARGETS)}}
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
    from opfuse.frontends.builder.graphs import graphs as make_graphs

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
        variants = {}
        for variant, options in e["variants"].items():
            files[variant] = f"{key}.{variant}.opfuse"
            options = dict(options)
            fused.save_bundle(folder / files[variant], targets=options.pop("targets", targets), **options)
            if options.get("matmul") == "wgmma" and not _emits(folder / files[variant], "wgmma"):
                # no matmul kernel (G5: one attention kernel, mma.sync either way): the
                # bundle would be the fused one again, timed for nothing on the device
                (folder / files.pop(variant)).unlink()
                print(f"{key}: no kernel takes the wgmma variant; not prepared", flush=True)
                continue
            variants[variant] = e["variants"][variant]
        entry = {**e, "variants": variants, "inputs": _describe(g), "bundles": files,
                 "reference": "full"}
        for sname in SECTIONS:  # other modules' parts of the plan (gpu_check_graph.SECTIONS)
            mod = section(sname)
            part = mod.prepare_entry(folder, entry, targets=targets, scale=scale, graph=g) if mod else None
            if part:
                entry[sname] = part
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


def _emits(path: Path, emitter: str) -> bool:
    """Whether a kernel of the bundle at ``path`` comes from ``emitter``."""
    from opfuse.runtime import bundle as rb

    return any(k.emitter == emitter for k in rb.load(path).kernels.values())


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



def _write_json(path: Path, data: dict) -> None:
    """Atomically (a temporary file, then a rename): a kill never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
