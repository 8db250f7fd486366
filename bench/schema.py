"""The JSON document's schema, as data, and a validator (SCHEMA.md explains each field).

A spec is one of: a type name (``"num"``: a finite int or float, not a bool; ``"int"``;
``"str"``; ``"bool"``; ``"any"``), a dict of required keys (extra keys are allowed), a
``[spec]`` list (every item matches), or :class:`Fig` — a figure: the spec *or*
``{"not_available": "<reason>"}``. Every measured figure is a ``Fig``: a run that cannot
measure something says why instead of leaving it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fig:
    """A figure: ``spec``, or ``{"not_available": reason}``."""

    spec: Any


TIME = {"median_s": "num", "min_s": "num", "max_s": "num", "samples": "int",
        "calls_per_round": "int", "rounds": "int"}
RATIO = {"median": "num", "min": "num", "max": "num", "of_medians": "num"}
ERROR = {"max_scaled_error": Fig("num"), "ok": "bool"}
STAGES = {"parse_s": "num", "fusion_s": "num", "codegen_s": "num", "jit_s": "num",
          "ptxas": Fig("num"), "total_s": "num"}
COMPILE_MODE = {"cold": Fig(STAGES), "warm": Fig(STAGES)}
PEER_NAMES = ("numpy", "torch_eager", "torch_compile", "jax_jit", "iree_st", "iree_mt")

GRAPH = {
    "name": "str",
    "source": "str",
    "scale": Fig("int"),
    "doc": "str",
    "inputs": [{"shape": ["int"], "dtype": "str"}],
    "kernels": {"before": "int", "after": "int", "inductor": Fig("int"), "xla": Fig("int"),
                "iree": Fig("int"), "iree_cuda": Fig("int"), "inductor_detail": Fig("any"), "xla_detail": Fig("any"),
                "iree_detail": Fig("any")},
    "bytes": {"before": "int", "after": "int", "saved": "int"},
    "flops": {"before": "int", "after": "int"},
    "correctness": {"against": "str", "tolerance": "num", "unfused": ERROR, "fused": ERROR,
                    **{p: Fig(ERROR) for p in PEER_NAMES}},
    "time": {"backend": "str", "unfused": TIME, "fused": TIME, "speedup": RATIO,
             "contractions_alone": Fig({**TIME, "unfused_over": RATIO}),
             "peers": {p: Fig({**TIME, "ratio_to_fused": RATIO}) for p in PEER_NAMES},
             "thread_cpu": Fig({"fused_s": "num",
                                "contenders": "any"})},
    "compile": {"fused": COMPILE_MODE, "unfused": COMPILE_MODE,
                "peers": {"torch_compile": Fig("num"), "jax_jit": Fig("num"),
                          "iree_st": Fig("num")}},
}

GEOMEAN = {"graphs": "int", "geomean": "num", "worst": "num", "worst_graph": "str",
           "per_graph": "any", "met": "bool"}

POINT = {"target_ops": "int", "ops": "int", "planning_s": "num", "outline_s": "num",
         "planning_cpu_s": "num", "outline_cpu_s": "num", "repeat": "int"}
FAMILY = {"points": [POINT], "planning_exponent": "num", "outline_exponent": "num",
          "planning_cpu_exponent": "num"}

GPU_KERNEL = {"graph": "str", "dtype": "str", "variant": "str", "default": "bool",
              "kernel": "str", "emitter": "str", "grid": ["int"], "block": ["int"],
              "estimate_s": "num", "roofline_s": "num", "compute_s": "num", "memory_s": "num",
              "bound": "str", "blocks": "int", "blocks_per_sm": "int", "waves": "int",
              "occupancy": "num", "registers": "int", "flops": "num", "executed_flops": "num",
              "bytes": "num", "smem": "int", "spills": "int"}
_TRITON_ARCH = {"chip": "str", "registers": "int", "spills": "int", "smem": "int",
                "instructions": ["str"], "compile_s": "num"}
TRITON_KERNEL = {"graph": "str", "dtype": "str", "precision": "str", "compare_with": "str",
                 "name": "str", "kernel": "str",
                 "config": {"block_m": "int", "block_n": "int", "block_k": "int",
                            "num_warps": "int", "num_stages": "int", "group_m": "int"},
                 "grid": ["int"], "block": ["int"], "tile": ["int"], "smem": "int",
                 "spills": "int", "instructions": ["str"], "sm_80": _TRITON_ARCH,
                 "model_notes": ["str"], "estimate_s": "num", "roofline_s": "num",
                 "compute_s": "num", "memory_s": "num", "bound": "str", "blocks": "int",
                 "blocks_per_sm": "int", "waves": "int", "occupancy": "num",
                 "registers": "int", "flops": "num", "executed_flops": "num", "bytes": "num",
                 "candidates": [{"block_m": "int", "block_n": "int", "block_k": "int",
                                 "num_warps": "int", "num_stages": "int", "group_m": "int",
                                 "spills": "int", "smem": "int"}]}
TRITON = {"version": "str", "method": "str", "config_choice": "str", "chips": ["str"],
          "device": "str", "ptxas": {"sm_90a": "str", "sm_80": "str"},
          "kernels": [TRITON_KERNEL],
          "graphs": [{"graph": "str", "dtype": "str", "precision": "str",
                      "compare_with": "str", "kernels": "int", "estimate_s": "num",
                      "estimate_wgmma_s": "num", "roofline_s": "num"}],
          "failed": [{"graph": "str", "dtype": "str", "precision": "str", "name": "str",
                      "reason": "str"}]}
GPU_ESTIMATE = {"device": "str", "chip": "str", "scale": "int", "method": "str",
                "registers_from": "str", "kernels": [GPU_KERNEL],
                "graphs": [{"graph": "str", "dtype": "str", "variant": "str", "default": "bool",
                            "kernels": "int", "estimate_s": "num", "roofline_s": "num"}],
                "triton": Fig(TRITON)}

DOCUMENT = {
    "schema": "str",
    "created_utc": "str",
    "command": ["str"],
    "quick": "bool",
    "total_run_s": "num",
    "machine": {"platform": "str", "processor": "str", "python": "str", "cpus": "int",
                "backend": "str", "gpu": Fig("str")},
    "versions": {"opfuse": "str", "mlir_bindings": Fig("str"), "numpy": Fig("str"),
                 "torch": Fig("str"), "jax": Fig("str"), "jaxlib": Fig("str"),
                 "matplotlib": Fig("str"),
                 "opfuse_tree": Fig({"commit": "str", "uncommitted_source_files": "int"})},
    "settings": {"backend": "str", "threads": "int", "time_budget_s": "num", "block_s": "num",
                 "min_rounds": "int", "max_rounds": "int", "timing_method": "str",
                 "tolerance": "num"},
    "peers": {p: Fig({"version": "str", "init_s": "num"}) for p in PEER_NAMES},
    "compile_time": {"meaning": "str", "process_init_s": "num", "stages": ["str"]},
    "graphs": [GRAPH],
    "skipped": [{"name": "str", "source": "str", "reason": "str"}],
    "scaling": {"pipelines": {"planning": "str", "outline": "str"}, "sizes": ["int"],
                "families": {"chain": FAMILY, "dag": FAMILY}, "largest_target_ops": "int",
                "planning_largest_s": "num", "planning_largest_cpu_s": "num",
                "planning_exponent": "num",
                "outline_exponent": "num"},
    "summary": {"g2_speedup": Fig("num"), "g2_scale": Fig("int"),
                "fused_over_iree_st": Fig({**GEOMEAN, "threads": "int",
                                           "target_geomean": "num", "target_worst": "num",
                                           "thread_cpu": Fig(GEOMEAN)}),
                "fusion_win": Fig({"target_min": "num", "per_graph": "any", "met": "bool"}),
                "planning_largest_s": "num",
                "planning_largest_cpu_s": "num",
                "planning_largest_target_ops": "int", "planning_exponent": "num",
                "targets": {"g2_speedup_min": "num", "planning_largest_s_max": "num",
                            "planning_exponent_max": "num"},
                "met": {"g2_speedup": Fig("bool"), "planning_largest": Fig("bool"),
                        "planning_exponent": Fig("bool")},
                "all_correct": "bool"},
    "gpu_estimate": Fig(GPU_ESTIMATE),
    "files": {"json": "str", "markdown": "str", "charts": Fig(["str"])},
}


def validate(doc: Any, spec: Any = None, path: str = "$") -> list[str]:
    """Every mismatch between ``doc`` and ``spec`` (default: :data:`DOCUMENT`), as
    ``"$.graphs[0].time.fused.median_s: expected num, got str"`` lines; empty if valid."""
    spec = DOCUMENT if spec is None else spec
    if isinstance(spec, Fig):
        if isinstance(doc, dict) and set(doc) == {"not_available"}:
            reason = doc["not_available"]
            return [] if isinstance(reason, str) and reason else [f"{path}: empty not_available"]
        return validate(doc, spec.spec, path)
    if isinstance(spec, dict):
        if not isinstance(doc, dict):
            return [f"{path}: expected an object, got {type(doc).__name__}"]
        errors = []
        for key, sub in spec.items():
            if key not in doc:
                errors.append(f"{path}.{key}: missing")
            else:
                errors += validate(doc[key], sub, f"{path}.{key}")
        return errors
    if isinstance(spec, list):
        if not isinstance(doc, list):
            return [f"{path}: expected a list, got {type(doc).__name__}"]
        return [e for i, item in enumerate(doc) for e in validate(item, spec[0], f"{path}[{i}]")]
    return [] if _is(doc, spec) else [f"{path}: expected {spec}, got {doc!r:.60}"]


def _is(value: Any, kind: str) -> bool:
    if kind == "any":
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "num":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok and math.isfinite(value)
    raise ValueError(f"unknown spec type {kind!r}")


def paths(spec: Any = None, prefix: str = "") -> list[str]:
    """Every key path of the spec (``graphs[].time.fused.median_s``), for SCHEMA.md checks."""
    spec = DOCUMENT if spec is None else spec
    if isinstance(spec, Fig):
        return paths(spec.spec, prefix)
    if isinstance(spec, list):
        return paths(spec[0], prefix + "[]")
    if isinstance(spec, dict):
        out = []
        for key, sub in spec.items():
            p = f"{prefix}.{key}" if prefix else key
            out.append(p)
            out += paths(sub, p)
        return out
    return []
