"""Helpers shared by the GPU codegen and bundle tests (no tests here).

The kernel cache of these tests lives in a temporary folder per session (conftest.py sets
``OPFUSE_CACHE_DIR``), so the results do not depend on what an earlier run left in
``~/.cache/opfuse``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import opfuse
from opfuse import pipeline as pl

#: Emulated GPU kernels against the CPU backend (f32): the emulator computes in f32 with
#: numpy, in another summation order for reductions and matmuls.
RTOL, ATOL = 1e-4, 1e-5


def fusion_pipeline() -> pl.Pipeline:
    """The default pipeline, with opfuse-fuse-epilogue before outlining if the default
    does not list it yet."""
    p = pl.Pipeline.default()
    if "opfuse-fuse-epilogue" not in p.names:
        from opfuse.passes import fuse_epilogue

        p.insert(
            len(p.steps) - 1,
            pl.OpfuseStep(fuse_epilogue.NAME, fuse_epilogue, fuse_epilogue.Options()),
        )
    return p


def compile_cpu(graph, *, fusion: bool = True):
    """A CPU Executable of ``graph`` (fused with the epilogue pass, or unfused)."""
    if fusion:
        return opfuse.compile(graph, backend="cpu", pipeline=fusion_pipeline())
    return opfuse.compile(graph, backend="cpu", fusion=False)


def as_tuple(out):
    if isinstance(out, (tuple, list)):
        return tuple(out)
    return (out,)


def inputs_of(graph, seed: int = 0) -> list[np.ndarray]:
    from opfuse.frontends.builder.graphs import example_inputs

    values = example_inputs(graph, seed)
    return [values[t.name] for t in graph.inputs]


def assert_close(got, want, rtol: float = RTOL, atol: float = ATOL) -> None:
    got, want = as_tuple(got), as_tuple(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def assert_everywhere(graph, args: list, want: list, *, kernels: int | None = None):
    """The builder's reference, the fused and the unfused CPU program and the fused GPU
    kernels in the emulator (race check on) all give ``want`` (one array per output);
    ``kernels``: the fused kernel count. Returns the fused Executable."""
    from opfuse.testing.emulator import emulate
    from opfuse.backends.gpu.compiler import compile_module

    for r, w in zip(graph.reference(*args), want):
        assert r.dtype == w.dtype, (r.dtype, w.dtype)
        np.testing.assert_allclose(r, w, rtol=1e-6, atol=1e-6)
    fused = compile_cpu(graph)
    for exe in (fused, compile_cpu(graph, fusion=False)):
        for o, w in zip(as_tuple(exe(*args)), want):
            assert o.dtype == w.dtype, (o.dtype, w.dtype)
            np.testing.assert_allclose(o, w, rtol=1e-6, atol=1e-6)
    program = compile_module(fused._source, lower=False)
    for o, w in zip(emulate.run_program(program, args), want):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)
    if kernels is not None:
        assert fused.report["totals"]["after"]["kernels"] == kernels
    return fused


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from opfuse.runtime import bundle
    b = bundle.load(sys.argv[1])
    data = np.load(sys.argv[2])
    args = [data[f"a{i}"] for i in range(len(data.files))]
    out = b.program("cpu")(*args)
    out = out if isinstance(out, tuple) else (out,)
    np.savez(sys.argv[3], *out)
    leaked = sorted(m for m in sys.modules if m == "mlir" or m.startswith("mlir."))
    assert not leaked, leaked
    print("no mlir")
""")


def run_bundle_without_mlir(path, args, tmp_path: Path) -> list[np.ndarray]:
    """Run bundle ``path`` on its CPU library in a fresh Python process that never imports
    ``mlir`` (it asserts so); returns its outputs."""
    np.savez(tmp_path / "in.npz", **{f"a{i}": a for i, a in enumerate(args)})
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no mlir" in proc.stdout
    got = np.load(tmp_path / "out.npz")
    return [got[f"arr_{i}"] for i in range(len(got.files))]
