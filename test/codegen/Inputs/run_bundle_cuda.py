"""Run a bundle on the GPU and on the CPU with the same random input; print the difference."""

import sys

import numpy as np

from opfuse.runtime import bundle

b = bundle.load(sys.argv[1])
rng = np.random.default_rng(0)
inputs = [rng.uniform(-1, 1, s).astype(np.float32) for s, _ in b.manifest["signature"]["inputs"]]
gpu = b.program("cuda")(*inputs)
cpu = b.program("cpu")(*inputs)
print("max abs difference cuda vs cpu:", float(np.max(np.abs(gpu - cpu))))
