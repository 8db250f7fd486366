"""Matmul epilogues through a reshape of the result (opfuse-fuse-epilogue + the matmul
emitters' placements, backends/gpu/emit/matmul.py).

torch imports every ``nn.Linear`` on a ``[B, S, D]`` input as a matmul on ``[B*S, D]``
followed by ``tensor.expand_shape`` back to ``[B, S, N]`` and then the bias add (and the
residual, the activation): the reshape splits M, so the result keeps the matmul's layout
and the epilogue joins its kernel. Checked here:

* builder graphs with such reshapes (M split, N split into heads, a batch split, M and N
  tails, a SwiGLU pair): one kernel each; the builder's numpy reference = the fused and
  the unfused CPU program = the emulated kernels (race check on) in f32, and in bf16 the
  tensor-core kernels (emitter ``mma``; ``matmul``, the SIMT kernel, for f32 and with
  ``matmul=simt``); never the ``fallback`` emitter;
* a reshape that merges M with N stays out of the epilogue, with the ledger's reason;
* imported ``torch.nn.TransformerEncoderLayer`` (batch_first; norm_first both ways):
  7 kernels (QKV, attention, out-proj, LN1, FFN1+ReLU, FFN2, LN2, in some order), CPU =
  eager, and its GPU kernels in the emulator = eager, f32 and bf16;
* ptxas: the tensor-core kernel with a reshaped epilogue at a real size has no spills.

Tolerances relative to max(1, max|reference|): f32 1e-5 (CPU) / 1e-4 (emulator, another
summation order), bf16 3e-2 (test_codegen_mma.py's).
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas as ptxas_mod
from opfuse.backends.gpu.compiler import compile_module

from test_codegen_common import as_tuple, compile_cpu, inputs_of
from test_codegen_mma import TOL, emulated

OUTPUT_KINDS = ("output", "horizontal")


def unflat_bias_gelu_residual(g: Graph, b: int = 2, s: int = 9, d: int = 32, n: int = 48):
    """nn.Linear on [B, S, D] as torch imports it, + GELU + residual."""
    x = g.input("x", (b * s, d))
    w, bias, res = g.input("w", (d, n)), g.input("b", (n,)), g.input("res", (b, s, n))
    y = g.reshape(g.matmul(x, w), (b, s, n), name="unflat")
    g.output(g.gelu(y + bias) + res)


def heads(g: Graph):
    """N split into heads: [M, H*D] -> [M, H, D], a per-head bias and a scale."""
    x, w, bias = g.input("x", (16, 32)), g.input("w", (32, 64)), g.input("b", (4, 16))
    y = g.reshape(g.matmul(x, w), (16, 4, 16), name="heads")
    g.output((y + bias) * 0.5)


def batch_split(g: Graph):
    """A batched matmul's batch dim split ([B*H, M, N] -> [B, H, M, N]) before a bias."""
    x, w, bias = g.input("x", (6, 8, 16)), g.input("w", (6, 16, 24)), g.input("b", (24,))
    y = g.reshape(g.matmul(x, w), (2, 3, 8, 24), name="unbatch")
    g.output(g.relu(y + bias))


def tails(g: Graph):
    """M = 2*35 and N = 66: no tile divides them (row and column tails, odd pair count)."""
    unflat_bias_gelu_residual(g, b=2, s=35, d=64, n=66)


def swiglu_3d(g: Graph):
    """silu(x @ Wg) * (x @ Wu) on a [B, S, D] input: two unflattened products, one
    horizontal kernel whose epilogue reads both."""
    x = g.input("x", (2, 9, 32))
    wg, wu = g.input("wg", (32, 40)), g.input("wu", (32, 40))
    flat = g.reshape(x, (18, 32), name="flat")
    gate = g.reshape(g.matmul(flat, wg), (2, 9, 40), name="gate.unflat")
    up = g.reshape(g.matmul(flat, wu), (2, 9, 40), name="up.unflat")
    g.output(g.silu(gate) * up)


CASES = {
    "unflat_bias_gelu_residual": unflat_bias_gelu_residual,
    "heads": heads,
    "batch_split": batch_split,
    "tails": tails,
    "swiglu_3d": swiglu_3d,
}


def _graph(build, dtype: str) -> Graph:
    g = Graph(build.__name__, dtype)
    build(g)
    return g


def _emitters(program) -> list[str]:
    return sorted(k.emitter for k in program.kernels.values())


@pytest.mark.parametrize("name", list(CASES))
def test_reshaped_epilogue_is_one_kernel_and_right_everywhere_f32(name):
    g = _graph(CASES[name], "f32")
    args = inputs_of(g)
    want = g.reference(*args)
    fused, unfused = compile_cpu(g), compile_cpu(g, fusion=False)
    assert fused.report["totals"]["after"]["kernels"] == 1, fused.report["totals"]
    for exe in (fused, unfused):
        for o, w in zip(as_tuple(exe(*args)), want):
            np.testing.assert_allclose(o, w, rtol=0, atol=1e-5 * max(1.0, np.abs(w).max()))
    program = compile_module(fused._source, lower=False)
    want_emitter = "horizontal" if name == "swiglu_3d" else "matmul"
    assert _emitters(program) == [want_emitter], program.notes
    for o, w in zip(emulate.run_program(program, args), want):
        np.testing.assert_allclose(o, w, rtol=0, atol=1e-4 * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("variant", ["auto", "simt"])
@pytest.mark.parametrize("name", list(CASES))
def test_reshaped_epilogue_bf16_kernels(name, variant):
    g = _graph(CASES[name], "bf16")
    program, _, got, want = emulated(g, matmul=variant)
    tensor_cores = "horizontal_mma" if name == "swiglu_3d" else "mma"
    simt = "horizontal" if name == "swiglu_3d" else "matmul"
    assert _emitters(program) == [tensor_cores if variant == "auto" else simt], program.notes
    for x, w in zip(got, want):
        assert not np.isnan(x).any()
        np.testing.assert_allclose(x, w, rtol=0, atol=TOL["bf16"] * max(1.0, np.abs(w).max()))


def test_a_reshape_merging_m_and_n_stays_out_of_the_epilogue():
    g = Graph("flatten_m_and_n", "f32")
    x, w, b = g.input("x", (16, 32)), g.input("w", (32, 8)), g.input("b", (128,))
    g.output(g.reshape(g.matmul(x, w), (128,), name="flat") + b)
    exe = compile_cpu(g)
    assert exe.report["totals"]["after"]["kernels"] == 2
    reasons = [d["reason"] for d in exe.report["decisions"] if not d["fused"]]
    assert any("merges the matmul's M and N dims (16x8 into 128)" in r for r in reasons), reasons
    args = inputs_of(g)
    (want,) = g.reference(*args)
    np.testing.assert_allclose(exe(*args), want, rtol=1e-6, atol=1e-5)


@pytest.mark.skipif(ptxas_mod.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("name", ["unflat_bias_gelu_residual", "heads_full"])
def test_reshaped_epilogue_tensor_core_kernel_has_no_spills(name):
    g = Graph(name, "bf16")
    if name == "heads_full":
        x, w, bias = g.input("x", (512, 256)), g.input("w", (256, 768)), g.input("b", (12, 64))
        g.output(g.reshape(g.matmul(x, w), (512, 12, 64), name="heads") + bias)
    else:
        unflat_bias_gelu_residual(g, b=4, s=128, d=256, n=1024)
    chips = ("sm_80", "sm_90")
    program = compile_module(compile_cpu(g)._source, targets=chips, ptxas=False)
    assert _emitters(program) == ["mma"], program.notes
    for k in program.kernels.values():
        for chip in chips:
            _, res = ptxas_mod.assemble(k.ptx[chip], chip, name=k.name)
            (res,) = res.values()
            assert res.spill_stores == 0 and res.spill_loads == 0, (k.name, chip, res)
