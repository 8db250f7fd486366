"""GPU codegen without a GPU: launch shapes, PTX and ptxas figures, and emulated results.

* Every G1–G8 kernel at benchmark size is lowered for sm_80 and sm_90 and, when ptxas is
  installed, assembled with 0 spills; launch shapes are checked (no block under 32
  threads), loop kernels use 128-bit global loads, row kernels warp shuffles, matmuls FMAs.
* The kernels' results are checked by running the outlined kernels in the lockstep
  emulator (:mod:`opfuse.testing.emulator.emulate`) with the KernelSpecs' argument order, against
  the builder's numpy reference (float64 rounded to f32; rtol 1e-4, atol 1e-5): G1–G8 at
  1/8 size, fused and unfused, and shapes chosen for their tails.
"""

from __future__ import annotations

import pytest
from mlir import ir

from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import nvptx, ptxas
from opfuse.backends.gpu.compiler import compile_module
from opfuse.backends.gpu.build.lanes import Kind, analyze
from opfuse.errors import OpfuseError
from opfuse.frontends.builder.graphs import graphs
from opfuse.runtime.schedule import KernelSpec

from test_codegen_common import as_tuple, assert_close, compile_cpu, inputs_of

G_NAMES = list(graphs(small=True))
HAVE_PTXAS = ptxas.find_ptxas() is not None
EXPECTED_EMITTERS = {
    "g1_mlp": ["matmul", "matmul"],
    "g2_elementwise_chain": ["loop"],
    "g3_softmax": ["rows"],
    "g4_layernorm": ["rows"],
    "g5_attention": ["attention"],
    "g7_rmsnorm_swiglu": ["rows", "horizontal", "matmul"],  # W1 and W3: one kernel
    "g8_x_minus_mean": ["rows"],
}


@pytest.fixture(scope="module")
def full_size_programs():
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            exe = compile_cpu(graphs()[name])
            cache[name] = compile_module(exe._source, targets=("sm_80", "sm_90"))
        return cache[name]

    return get


@pytest.mark.parametrize("name", G_NAMES)
def test_full_size_kernels_assemble_with_deliberate_launch_shapes(name, full_size_programs):
    program = full_size_programs(name)
    kernels = list(program.kernels.values())
    assert kernels and not program.notes  # every group had its kind's emitter
    if name in EXPECTED_EMITTERS:
        assert [k.emitter for k in kernels] == EXPECTED_EMITTERS[name]
    for k in kernels:
        assert k.threads_per_block >= 32, f"{k.name}: {k.block}"
        assert k.threads_per_block % 32 == 0
        for chip in ("sm_80", "sm_90"):
            ptx = k.ptx[chip]
            assert f".entry {k.entry}(" in ptx and f".target {chip}" in ptx
            if k.emitter == "loop":
                assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx
                assert "st.global.v4" in ptx
            if k.emitter == "rows":
                assert "shfl.sync.bfly" in ptx
                assert "ld.global.nc.v4" in ptx  # read-only inputs: non-coherent cache
            if k.emitter in ("matmul", "horizontal"):
                assert "fma.rn.f32" in ptx
            if HAVE_PTXAS:
                res = k.resources[chip]
                assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, chip, res)
                assert 0 < res["registers"] <= 128, (k.name, chip, res)
                assert k.cubin[chip][:4] == b"\x7fELF"


def test_g1_is_two_kernels_matmul_bias_gelu(full_size_programs):
    program = full_size_programs("g1_mlp")
    assert len(program.kernels) == 2
    assert [type(s).__name__ for s in program.schedule.steps] == ["Call", "Call"]


def test_g2_loop_kernel_launch_shape(full_size_programs):
    (k,) = full_size_programs("g2_elementwise_chain").kernels.values()
    # 4096 x 4096 floats, 4 per thread (one 16-byte vector), 256 threads per block
    assert k.block == (256, 1, 1) and k.grid == (4096 * 4096 // 4 // 256, 1, 1)
    assert k.vector_lanes == 4


def test_g3_softmax_block_per_row(full_size_programs):
    (k,) = full_size_programs("g3_softmax").kernels.values()
    # rows of 4096 floats: 256 threads x 4 vectors of 4, one block per row
    assert k.grid == (4096, 1, 1) and k.block == (256, 1, 1)
    ptx = k.ptx["sm_90"]
    assert ptx.count("ld.global.nc.v4") == 4 and ptx.count("st.global.v4") == 4  # read once
    assert "bar.sync" in ptx or "barrier.sync" in ptx


@pytest.mark.parametrize("name", G_NAMES)
def test_emulated_kernels_match_numpy_reference(name):
    graph = graphs(small=True)[name]
    exe = compile_cpu(graph)
    args = inputs_of(graph)
    program = compile_module(exe._source, lower=False)
    assert_close(emulate.run_program(program, args), graph.reference(*args))


@pytest.mark.parametrize("name", ["g4_layernorm", "g5_attention"])
def test_emulated_unfused_program_matches(name):
    graph = graphs(small=True)[name]
    exe = compile_cpu(graph, fusion=False)
    args = inputs_of(graph)
    program = compile_module(exe._source, lower=False)
    assert len(program.kernels) > 3
    assert_close(emulate.run_program(program, args), graph.reference(*args))


def _odd_cases():
    def ew(g):
        x, a = g.input("x", (7, 13)), g.input("a", (13,))
        g.output(g.tanh(x * a + 1.0))

    def flat(g):
        x = g.input("x", (1001,))
        g.output(g.relu(x) - x)

    def softmax_short(g):
        g.output(g.softmax(g.input("x", (5, 37))))

    def softmax_tail(g):  # 1028 = 2 chunks of 128 x 4, plus a partial third
        g.output(g.softmax(g.input("x", (9, 1028))))

    def softmax_streamed(g):  # 10000 vectors per row: a 1024-thread team loops over them
        g.output(g.softmax(g.input("x", (3, 40000))))

    def layernorm(g):
        x, w, b = g.input("x", (11, 130)), g.input("w", (130,)), g.input("b", (130,))
        g.output(g.layernorm(x, w, b))

    def colsum(g):
        g.output(g.sum(g.input("x", (6, 10)), axis=0))

    def matmul(g):
        x, w, b = g.input("x", (33, 17)), g.input("w", (17, 45)), g.input("b", (45,))
        g.output(g.gelu(g.matmul(x, w) + b))

    def transpose(g):
        g.output(g.exp(g.transpose(g.input("x", (12, 20)), (1, 0))))

    def two_outputs(g):
        x = g.input("x", (8, 16))
        e = g.exp(x)
        g.output(e + x, g.sum(e, axis=-1))

    def scores(g):
        q, k = g.input("q", (2, 3, 10, 8)), g.input("k", (2, 3, 12, 8))
        g.output(g.softmax(g.matmul(q, g.transpose(k, (0, 1, 3, 2)))))

    return [
        ew,
        flat,
        softmax_short,
        softmax_tail,
        softmax_streamed,
        layernorm,
        colsum,
        matmul,
        transpose,
        two_outputs,
        scores,
    ]


@pytest.mark.parametrize("build", _odd_cases(), ids=lambda f: f.__name__)
def test_emulated_tails_and_odd_shapes(build):
    g = Graph(build.__name__)
    build(g)
    args = [g.random_inputs(0)[t.name] for t in g.inputs]
    for fusion in (True, False):
        exe = compile_cpu(g, fusion=fusion)
        program = compile_module(exe._source, lower=False)
        for k in program.kernels.values():
            assert k.threads_per_block >= 32
        assert_close(emulate.run_program(program, args), g.reference(*args))


SLICE = """
func.func @slice(%x: tensor<16x40xf32>) -> tensor<8x12xf32> {
  %s = tensor.extract_slice %x[4, 3] [8, 12] [1, 3] : tensor<16x40xf32> to tensor<8x12xf32>
  %e = tensor.empty() : tensor<8x12xf32>
  %y = linalg.exp ins(%s : tensor<8x12xf32>) outs(%e : tensor<8x12xf32>) -> tensor<8x12xf32>
  return %y : tensor<8x12xf32>
}
"""


def test_strided_slice_is_address_arithmetic():
    import numpy as np

    import opfuse

    exe = opfuse.compile(SLICE, backend="cpu")
    x = np.random.default_rng(0).standard_normal((16, 40)).astype(np.float32)
    program = compile_module(exe._source, lower=False)
    (k,) = program.kernels.values()
    assert k.emitter == "loop"
    (got,) = emulate.run_program(program, [x])
    np.testing.assert_allclose(got, np.exp(x[4:12, 3:39:3]), rtol=1e-6)


def test_column_reduction_uses_the_fallback_with_a_reason():
    """Without opfuse-fuse-columns, a column reduction is a plain reduction group, which
    the rows emitter declines (saying why) and the fallback builds; with it (the default
    pipeline), even a lone one is a "columns" kernel."""
    import opfuse

    g = Graph("colsum")
    g.output(g.sum(g.input("x", (64, 48)), axis=0))
    plain = opfuse.Pipeline.default()
    plain.remove("opfuse-fuse-columns")
    program = compile_module(opfuse.compile(g, backend="cpu", pipeline=plain)._source,
                             lower=False)
    (k,) = program.kernels.values()
    assert k.emitter == "fallback" and k.block[0] >= 32
    assert any("column reduction" in n for n in program.notes)
    (k,) = compile_module(compile_cpu(g)._source, lower=False).kernels.values()
    assert k.emitter == "columns"


def test_kernel_ir_stage_is_readable_gpu_launch():
    g = Graph("chain")
    x, a = g.input("x", (64, 128)), g.input("a", (128,))
    g.output(g.relu(x * a))
    exe = compile_cpu(g)
    with pytest.raises(OpfuseError, match="no 'ptx' stage"):
        exe.ir("ptx")  # a cpu Executable compiles for the GPU only when asked
    program = exe.gpu_program()
    assert exe.stages == ("linalg", "fused", "kernels", "nvvm", "ptx")
    (row,) = exe.report["gpu"]["sm_90"]
    assert row["emitter"] == "loop" and row["block"] == [256, 1, 1]
    if program.ptxas:
        assert row["spill_stores"] == 0 and row["registers"] > 0
    text = exe.ir("kernels")
    assert "gpu.launch" in text and "vector.load" in text and "{alignment = 16 : i64}" in text
    assert ".entry fusion_0_loop_kernel(" in exe.ir("ptx")
    assert "llvm.func" in exe.ir("nvvm") or "nvvm" in exe.ir("nvvm")


def test_unknown_target_is_a_user_error():
    g = Graph("t")
    g.output(g.exp(g.input("x", (4, 4))))
    with pytest.raises(OpfuseError, match="unknown GPU target 'sm_75'"):
        compile_module(compile_cpu(g)._source, targets=("sm_75",))


def test_lowering_failure_names_the_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_DUMP_DIR", str(tmp_path))
    bad = (
        "module attributes {gpu.container_module} {\n gpu.module @k {\n"
        "  gpu.func @k(%a: memref<4xf32>) kernel {\n"
        "   %c = arith.constant 0 : index\n   %v = memref.load %a[%c] : memref<4xf32>\n"
        '   %w = "test.unknown_op"(%v) : (f32) -> f32\n   gpu.return\n  }\n }\n}\n'
    )
    with pytest.raises(OpfuseError) as e:
        nvptx.lower([("k", bad)], "sm_90")
    text = e.value.render()
    assert "reproduce with:" in text and "mlir-opt" in text


@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not installed")
def test_ptxas_failure_reports_command_and_log():
    with pytest.raises(OpfuseError) as e:
        ptxas.assemble(
            ".version 7.8\n.target sm_90\n.address_size 64\nthis is not ptx\n",
            "sm_90",
            name="broken",
        )
    text = e.value.render()
    assert "ptxas failed for kernel broken (sm_90)" in text
    assert "command:" in text and "-arch=sm_90" in text and "error" in text.lower()


def test_ptxas_verbose_parser():
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 64 bytes smem, 372 bytes cmem[0]\n"
    )
    (res,) = ptxas.parse_verbose(log, "sm_90").values()
    assert (res.registers, res.spill_stores, res.spill_loads, res.stack, res.smem, res.cmem) == (
        40,
        4,
        4,
        8,
        64,
        372,
    )


def test_lane_analysis():
    with ir.Context():
        d0, d1 = ir.AffineDimExpr.get(0), ir.AffineDimExpr.get(1)
        mod = ir.AffineExpr.get_mod
        div = ir.AffineExpr.get_floor_div
        assert analyze(d1, 1, 4).kind == Kind.CONTIG
        assert analyze(d0 * 4096 + d1, 1, 4).aligned
        assert analyze(mod(d1, 4096), 1, 4).kind == Kind.CONTIG  # column of a flat index
        assert analyze(div(d1, 4096), 1, 4).kind == Kind.INVARIANT  # its row
        assert analyze(mod(d1, 6), 1, 4).kind == Kind.OTHER  # rows of 6: lanes cross rows
        assert analyze(d1 * 64, 1, 4).kind == Kind.OTHER  # strided: gather
        assert not analyze(d1 + 1, 1, 4).aligned


def test_kernel_spec_json_round_trip():
    spec = KernelSpec(
        "fusion_0_loop",
        "fusion_0_loop_kernel",
        "loop",
        [("arg", 1), ("result", 0)],
        (8, 1, 1),
        (256, 1, 1),
        resources={"sm_90": {"registers": 20}},
    )
    back = KernelSpec.from_json(spec.to_json())
    assert back.params == spec.params and back.grid == spec.grid and back.block == spec.block
    assert back.resources == spec.resources


def test_outputs_are_fresh_arrays_even_when_an_input_is_returned():
    g = Graph("passthrough")
    x = g.input("x", (4, 8))
    g.output(x, g.exp(x))
    exe = compile_cpu(g)
    args = inputs_of(g)
    program = compile_module(exe._source, lower=False)
    outs = emulate.run_program(program, args)
    assert outs[0] is not args[0]
    assert_close(tuple(outs), as_tuple(g.reference(*args)))
