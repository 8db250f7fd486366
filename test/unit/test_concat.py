"""Concatenation end to end: ``Graph.concat`` (one ``tensor.concat``), its fusion, the CPU
backend, the GPU kernels (emulated, and assembled by ptxas), and torch's ``aten.cat``
(RoPE's ``rotate_half``, a Llama attention block) imported and emulated.

Numbers are checked against references: the builder's reference against
``np.concatenate`` (exactly: a concat only moves values); fused and unfused CPU programs
against the builder's numpy reference (f32: rtol 1e-5, atol 1e-6; f16: 2e-3; bf16: 1e-2);
emulated GPU kernels against the same reference (f32: rtol 1e-4, atol 1e-5, as
test_codegen.py) and imported torch models against eager (max error <= 1e-4 x max |eager|).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import opfuse
from opfuse.builder import Graph
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.gpu.compiler import compile_module
from opfuse.errors import OpfuseError
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

from test_codegen_common import assert_close, compile_cpu

HAVE_PTXAS = ptxas.find_ptxas() is not None
CPU_TOL = {"f32": (1e-5, 1e-6), "f16": (2e-3, 2e-3), "bf16": (1e-2, 1e-2)}


def _args(g: Graph, seed: int = 0) -> list[np.ndarray]:
    inputs = g.random_inputs(seed)
    return [inputs[t.name] for t in g.inputs]


def _three_way(axis: int, dtype: str = "f32", sizes=(3, 2, 5)) -> Graph:
    """Three inputs of unequal sizes along ``axis`` of a (5, 7, 9)-shaped result (10 along
    ``axis``), each from an elementwise producer, the concat read by an elementwise
    consumer."""
    g = Graph(f"cat{axis % 3}_{dtype}", dtype)
    shapes = []
    for n in sizes:
        s = [5, 7, 9]
        s[axis] = n
        shapes.append(tuple(s))
    a, b, c = (g.input(name, s) for name, s in zip("abc", shapes))
    y = g.concat([g.exp(a), -b, c * 2.0], axis)
    g.output(g.relu(y) + 1.0)
    return g


def _rope(d: int = 64, t: int = 16) -> Graph:
    """RoPE as the torch importer writes it: x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin."""
    from opfuse.frontends.torch.graph import TorchGraph

    g = TorchGraph(f"rope{d}")
    x, cos, sin = g.input("x", (2, 4, t, d)), g.input("cos", (t, d)), g.input("sin", (t, d))
    half = d // 2
    hi = g.slice(x, [0, 0, 0, half], [2, 4, t, d - half])
    lo = g.slice(x, [0, 0, 0, 0], [2, 4, t, half])
    g.output(x * cos + g.concat([-hi, lo], -1) * sin)
    return g


# --------------------------------------------------------------------------- the builder op


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_reference_is_numpy_concatenate(axis: int):
    g = Graph("cat")
    shapes = []
    for n in (1, 4, 3):  # sizes along the axis; (2, 3, 4) elsewhere
        shape = [2, 3, 4]
        shape[axis] = n
        shapes.append(shape)
    xs = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.output(g.concat(xs, axis))
    args = _args(g)
    (got,) = g.reference(*args)
    np.testing.assert_array_equal(got, np.concatenate(args, axis))


def test_ir_is_one_tensor_concat():
    g = Graph("cat_ir")
    a, b = g.input("a", (4, 3)), g.input("b", (4, 5))
    g.output(g.concat([a, b], -1, name="rot"))
    text = g.to_mlir()
    assert (
        "tensor.concat dim(1) %a, %b : (tensor<4x3xf32>, tensor<4x5xf32>) -> tensor<4x8xf32> "
        'loc("rot")'
    ) in text
    g.to_module()  # verifies


def test_single_tensor_is_itself_and_keepdims_are_materialized():
    g = Graph("cat_keep")
    x = g.input("x", (4, 6))
    assert g.concat([x], 1) is x
    m, s = g.max(x, -1, keepdims=True), g.sum(x, -1, keepdims=True)
    g.output(g.concat([m, s], -1))
    text = g.to_mlir()
    assert text.count("tensor.expand_shape") == 2 and "-> tensor<4x2xf32>" in text
    args = _args(g)
    (got,) = g.reference(*args)
    want = np.concatenate([args[0].max(-1, keepdims=True), args[0].sum(-1, keepdims=True)], -1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda g, x: g.concat([], 0), "at least one tensor"),
        (lambda g, x: g.concat([x, g.input("y", (4,))], 0), "one rank"),
        (lambda g, x: g.concat([x, g.input("y", (3, 6))], 1), r"differ off axis 1"),
        (lambda g, x: g.concat([x, g.input("y", (4, 6), "f16")], 0), "different dtypes"),
        (lambda g, x: g.concat([x, x], 2), "axis 2 out of range"),
    ],
)
def test_errors(build, message: str):
    g = Graph("bad")
    with pytest.raises(OpfuseError, match=message):
        build(g, g.input("x", (4, 6)))


# --------------------------------------------------------------------------- CPU backend


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_fused_unfused_and_numpy_agree_on_cpu(axis: int, dtype: str):
    g = _three_way(axis, dtype)
    args = _args(g)
    rtol, atol = CPU_TOL[dtype]
    want = g.reference(*args)
    fused = opfuse.compile(g, backend="cpu")
    for exe in (fused, opfuse.compile(g, backend="cpu", fusion=False)):
        if dtype == "bf16":  # bf16 crosses as uint16 bit patterns
            got = bf16_bits_to_float32(exe(*[float32_to_bf16_bits(a) for a in args]))
        else:
            got = exe(*args)
        assert_close(got, tuple(want), rtol=rtol, atol=atol)
    # producers, the concat and its consumers: one loop kernel
    assert fused.report["totals"]["after"]["kernels"] == 1


def _injective_step(exe) -> dict[str, str]:
    """producer -> reason of the producer-consumer pass's step 4 decisions."""
    return {
        d["producer"]: d["reason"]
        for d in exe.report["decisions"]
        if d["action"] == "merge into injective reader"
    }


def test_producers_join_the_concat_under_the_guard():
    decisions = _injective_step(opfuse.compile(_three_way(1), backend="cpu"))
    assert sorted(decisions) == ["exp", "mul", "neg"]
    assert all(r.startswith("saving") and "> delta" in r for r in decisions.values())
    # a producer of a tenth of the concat saves under delta of the kernel's bytes, but at
    # this size its launch is most of its time: the guard takes it for the launch, and
    # says so (at sizes where the bytes outweigh a launch it is refused: test_cost_guard)
    exe = opfuse.compile(_three_way(1, sizes=(4, 1, 5)), backend="cpu")
    # (the width-1 part reaches the concat through the reshape opfuse-fold-unit-dims adds)
    assert re.match(r"saving 0\.0\d <= delta 0\.10 in bytes, time saving 0\.\d\d > delta with 1 "
                    r"launch saved", _injective_step(exe)["neg"])
    assert exe.report["totals"]["after"]["kernels"] == 1


def test_rope_is_one_kernel_and_matches_numpy_on_cpu():
    g = _rope()
    args = _args(g)
    fused = opfuse.compile(g, backend="cpu")
    assert fused.report["totals"]["before"]["kernels"] == 7
    assert fused.report["totals"]["after"]["kernels"] == 1
    # read x, cos, sin once, write the result once: nothing in between goes to memory
    assert fused.report["totals"]["after"]["bytes"] == 4 * (2 * 2 * 4 * 16 * 64 + 2 * 16 * 64)
    for exe in (fused, opfuse.compile(g, backend="cpu", fusion=False)):
        assert_close(exe(*args), tuple(g.reference(*args)), *CPU_TOL["f32"])


def _rotary_tables(t: int = 16, d: int = 12) -> Graph:
    """Llama's rotary tables: angles = position x inverse frequency, concatenated with
    themselves along the last axis, then their cos and sin (d/2 = 6: a boundary that is not
    a multiple of 4 lanes)."""
    g = Graph("rotary")
    inv_freq = g.input("inv_freq", (1, d // 2))
    angles = g.iota((t, 1), 0) * inv_freq
    emb = g.concat([angles, angles], -1)
    g.output(g.cos(emb), g.sin(emb))
    return g


def test_rotary_tables_match_numpy():
    g = _rotary_tables()
    inv = (1.0 / 10000.0 ** (np.arange(0, 12, 2) / 12)).astype(np.float32)[None, :]
    angles = np.arange(16, dtype=np.float64)[:, None] * inv
    emb = np.concatenate([angles, angles], -1)
    got = g.reference(inv)
    np.testing.assert_allclose(got[0], np.cos(emb), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], np.sin(emb), rtol=1e-6, atol=1e-6)
    for fusion in (True, False):
        assert_close(opfuse.compile(g, backend="cpu", fusion=fusion)(inv), tuple(got))


# --------------------------------------------------------------------------- GPU kernels


def _emulate(g: Graph, fusion: bool = True):
    exe = compile_cpu(g, fusion=fusion)
    program = compile_module(exe._source, lower=False)
    assert program.kernels and not program.notes  # every group had its kind's emitter
    args = _args(g)
    assert_close(emulate.run_program(program, args), tuple(g.reference(*args)))
    return program


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_emulated_kernels_match_numpy(axis: int, fusion: bool):
    program = _emulate(_three_way(axis), fusion)
    if fusion:
        assert [k.emitter for k in program.kernels.values()] == ["loop"]


def _pair(widths: tuple[int, ...], rows: int = 6) -> Graph:
    g = Graph("cat_" + "_".join(map(str, widths)))
    xs = [g.input(f"x{i}", (rows, w)) for i, w in enumerate(widths)]
    g.output(g.concat([g.exp(xs[0]), *xs[1:]], -1) * 2.0)
    return g


def test_vector_inside_one_input_branches_once_per_thread():
    """Widths 4 and 12: every 4-lane vector lies in one input; one scf.if picks it and
    each branch loads one aligned vector."""
    program = _emulate(_pair((4, 12)))
    (k,) = program.kernels.values()
    assert k.vector_lanes == 4
    assert "scf.if" in program.kernels_ir and "-> (vector<4xf32>)" in program.kernels_ir
    assert "vector.from_elements" not in program.kernels_ir


@pytest.mark.parametrize("widths", [(3, 5), (1, 2, 5), (5, 6, 1), (2, 2)])
def test_boundary_inside_a_vector_is_picked_per_lane(widths):
    """A boundary that is not a multiple of the 4 lanes: each lane reads its own input,
    in bounds (the emulator raises on any out-of-bounds load)."""
    program = _emulate(_pair(widths))
    (k,) = program.kernels.values()
    if k.vector_lanes > 1 and any(sum(widths[:i]) % k.vector_lanes for i in range(len(widths))):
        assert "vector.from_elements" in program.kernels_ir


@pytest.mark.parametrize("fusion", [True, False])
def test_emulated_rotary_tables_match_numpy(fusion: bool):
    _emulate(_rotary_tables(), fusion)


@pytest.mark.parametrize("fusion", [True, False])
def test_emulated_rope_matches_numpy(fusion: bool):
    program = _emulate(_rope(d=8), fusion)
    if fusion:
        assert len(program.kernels) == 1


def _in_other_kernels() -> dict[str, Graph]:
    graphs = {}
    g = graphs["softmax_of_cat"] = Graph("softmax_of_cat")
    a, b = g.input("a", (6, 13)), g.input("b", (6, 19))
    g.output(g.softmax(g.concat([a, g.exp(b)], -1)))
    g = graphs["layernorm_of_rows"] = Graph("layernorm_of_rows")
    a, b = g.input("a", (5, 32)), g.input("b", (3, 32))
    g.output(g.layernorm(g.concat([a, b * 2.0], 0)))
    g = graphs["matmul_lhs"] = Graph("matmul_lhs")
    a, b, w = g.input("a", (5, 24)), g.input("b", (11, 24)), g.input("w", (24, 20))
    g.output(g.relu(g.concat([a, b], 0) @ w))
    g = graphs["matmul_rhs"] = Graph("matmul_rhs")
    x, w1, w2 = g.input("x", (16, 24)), g.input("w1", (24, 6)), g.input("w2", (24, 10))
    g.output(x @ g.concat([w1, g.tanh(w2)], 1))
    g = graphs["cat_of_matmul"] = Graph("cat_of_matmul")
    x, w, y = g.input("x", (16, 24)), g.input("w", (24, 8)), g.input("y", (16, 5))
    g.output(g.concat([x @ w, y], 1))
    g = graphs["transposed"] = Graph("transposed")
    a, b = g.input("a", (3, 8)), g.input("b", (5, 8))
    g.output(g.transpose(g.concat([a, g.exp(b)], 0), (1, 0)) * 2.0)
    g = graphs["reshaped"] = Graph("reshaped")  # lanes of 2 across rows of 3: a gather
    a, b = g.input("a", (8, 1)), g.input("b", (8, 2))
    g.output(g.reshape(g.concat([a, g.exp(b)], 1), (4, 6)) * 2.0)
    g = graphs["iota_i64"] = Graph("iota_i64")
    g.output(g.concat([g.iota((2, 3), 1, dtype="i64"), g.iota((2, 5), 1, start=7, dtype="i64")], 1))
    return graphs


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("name", list(_in_other_kernels()))
def test_concat_in_row_matmul_and_gathered_kernels(name: str, fusion: bool):
    """A concat read by a row kernel, as a matmul operand (staged through the evaluator,
    whose address probe sees through it), after a matmul, through a transpose (the axis
    index is a gather), and of integers: no emitter falls back."""
    _emulate(_in_other_kernels()[name], fusion)


def test_matmul_stages_a_concatenated_operand_with_vector_loads():
    """The matmul emitter's address probe sees through the concat: both inputs are
    consecutive along K, so each is staged with 16-byte vector loads."""
    program = _emulate(_in_other_kernels()["matmul_lhs"])
    staged = re.findall(r"vector\.load %\w+\[.*\] .*: memref<(\d+)xf32>", program.kernels_ir)
    assert {"120", "264"} <= set(staged)  # a (5 x 24) and b (11 x 24)


@pytest.mark.parametrize(
    "make",
    [lambda: _three_way(2), lambda: _pair((3, 5)), _rope, _rotary_tables],
    ids=["three", "odd", "rope", "rotary"],
)
def test_kernels_lower_to_ptx_without_spills(make):
    program = compile_module(compile_cpu(make())._source, targets=("sm_90",))
    assert program.kernels and not program.notes
    for k in program.kernels.values():
        ptx = k.ptx["sm_90"]
        assert f".entry {k.entry}(" in ptx
        if HAVE_PTXAS:
            res = k.resources["sm_90"]
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, res)


# --------------------------------------------------------------------------- torch


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.parametrize("name", ["rope", "llama_attention", "cat_axes"])
def test_emulated_kernels_of_imported_models_match_eager(name: str):
    torch = pytest.importorskip("torch")
    import torch_models as tm
    from opfuse.frontends.torch.importer import import_module

    factory, make_inputs = tm.CONCAT[name]
    torch.manual_seed(0)
    model, inputs = factory().eval(), make_inputs()
    with torch.no_grad():
        want = torch.utils._pytree.tree_flatten(model(*inputs))[0]
    imported = import_module(model, inputs)
    exe = compile_cpu(imported.graph)
    program = compile_module(exe._source, targets=("sm_90",))
    assert not program.notes
    if HAVE_PTXAS:  # the PTX a GPU would launch assembles, without spills
        for k in program.kernels.values():
            res = k.resources["sm_90"]
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, res)
    got = emulate.run_program(program, imported.arguments(*inputs))
    got = got if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.numpy()
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max()
    if name == "rope":
        assert len(program.kernels) == 1
    if name == "rope":  # head dim 64: each vector in one half
        assert re.search(r"scf.if .* -> \(vector<4xf32>\)", program.kernels_ir)
    if name == "llama_attention":
        # the rotary embedding (rotate_half's concat and negation) is the attention
        # kernel's prologue, since the attention pass takes pointwise producers of Q and K
        # in: no loop kernel of its own is left to vectorize
        (att,) = [k["members"] for k in exe.report["kernels"] if k["kind"] == "attention"]
        assert any(m.startswith("cat") for m in att) and any(m.startswith("neg") for m in att)
        assert [k.emitter for k in program.kernels.values()].count("loop") <= 1
