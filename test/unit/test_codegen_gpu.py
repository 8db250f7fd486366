"""The cuda backend on a real GPU (``@pytest.mark.gpu``: skipped without a device and PyCUDA
or cuda-python).

Every G-graph runs through PyCUDA (kernels compiled here, and the same program through an
AOT bundle) and is compared with the CPU backend. Tolerances (f32): rtol 1e-3, atol 1e-4
(the GPU uses approximate exp/tanh and FMAs; reductions sum in another order).
"""

from __future__ import annotations

import numpy as np
import pytest

from opfuse.frontends.builder.graphs import graphs

from test_codegen_common import as_tuple, compile_cpu, inputs_of

pytestmark = pytest.mark.gpu

RTOL, ATOL = 1e-3, 1e-4
FULL = ("g1_mlp", "g2_elementwise_chain", "g3_softmax", "g4_layernorm", "g8_x_minus_mean")


@pytest.fixture(scope="module")
def cuda():
    from opfuse.runtime import cuda as cuda_rt

    try:
        cuda_rt.driver()
    except Exception as e:  # noqa: BLE001  (no PyCUDA/cuda-python, or no device)
        pytest.skip(str(e))
    return cuda_rt


def _graph(name):
    return graphs()[name] if name in FULL else graphs(small=True)[name]


@pytest.mark.parametrize("name", list(graphs(small=True)))
def test_cuda_matches_cpu_backend(cuda, name):
    graph = _graph(name)
    exe = compile_cpu(graph)
    args = inputs_of(graph)
    want = as_tuple(exe(*args))
    program = exe.gpu_program()
    got = cuda.CudaProgram(program.schedule, program.kernels)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["g2_elementwise_chain", "g6_encoder_layer"])
def test_bundle_on_cuda(cuda, name, tmp_path):
    from opfuse.runtime import bundle

    graph = _graph(name)
    exe = compile_cpu(graph)
    args = inputs_of(graph)
    b = bundle.load(exe.save_bundle(tmp_path / f"{name}.opfuse"))
    got = as_tuple(b.program("cuda")(*args))
    for g, w in zip(got, as_tuple(exe(*args))):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_unfused_program_on_cuda(cuda):
    graph = graphs(small=True)["g6_encoder_layer"]
    exe = compile_cpu(graph, fusion=False)
    args = inputs_of(graph)
    program = exe.gpu_program()
    got = cuda.CudaProgram(program.schedule, program.kernels)(*args)
    for g, w in zip(got, as_tuple(exe(*args))):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_timing_uses_cuda_events(cuda):
    graph = _graph("g2_elementwise_chain")
    exe = compile_cpu(graph)
    program = exe.gpu_program()
    times = cuda.CudaProgram(program.schedule, program.kernels).time(*inputs_of(graph), repeat=3)
    assert len(times) == 3 and all(0 < t < 1 for t in times)
