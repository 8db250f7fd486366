"""The IREE peer of the benchmark (bench/peers/iree.py): its dispatch counter and entry
finder on fixed text (always), and, where the bench extra's IREE is installed, one G graph
compiled from the .mlir opfuse compiles, run on both drivers against the float64
reference, in a process that already holds opfuse's MLIR bindings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a top-level folder, not part of the package
    sys.path.insert(0, str(ROOT))

from bench.peers import iree  # noqa: E402

FLOW = """
module {
  flow.executable private @main_dispatch_0 {
    flow.executable.export public @main_dispatch_0_generic workgroups() -> (index, index, index) {
    }
  }
  flow.executable private @main_dispatch_1 {
    flow.executable.export public @main_dispatch_1_matmul
  }
  util.func public @main(%arg0: !hal.buffer_view) -> !hal.buffer_view {
    %0 = flow.dispatch @main_dispatch_0::@main_dispatch_0_generic(%a) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = flow.dispatch @main_dispatch_1::@main_dispatch_1_matmul(%0) : (tensor<4xf32>) -> tensor<4xf32>
    %2 = flow.dispatch @main_dispatch_0::@main_dispatch_0_generic(%1) : (tensor<4xf32>) -> tensor<4xf32>
  }
}
"""


def test_dispatch_count_is_call_sites_and_executables_are_distinct():
    k = iree.count_dispatches(FLOW)
    assert (k["count"], k["executables"]) == (3, 2)
    assert "flow.dispatch" in k["method"]


def test_entry_is_the_first_public_function():
    text = ("func.func private @helper(%x: f32) -> f32\n"
            "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n}\n"
            "func.func @other(%x: tensor<4xf32>) -> tensor<4xf32> {\n}\n")
    assert iree.public_entry(text) == "main"
    with pytest.raises(ValueError):
        iree.public_entry("func.func private @only(%x: f32) -> f32\n")


_HAVE_IREE = (importlib.util.find_spec("iree") is not None
              and importlib.util.find_spec("iree.runtime") is not None)


@pytest.mark.skipif(not _HAVE_IREE, reason="IREE (the bench extra) is not installed")
def test_iree_runs_a_g_graph_on_both_drivers():
    import opfuse  # noqa: F401  (opfuse's MLIR bindings first: iree-compile must not clash)
    from opfuse.frontends.builder.graphs import example_inputs, graphs

    g = graphs(scale=16)["g3_softmax"]
    arrays = list(example_inputs(g).values())
    ref = g.reference(*arrays)[0]
    makers = iree.make_peers(2)
    for name in ("iree_st", "iree_mt"):
        p = makers[name]().prepare(g.to_mlir(), arrays)
        assert p.kernels["count"] >= 1 and p.compile_s > 0
        cuda = p.kernels["cuda"]  # compiled for CUDA sm_80 too (counts only, no GPU)
        assert cuda["count"] >= 1 and cuda["target"] == iree.CUDA_NOTE, cuda
        assert float(np.max(np.abs(p.output.astype(np.float64) - ref))) < 1e-5
        np.testing.assert_array_equal(p.run(), p.output)
