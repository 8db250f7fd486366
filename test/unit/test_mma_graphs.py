"""Issue 12's done-when on the benchmark graphs: G1 (MLP), G5 (attention), G6 (encoder
layer) and G7 (RMSNorm + SwiGLU) in f16 and bf16.

* Full size, for sm_80 and sm_90: every matmul kernel is built by the tensor-core emitter
  and so is every attention kernel (G5 is one, G6 has one: backends/gpu/emit/attention_mma.py, both
  products on tensor cores), its PTX contains ``mma.sync`` and ``cp.async`` (and
  ``ldmatrix``; ``.trans`` for the attention's V), and ``ptxas -v`` reports 0 bytes of
  spill stores and loads (skipped without ptxas).
* At 1/8 size: the emulated kernels (race check on) match the builder's numpy reference,
  within 1e-2 (f16) and 3e-2 (bf16) of max(1, max |reference|) (see test_codegen_mma.py
  for why those figures).
"""

from __future__ import annotations

import pytest

from opfuse.backends.gpu.lower import ptxas as ptxas_mod
from opfuse.backends.gpu.compiler import compile_module
from opfuse.frontends.builder.graphs import graphs

from test_codegen_common import compile_cpu
from test_codegen_mma import TOL, emulated

import numpy as np

GRAPHS = ("g1_mlp", "g5_attention", "g6_encoder_layer", "g7_rmsnorm_swiglu")
CHIPS = ("sm_80", "sm_90")
#: The tensor-core emitter of each kernel kind that multiplies.
TENSOR_CORE = {"output": "mma", "attention": "attention_mma", "horizontal": "horizontal_mma"}


def _products(program) -> list:
    """The kernels that multiply (matmuls and attention), each checked to be built by its
    tensor-core emitter."""
    out = [k for k in program.kernels.values() if k.name.rsplit("_", 1)[-1] in TENSOR_CORE]
    assert out and all(k.emitter == TENSOR_CORE[k.name.rsplit("_", 1)[-1]] for k in out), (
        [(k.name, k.emitter) for k in out], program.notes)
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", GRAPHS)
def test_emulated_graph_matches_numpy(name, dtype):
    g = graphs(small=True, dtype=dtype)[name]
    program, emu, got, want = emulated(g)
    products = _products(program)
    if name == "g5_attention":
        assert [k.emitter for k in products] == ["attention_mma"]
    for x, w in zip(got, want):
        assert not np.isnan(x).any()
        np.testing.assert_allclose(x, w, rtol=0, atol=TOL[dtype] * max(1.0, np.abs(w).max()))
    assert emu.stats.ldmatrix_wavefronts == emu.stats.ldmatrix_matrices  # no bank conflicts


@pytest.mark.skipif(ptxas_mod.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", GRAPHS)
def test_full_size_matmul_kernels_use_tensor_cores_without_spills(name, dtype):
    g = graphs(dtype=dtype)[name]
    program = compile_module(compile_cpu(g)._source, targets=CHIPS, ptxas=False)
    products = _products(program)
    assembled: set = set()
    for k in products:
        for chip in CHIPS:
            ptx = k.ptx[chip]
            assert f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32" in ptx, k.name
            assert "cp.async.cg.shared.global" in ptx and "ldmatrix.sync.aligned" in ptx, k.name
            if k.emitter == "attention_mma":
                assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx, k.name
            same = (chip, ptx.replace(k.entry, "kernel"))  # G6's four projections: one PTX
            if same in assembled:
                continue
            assembled.add(same)
            _, res = ptxas_mod.assemble(ptx, chip, name=k.name)
            (r,) = res.values()
            assert r.spill_stores == 0 and r.spill_loads == 0, (k.name, chip, r)
