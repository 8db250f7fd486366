"""opfuse's benchmark suite: ``python -m bench`` (see ``bench/SCHEMA.md``).

For each of the G1–G8 graphs (and any ``.mlir`` file given on the command line) it
records, in one JSON file: kernels and device bytes before and after fusion (with the
kernel counts of Inductor and XLA on the same graph), the run time of the unfused and
the fused program on the same backend measured interleaved, beside numpy eager, torch
eager, torch.compile and jax.jit, opfuse's compile time per stage (cold and warm), and
how fusion planning time scales on synthetic graphs of 100 to 10,000 ops. A markdown
table and PNG charts are written next to the JSON.

The package stays import-light (no numpy here): ``python -m bench`` must set the thread
environment variables before numpy, torch or jax are first imported.
"""

SCHEMA_ID = "opfuse-bench/1"
