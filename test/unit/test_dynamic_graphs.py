"""G1–G8 with their batch / sequence / row dims dynamic (``?``, sizes read with
``tensor.dim``, as dynamic exports write them: ``dynamize``), compiled once by
``opfuse.compile`` and called at three sizes each (1, an odd size, a larger one): each
call matches the builder's numpy reference of the graph at that size, and fuses into the
same kernels as the static graph built at that size.

(What is compiled once is the SpecializedExecutable: it compiles the program again at
each new shape. One program that serves every size is issue 25's remaining work.)
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.backends.gpu.lower import ptxas
from opfuse.driver.specialized import SpecializedExecutable
from opfuse.frontends.builder import graphs as G

import dynamize

# graph: which of its size calls s(...) (in call order) are dynamic dims. Reduced dims that
# a mean averages stay static (dynamize's note); softmax and attention reduce over dynamic
# keys (no 1/N constant).
DYNAMIC = {
    "g1_mlp": (0,),                 # rows
    "g2_elementwise_chain": (0,),   # rows
    "g3_softmax": (0,),             # rows
    "g4_layernorm": (0,),           # rows
    "g5_attention": (0, 1),         # batch, sequence (queries and keys)
    "g6_encoder_layer": (0, 1),     # batch, sequence
    "g7_rmsnorm_swiglu": (0,),      # rows (tokens)
    "g8_x_minus_mean": (0,),        # rows
}
# the symbols' values at each checked size
SIZES = {"one": (1, 1), "odd": (7, 5), "large": (130, 33)}
SMALL = G.SMALL_SCALE


def _build(name: str, values: dict[int, int]):
    """Graph ``name`` at small scale, the dynamic size calls given ``values`` by call index."""
    calls = []

    def size(n: int) -> int:
        k = len(calls)
        calls.append(n)
        return values[k] if k in values else max(1, n // SMALL)

    return getattr(G, name)(size)


@pytest.fixture(scope="module")
def dynamic_executables():
    """One compile per graph: its dynamic module, and the sentinel graph it came from."""
    out = {}
    for name, calls in DYNAMIC.items():
        sentinel = _build(name, {k: dynamize.SENTINELS[i] for i, k in enumerate(calls)})
        text = dynamize.dynamize(sentinel.to_mlir())
        assert "tensor<?" in text
        out[name] = (opfuse.compile(text, backend="cpu"), sentinel)
    return out


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", list(DYNAMIC))
def test_dynamic_graph_matches_numpy_and_fuses_like_static(name, size, dynamic_executables):
    exe, sentinel = dynamic_executables[name]
    assert isinstance(exe, SpecializedExecutable)
    calls = DYNAMIC[name]
    values = {k: SIZES[size][i] for i, k in enumerate(calls)}
    static = _build(name, values)
    inputs = G.example_inputs(static, seed=1)
    arrays = [inputs[t.name] for t in static.inputs]
    for t, s, a in zip(sentinel.inputs, static.inputs, arrays):  # the shapes follow the symbols
        by_sentinel = {dynamize.SENTINELS[i]: SIZES[size][i] for i in range(len(calls))}
        assert dynamize.shape_at(t.shape, by_sentinel) == s.shape == a.shape
    got = exe(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    want = static.reference(*arrays)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=2e-4, atol=2e-5)
    # the fused program is the static one's; "before" may differ by the ops the
    # specialization's canonicalization folds (at size 1 a unit-dim transpose of G6)
    static_exe = opfuse.compile(static, backend="cpu")
    assert exe.report["totals"]["after"] == static_exe.report["totals"]["after"]


def test_sentinel_factorization():
    assert dynamize.factor(101 * 103 * 8) == (8, ((101, 1), (103, 1)))
    assert dynamize.factor(103 * 103) == (1, ((103, 2),))
    assert dynamize.shape_at((101 * 8, 64, 103), {101: 3, 103: 5}) == (24, 64, 5)


@pytest.mark.parametrize("size", ["one", "odd"])
@pytest.mark.parametrize("name", list(DYNAMIC))
def test_dynamic_graph_gpu_kernels_in_the_emulator(name, size, dynamic_executables):
    """The GPU program of each specialization, run by the PTX emulator (race check on),
    against the same numpy reference: tails at size 1 and at odd sizes."""
    from opfuse.testing.emulator import emulate

    exe, _ = dynamic_executables[name]
    values = {k: SIZES[size][i] for i, k in enumerate(DYNAMIC[name])}
    static = _build(name, values)
    inputs = G.example_inputs(static, seed=2)
    arrays = [inputs[t.name] for t in static.inputs]
    program = exe.at(*(a.shape for a in arrays)).gpu_program(("sm_80",), ptxas=False)
    got = emulate.run_program(program, arrays)
    for g_, w in zip(got, static.reference(*arrays)):
        np.testing.assert_allclose(g_, w, rtol=2e-4, atol=2e-5)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed (the 'ptxas' "
                    "extra, nvidia-cuda-nvcc); the numpy and emulator checks above still run")
@pytest.mark.parametrize("name", list(DYNAMIC))
def test_dynamic_graph_kernels_do_not_spill(name, dynamic_executables):
    """ptxas on every kernel of the odd-size specialization, sm_80 and sm_90: 0 spills."""
    exe, _ = dynamic_executables[name]
    static = _build(name, {k: SIZES["odd"][i] for i, k in enumerate(DYNAMIC[name])})
    program = exe.at(*(t.shape for t in static.inputs)).gpu_program(("sm_80", "sm_90"))
    assert program.kernels
    for name_, kernel in program.kernels.items():
        assert set(kernel.resources) == {"sm_80", "sm_90"}, name_
        for chip, res in kernel.resources.items():
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (name_, chip, res)
