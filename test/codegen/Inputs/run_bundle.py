"""Run a bundle on the CPU with x = arange (as f32, in the input's shape); print outputs."""

import sys

import numpy as np

from opfuse.runtime import bundle

b = bundle.load(sys.argv[1])
print("kernels:", ", ".join(sorted(b.kernels)))
inputs = [
    np.arange(np.prod(s), dtype=np.float32).reshape(s) for s, _ in b.manifest["signature"]["inputs"]
]
out = b.program("cpu")(*inputs)
for i, o in enumerate(out if isinstance(out, tuple) else (out,)):
    print(f"output {i}: shape {o.shape} {o.reshape(-1).tolist()}")
print("mlir imported:", any(m == "mlir" or m.startswith("mlir.") for m in sys.modules))
