"""Reads a fusion report (JSON) on stdin; prints the kernel count before and after, then one
line per kernel: its kind and its matmuls (members named like the G graphs' projections),
or its first row mean (norms), or its first member (for the lit test kernel-counts.mlir)."""

import json
import sys

report = json.load(sys.stdin)
totals = report["totals"]
print(f"kernels {totals['before']['kernels']} -> {totals['after']['kernels']}")
for k in report["kernels"]:
    members = k["members"]
    matmuls = [m for m in members if m.endswith(("_proj", ".qk")) or m in ("ffn1", "ffn2")]
    norms = [m for m in members if ".mean" in m][:1]  # a norm's row reduction
    print(k["kind"], " ".join(matmuls or norms or members[:1]))
