"""Tests of the graph builder (opfuse.builder) and the G1–G8 graphs.

Numbers are checked against ``Graph.reference`` (numpy, independent of the MLIR) by running
the builder's IR through the upstream CPU lowering and ExecutionEngine (``_run_cpu``).
Tolerances: f32 rtol 1e-4 / atol 1e-5; f16 rtol 1e-2 / atol 1e-2 (the IR accumulates
reductions in f16 while the reference rounds an exact sum once).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
from pathlib import Path

import numpy as np
import pytest

import mlir
from mlir import ir
from mlir import runtime as rt
from mlir.execution_engine import ExecutionEngine
from mlir.passmanager import PassManager

from opfuse.builder import DTYPES, Graph
from opfuse.errors import OpfuseError
from opfuse.frontends.builder.graph import round_to_dtype
from opfuse.frontends.builder.graphs import example_inputs, graphs
from opfuse.ir import load, make_context

ROOT = Path(__file__).resolve().parents[2]
TOL = {"f32": dict(rtol=1e-4, atol=1e-5), "f16": dict(rtol=1e-2, atol=1e-2)}

# The lowering from notes/toolchain.md plus convert-bufferization-to-memref (returned
# aliases become bufferization.clone) and convert-math-to-libm (math.erf has no LLVM
# intrinsic).
CPU_PIPELINE = (
    "builtin.module(one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},buffer-deallocation-pipeline,"
    "convert-bufferization-to-memref,convert-linalg-to-loops,lower-affine,convert-scf-to-cf,"
    "expand-strided-metadata,finalize-memref-to-llvm,convert-math-to-llvm,convert-math-to-libm,"
    "convert-arith-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,reconcile-unrealized-casts)"
)
_RUNNER_LIBS = glob.glob(os.path.join(mlir.__path__[0], "lib", "libmlir_c_runner_utils.so*"))
_NP = {"f32": np.float32, "f16": np.float16}


def _lower(g: Graph) -> tuple[ir.Context, ir.Module]:
    ctx = make_context()
    module = g.to_module(ctx)
    with ctx:
        for op in module.body.operations:
            op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        PassManager.parse(CPU_PIPELINE).run(module.operation)
    return ctx, module


def _run_cpu(g: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Compile ``g``'s MLIR for the host and run it (the results struct is the first arg)."""
    ctx, module = _lower(g)
    with ctx:
        engine = ExecutionEngine(module, opt_level=2, shared_libs=_RUNNER_LIBS)
    fields = []
    for i, t in enumerate(g.outputs):
        ctype = rt.as_ctype(np.dtype(_NP[t.dtype]))
        desc = (
            rt.make_nd_memref_descriptor(t.ndim, ctype)
            if t.ndim
            else rt.make_zero_d_memref_descriptor(ctype)
        )
        fields.append((f"r{i}", desc))
    results = type("Results", (ctypes.Structure,), {"_fields_": fields})()
    arrays = [np.ascontiguousarray(inputs[t.name], _NP[t.dtype]) for t in g.inputs]
    args = [ctypes.pointer(ctypes.pointer(rt.get_ranked_memref_descriptor(a))) for a in arrays]
    engine.invoke(g.name, ctypes.pointer(ctypes.pointer(results)), *args)
    outs = []
    for i, t in enumerate(g.outputs):
        d = getattr(results, f"r{i}")
        if t.ndim == 0:
            outs.append(rt.to_numpy(np.ctypeslib.as_array(d.aligned, shape=(1,))).reshape(()))
        else:
            outs.append(rt.ranked_memref_to_numpy([d]))
    return [o.copy() for o in outs]


def _check_cpu(g: Graph, inputs: dict[str, np.ndarray] | None = None) -> None:
    inputs = g.random_inputs() if inputs is None else inputs
    got, want = _run_cpu(g, inputs), g.reference(**inputs)
    assert len(got) == len(want)
    for t, a, b in zip(g.outputs, got, want):
        assert a.shape == b.shape == t.shape and a.dtype == b.dtype, t.name
        np.testing.assert_allclose(a.astype(np.float64), b, err_msg=t.name, **TOL[t.dtype])


def _every_op(dtype: str) -> Graph:
    g = Graph("every_op", dtype=dtype)
    x, a = g.input("x", (4, 6)), g.input("a", (6,))
    col, p = g.input("col", (4, 1)), g.input("p", (4, 6))  # p: positive, for log/sqrt/pow
    b3 = g.input("b3", (2, 3, 4))
    q, k = g.input("q", (2, 3, 4, 5)), g.input("k", (2, 3, 5, 4))
    pos = g.add(g.mul(p, p), 0.5)
    g.output(x + a, x - col, x * 2.0, 1.0 / pos, -x, 3.0 - x, g.maximum(x, a), g.minimum(x, col))
    g.output(g.exp(x), g.log(pos), g.tanh(x), g.erf(x), g.sigmoid(x), g.relu(x), g.silu(x))
    g.output(g.gelu(x), g.gelu(x, approximate="none"), g.rsqrt(pos), g.sqrt(pos), x**2)
    g.output(g.pow(pos, 1.5), g.broadcast_to(a, (4, 6)), g.broadcast_to(col, (4, 6)))
    g.output(g.transpose(x, (1, 0)), g.reshape(x, (24,)), g.reshape(x, (2, 2, 6)))
    g.output(g.reshape(x, (6, 4)), g.sum(x, 0), g.max(x, 1), g.mean(x), g.mean(b3, axis=(1, 2)))
    g.output(g.sum(b3, (0, 2), keepdims=True), g.max(x, -1, keepdims=True))
    g.output(g.matmul(x, g.transpose(x, (1, 0))), g.matmul(b3, g.transpose(b3, (0, 2, 1))), q @ k)
    g.output(g.softmax(x), g.softmax(x, axis=0), g.layernorm(x, a, a), g.rms_norm(x, a))
    return g


# --------------------------------------------------------------------------- IR validity


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_verifies_and_lowers(dtype: str) -> None:
    g = _every_op(dtype)
    text = g.to_mlir()
    assert text.count("func.func @every_op(") == 1
    _lower(g)  # parses, verifies, and goes all the way to the LLVM dialect
    if dtype != "f32":
        # transcendental ops computed in f32 inside the body
        assert "arith.extf" in text and "math.tanh" in text and "arith.truncf" in text
        assert not re.search(rf"math\.\w+ %\d+ : {dtype}", text)


def test_every_op_numbers_f32() -> None:
    _check_cpu(_every_op("f32"))


def test_f16_end_to_end() -> None:
    g = Graph("f16_mix", dtype="f16")
    x, a = g.input("x", (8, 16)), g.input("a", (16,))
    g.output(g.gelu(x * a + 0.25), g.softmax(x), g.layernorm(x, a, a))
    _check_cpu(g)


def test_reference_is_numpy() -> None:
    g = Graph("r")
    x, a = g.input("x", (3, 5)), g.input("a", (5,))
    g.output(g.softmax(x), g.layernorm(x, a, a), g.gelu(x, "none"), g.sigmoid(x))
    xs, av = g.random_inputs(3).values()
    sm, ln, ge, sg = g.reference(xs, av)
    e = np.exp(xs - xs.max(-1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=1e-6)
    mu, var = xs.mean(-1, keepdims=True), xs.var(-1, keepdims=True)
    np.testing.assert_allclose(ln, (xs - mu) / np.sqrt(var + 1e-5) * av + av, rtol=1e-5)
    from math import erf

    want = [[0.5 * v * (1 + erf(v / 2**0.5)) for v in row] for row in xs]
    np.testing.assert_allclose(ge, want, rtol=1e-6)
    np.testing.assert_allclose(sg, 1 / (1 + np.exp(-xs)), rtol=1e-6)


def test_bf16_reference_rounds() -> None:
    v = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.14159])
    np.testing.assert_array_equal(round_to_dtype(v, "bf16"), [1.0, 1.0 + 2**-6, 3.140625])
    g = Graph("b", dtype="bf16")
    x = g.input("x", (4,))
    g.output(x * 3.0)
    (out,) = g.reference(x=np.array([1.0, 2.0, 3.0, 1.0 + 2**-7]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, round_to_dtype([3.0, 6.0, 9.0, 3.0 + 3 * 2**-7], "bf16"))


# --------------------------------------------------------------------------- conventions


def _generics(text: str) -> list[str]:
    return [line for line in text.splitlines() if "linalg.generic" in line]


@pytest.mark.parametrize(
    "xs, ys, map_y",
    [
        ((4, 8), (8,), "(d0, d1) -> (d1)"),
        ((4, 8), (4, 1), "(d0, d1) -> (d0, 0)"),
        ((4, 1), (1, 8), "(d0, d1) -> (0, d1)"),
        ((2, 3, 4), (3, 1), "(d0, d1, d2) -> (d1, 0)"),
        ((1, 8), (8,), "(d0, d1) -> (d1)"),
        ((5,), (2, 3, 5), "(d0, d1, d2) -> (d0, d1, d2)"),
    ],
)
def test_broadcasting_matches_numpy(xs: tuple, ys: tuple, map_y: str) -> None:
    g = Graph("bc")
    x, y = g.input("x", xs), g.input("y", ys)
    z = x * y
    assert z.shape == np.broadcast_shapes(xs, ys)
    g.output(z)
    (gen,) = _generics(g.to_mlir())
    assert f"affine_map<{map_y}>" in gen
    assert '"reduction"' not in gen
    inputs = g.random_inputs()
    np.testing.assert_allclose(g.reference(**inputs)[0], inputs["x"] * inputs["y"], rtol=1e-6)
    _check_cpu(g)


def test_scalars_are_constants_in_the_body() -> None:
    g = Graph("s")
    x = g.input("x", (4, 4))
    g.output(2.5 - x * 1e-5)
    text = g.to_mlir()
    assert text.count("linalg.generic") == 2
    body_consts = re.findall(r"^\s{6}%\d+ = arith.constant (\S+) : f32$", text, re.M)
    assert body_consts == ["1.0e-05", "2.5"]
    assert not re.search(r"^\s{4}%\d+ = arith.constant", text, re.M)  # none at function level
    assert text.count("ins(%") == 2  # one tensor input each, no scalar tensors


def test_reduction_form_and_neg_inf() -> None:
    g = Graph("red")
    x = g.input("x", (4, 6, 8))
    g.output(g.max(x, axis=(0, 2)), g.sum(x, 1))
    text = g.to_mlir()
    assert "arith.constant 0xFF800000 : f32" in text
    assert "arith.constant 0.0 : f32" in text and text.count("linalg.fill") == 2
    assert 'iterator_types = ["reduction", "parallel", "reduction"]' in text
    assert "affine_map<(d0, d1, d2) -> (d1)>" in text
    assert "affine_map<(d0, d1, d2) -> (d0, d2)>" in text
    for dtype, pattern in [("f16", "0xFC00 : f16"), ("bf16", "0xFF80 : bf16")]:
        h = Graph("red", dtype=dtype)
        h.output(h.max(h.input("x", (4, 6)), 1))
        assert pattern in h.to_mlir()


def test_lazy_keepdims() -> None:
    g = Graph("k")
    x = g.input("x", (4, 8))
    m0 = g.max(x, 0, keepdims=True)
    m1 = g.mean(x, -1, keepdims=True)
    assert m0.shape == (1, 8) and m1.shape == (4, 1)
    assert (m1 * 2.0).shape == (4, 1)  # elementwise on a pending keepdims stays pending
    g.output(x - m0, x / (m1 * 2.0))
    text = g.to_mlir()
    assert "expand_shape" not in text
    assert "affine_map<(d0, d1) -> (d1)>" in text and "affine_map<(d0, d1) -> (d0)>" in text
    _check_cpu(g)

    for name, gr in graphs(small=True).items():
        if name in ("g3_softmax", "g4_layernorm", "g7_rmsnorm_swiglu", "g8_x_minus_mean"):
            assert "expand_shape" not in gr.to_mlir(), name


def test_keepdims_materialized_for_outputs_and_matmul() -> None:
    g = Graph("k")
    x = g.input("x", (4, 8))
    s = g.sum(x, 1, keepdims=True)
    g.output(s, g.matmul(s, g.sum(x, 0, keepdims=True)))
    text = g.to_mlir()
    assert text.count("tensor.expand_shape") == 2  # s once (shared), the row sum once
    assert "[[0, 1]] output_shape [4, 1] : tensor<4xf32> into tensor<4x1xf32>" in text
    _check_cpu(g)


def test_composites_are_chains() -> None:
    g = Graph("c")
    x = g.input("x", (4, 8))
    g.output(g.gelu(x))
    text = g.to_mlir()
    assert len(_generics(text)) == 8 and "math.tanh" in text
    assert len(re.findall(r'loc\("gelu\.', text)) == 16  # 8 generics + their tensor.empty
    g = Graph("c")
    g.output(g.softmax(g.input("x", (4, 8))))
    locs = re.findall(r'\} -> tensor<[^>]*> loc\("([^"]+)"\)', g.to_mlir())
    want = ["softmax.max", "softmax.sub", "softmax.exp", "softmax.sum", "softmax.div"]
    assert [n for n in locs if "." in n] == want


def test_names_and_locations() -> None:
    g = Graph("n")
    x = g.input("x", (4, 8))
    y = g.add(x, 1.0, name="x.add")
    with g.scope("blk"):
        z = g.tanh(y) * y
    g.output(z, g.tanh(x), g.tanh(x))
    assert (y.name, z.name) == ("x.add", "blk.mul")
    text = g.to_mlir()
    locs = re.findall(r'\} -> tensor<[^>]*> loc\("([^"]+)"\)', text)
    assert locs == ["x.add", "blk.tanh", "blk.mul", "tanh", "tanh_1"]
    assert '%x: tensor<4x8xf32> loc("x")' in text and '} loc("n")' in text


def test_data_movement_ops() -> None:
    g = Graph("dm")
    x, v = g.input("x", (2, 3, 4, 5), "f32"), g.input("v", (5,))
    g.output(g.reshape(x, (6, 20)), g.reshape(x, (2, 3, 2, 2, 5)), g.reshape(x, (3, 40)))
    g.output(g.reshape(x, (-1, 5)), g.broadcast_to(v, (3, 5)), g.transpose(x, (0, 2, 1, 3)))
    text = g.to_mlir()
    assert "tensor.collapse_shape %x [[0, 1], [2, 3]]" in text
    assert "tensor.collapse_shape %x [[0, 1, 2], [3]]" in text  # (-1, 5)
    assert "tensor.expand_shape %x [[0], [1], [2, 3], [4]]" in text
    assert "tensor.reshape %x(" in text and "dense<[3, 40]> : tensor<2xi64>" in text
    assert "linalg.broadcast" in text and "dimensions = [0]" in text
    assert "linalg.transpose" in text and "permutation = [0, 2, 1, 3]" in text
    _check_cpu(g)


def test_matmul_forms() -> None:
    g = Graph("mm")
    a, b = g.input("a", (2, 3, 4, 5)), g.input("b", (2, 3, 5, 6))
    c = a @ b
    assert c.shape == (2, 3, 4, 6)
    g.output(c)
    text = g.to_mlir()
    assert "linalg.batch_matmul" in text and text.count("tensor.collapse_shape") == 2
    assert "tensor.expand_shape" in text and "linalg.fill" in text


# --------------------------------------------------------------------------- G graphs


@pytest.mark.parametrize("name", list(graphs(small=True)))
def test_small_g_graph_on_cpu(name: str) -> None:
    g = graphs(small=True)[name]
    _check_cpu(g, example_inputs(g))


def test_g_graph_shapes() -> None:
    gs = graphs()
    assert [n.split("_")[0] for n in gs] == [f"g{i}" for i in range(1, 9)]
    assert [(ROOT / "examples" / f"{n}.mlir").exists() for n in gs] == [True] * 8
    assert [t.shape for t in gs["g5_attention"].inputs] == [(8, 8, 512, 64)] * 3
    assert gs["g6_encoder_layer"].outputs[0].shape == (8, 256, 512)
    assert gs["g7_rmsnorm_swiglu"].outputs[0].shape == (4096, 1024)
    small = graphs(small=True)["g6_encoder_layer"]
    assert "tensor<1x8x32x8xf32>" in small.to_mlir()  # 8 heads kept at 1/8 scale


def test_examples_are_current_and_parse() -> None:
    spec = importlib.util.spec_from_file_location("make_graphs", ROOT / "examples/make_graphs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0
    for path in sorted((ROOT / "examples").glob("g[1-8]_*.mlir")):
        text = path.read_text()
        assert text.startswith("// G") and "generated by examples/make_graphs.py" in text
        load(path)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda g: g.input("x", (4, 8)) + g.input("y", (4, 7)), "cannot be broadcast"),
        (lambda g: g.matmul(g.input("x", (4, 8)), g.input("y", (7, 4))), "do not match"),
        (lambda g: g.matmul(g.input("x", (4, 8)), g.input("y", (2, 8, 4))), "2-D, 3-D or 4-D"),
        (lambda g: g.reshape(g.input("x", (4, 8)), (5, 6)), "cannot reshape"),
        (lambda g: g.broadcast_to(g.input("x", (4, 8)), (8, 8)), "cannot broadcast"),
        (lambda g: g.transpose(g.input("x", (4, 8)), (0, 0)), "not a permutation"),
        (lambda g: g.sum(g.input("x", (4, 8)), 2), "out of range"),
        (lambda g: g.input("x", (4, 8), "f64"), "unknown dtype 'f64'"),
        (lambda g: g.input("x", (4, 8)) + g.input("y", (4, 8), "f16"), "different dtypes"),
        (lambda g: g.input("x", (4, 0)), "static positive dims"),
        (lambda g: g.input("x", (4,)) + Graph("other").input("y", (4,)), "belongs to graph"),
        (lambda g: g.gelu(g.input("x", (4,)), approximate="fast"), "approximate"),
        (lambda g: g.tanh(g.input("x", (4,)), name='a"b'), "invalid op name"),
        (lambda g: g.to_mlir(), "has no outputs"),
    ],
)
def test_errors(build, message: str) -> None:
    with pytest.raises(OpfuseError, match=message):
        build(Graph("e"))


def test_error_unknown_graph_dtype_and_bad_reference_inputs() -> None:
    with pytest.raises(OpfuseError, match="unknown dtype 'fp8'"):
        Graph("e", dtype="fp8")
    g = Graph("e")
    g.output(g.exp(g.input("x", (2, 3))))
    with pytest.raises(OpfuseError, match=r"has shape \(3, 2\), expected \(2, 3\)"):
        g.reference(x=np.zeros((3, 2)))
    with pytest.raises(OpfuseError, match="missing inputs"):
        g.reference(y=np.zeros((2, 3)))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_sums_and_matmuls_accumulate_in_f32(dtype):
    """Regression: sums and matmuls accumulated in the tensor's dtype; in bf16, 256 + 1
    rounds back to 256, so the sum of 1024 ones came out as 256. They now accumulate in f32
    and round once (1024 is exact in both dtypes)."""
    import opfuse
    from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

    g = Graph("acc", dtype=dtype)
    x = g.input("x", (1, 1024))
    w = g.input("w", (1024, 1))
    g.output(g.sum(x, axis=-1), g.matmul(x, w))
    ones = [np.ones((1, 1024), np.float32), np.ones((1024, 1), np.float32)]
    args = [float32_to_bf16_bits(a) if dtype == "bf16" else a.astype(np.float16) for a in ones]
    outs = opfuse.compile(g, backend="cpu")(*args)
    values = [bf16_bits_to_float32(o) if dtype == "bf16" else o for o in outs]
    assert [float(v.ravel()[0]) for v in values] == [1024.0, 1024.0]


# --------------------------------------------------------------------------- masks


def _mask_ops() -> Graph:
    """Every comparison, where, logical op, iota, full and cast, broadcasting like the
    arithmetic ops; inputs: x (4, 6), a (6,), col (4, 1) float, m (4, 6) i8, n (6,) i64."""
    g = Graph("masks")
    x, a, col = g.input("x", (4, 6)), g.input("a", (6,)), g.input("col", (4, 1))
    m, n = g.input("m", (4, 6), "i8"), g.input("n", (6,), "i64")
    g.output(g.eq(x, a), g.ne(x, col), g.lt(x, 0.25), g.le(a, x), g.gt(col, a), g.ge(x, -0.5))
    g.output(g.eq(m, 1), g.lt(n, g.iota((4, 6), 1, dtype="i64")), g.ge(n, -1))
    g.output(g.where(m, x, a), g.where(g.gt(x, 0.0), x, 0.1), g.where(g.lt(col, 0.0), -2.0, 3.0))
    g.output(g.where(m, n, 7), g.where(g.le(x, a), float("-inf"), x))
    g.output(g.where(g.lt(col, 0.0), float("inf"), float("nan")))  # bit-pattern constants
    g.output(g.logical_not(m), g.logical_not(x), g.logical_and(m, g.gt(x, 0.0)))
    g.output(g.logical_or(g.lt(a, 0.0), m), g.logical_and(x, n))
    g.output(
        g.iota((4, 6), 0), g.iota((6,), 0, start=1.0, step=0.5), g.iota((4, 6), -1, dtype="f16")
    )
    g.output(g.iota((2, 3), 1, start=-3, step=2, dtype="i64"), g.full((4, 6), 2.5) * x)
    g.output(g.cast(m, "f32"), g.cast(n, "f32"), g.cast(m, "i64"), g.cast(x, "i8"))
    g.output(g.cast(col * 4.0, "i64"), g.cast(x, "f16"), g.cast(g.cast(x, "bf16"), "f16"))
    g.output(g.cast(g.cast(x, "f16"), "f32"), g.cast(n, "i8"), g.cast(n, "bf16"))
    g.output(n + n, n - 3, n * n, g.neg(n), g.relu(n), g.maximum(n, 0), g.minimum(n, 2))
    g.output(g.broadcast_to(m, (2, 4, 6)), g.reshape(n, (2, 3)), g.transpose(m, (1, 0)))
    return g


def _mask_inputs(g: Graph) -> dict[str, np.ndarray]:
    inputs = g.random_inputs(1)
    inputs["x"][1, 2] = inputs["a"][3] = np.nan  # comparisons with NaN, like torch
    inputs["x"][0, :] = inputs["a"]  # some equal pairs
    inputs["n"] = np.array([-3, -1, 0, 1, 2, 5], np.int64)
    return inputs


def test_mask_ops_reference_is_numpy() -> None:
    g = _mask_ops()
    inputs = _mask_inputs(g)
    x, a, col, m, n = (inputs[k].astype(np.float64) for k in ("x", "a", "col", "m", "n"))
    b, cols = m != 0, np.broadcast_to(np.arange(6), (4, 6))

    def f16(v):
        return round_to_dtype(v, "f16")

    def bf16(v):
        return round_to_dtype(v, "bf16")

    want = [
        x == a,
        x != col,
        x < 0.25,
        a <= x,
        col > a,
        x >= -0.5,
        b,
        n < cols,
        n >= -1,
        np.where(b, x, a),
        np.where(x > 0, x, np.float32(0.1)),
        np.where(col < 0, -2.0, 3.0),
        np.where(b, n, 7),
        np.where(x <= a, -np.inf, x),
        np.where(col < 0, np.inf, np.nan),
        ~b,
        x == 0,
        b & (x > 0),
        (a < 0) | b,
        (x != 0) & (n != 0),
        np.broadcast_to(np.arange(4)[:, None], (4, 6)),
        1 + 0.5 * np.arange(6),
        cols,
        np.broadcast_to(-3 + 2 * np.arange(3), (2, 3)),
        np.float32(2.5) * x,
        b,
        n,
        b,
        x != 0,
        np.trunc(col * np.float32(4)),
        f16(x),
        f16(bf16(x)),
        f16(x),
        n != 0,
        n,
        2 * n,
        n - 3,
        n * n,
        -n,
        np.maximum(n, 0),
        np.maximum(n, 0),
        np.minimum(n, 2),
        np.broadcast_to(b, (2, 4, 6)),
        n.reshape(2, 3),
        b.T,
    ]
    got = g.reference(**inputs)
    assert len(got) == len(want)
    for t, r, w in zip(g.outputs, got, want):
        assert (
            r.dtype
            == {
                "f32": np.float32,
                "f16": np.float16,
                "i8": np.int8,
                "i64": np.int64,
                "bf16": np.float32,
            }[t.dtype]
        ), t.name
        np.testing.assert_allclose(
            r.astype(np.float64), np.asarray(w, np.float64), rtol=1e-6, err_msg=t.name
        )


def test_mask_ops_fused_unfused_and_numpy_agree_on_cpu() -> None:
    import opfuse

    g = _mask_ops()
    inputs = _mask_inputs(g)
    want = g.reference(**inputs)
    args = [inputs[t.name] for t in g.inputs]
    for fusion in (True, False):
        got = opfuse.compile(g, backend="cpu", fusion=fusion)(*args)
        for t, r, w in zip(g.outputs, got, want):
            if t.dtype == "bf16":  # the CPU backend hands bf16 back as its bits
                from opfuse.runtime.schedule import bf16_bits_to_float32

                r = bf16_bits_to_float32(r)
            assert r.dtype == w.dtype and r.shape == w.shape, t.name
            if t.dtype in ("i8", "i64"):
                np.testing.assert_array_equal(r, w, err_msg=f"{t.name} fusion={fusion}")
            else:
                np.testing.assert_allclose(
                    r,
                    w,
                    rtol=1e-3 if t.dtype == "f16" else 1e-6,
                    err_msg=f"{t.name} fusion={fusion}",
                )


def test_booleans_are_i8_never_i1_tensors() -> None:
    g = Graph("b")
    x = g.input("x", (4, 8))
    keep = g.gt(x, 0.0)
    assert keep.dtype == "i8"
    g.output(g.where(keep, x, g.full((), float("-inf"))), keep, g.logical_not(keep))
    text = g.to_mlir()
    assert "xi1>" not in text and "tensor<4x8xi8>" in text
    assert "arith.cmpf ogt" in text and "arith.extui %" in text and ": i1 to i8" in text
    assert "arith.cmpi ne" in text and "arith.select" in text  # where: i8 -> i1 -> select
    assert "arith.constant 0xFF800000 : f32" in text  # the full(-inf) is a body constant
    assert text.count("linalg.generic") == 3  # gt, where, logical_not: the full is folded


def test_iota_is_a_generic_with_no_inputs_classified_elementwise() -> None:
    from opfuse.analysis.opinfo import OpKind, describe_all

    g = Graph("i")
    x = g.input("x", (4, 8))
    g.output(x + g.iota((8,), 0), g.full((4, 8), 3.0, dtype="f32"))
    text = g.to_mlir()
    (iota,) = [gen for gen in text.split("linalg.generic")[1:] if "linalg.index" in gen]
    header, body = iota.split("^bb0")
    assert "ins(" not in header and "outs(" in header  # no inputs
    # read through a broadcast, the (8,) iota is built in the add's (4, 8) shape, axis 1
    assert "tensor<4x8xf32>" in header and "linalg.index 1 : index" in body
    assert "arith.index_cast" in body and "arith.sitofp" in body
    module = g.to_module()
    func = module.body.operations[0]
    ops = [op for op in func.regions[0].blocks[0].operations if op.name == "linalg.generic"]
    kinds = [info.kind for info in describe_all(func, ops)]
    assert kinds == [OpKind.ELEMENTWISE] * 3  # iota, add, full


@pytest.mark.parametrize("what", ["causal", "arange_add", "tril"])
def test_sources_fuse_into_their_consumers(what: str) -> None:
    """An iota fuses like a cheap elementwise producer: the causal mask and softmax are one
    kernel, ``x + arange`` one, and a tril mask from 1-D aranges (as torch decomposes
    ``tril``) one, because sources read through a broadcast are built in the reader's shape."""
    import opfuse

    g = Graph(what)
    x = g.input("x", (2, 3, 8, 8) if what == "causal" else (4, 8))
    if what == "causal":
        rows, cols = g.iota(x.shape, -2, dtype="i64"), g.iota(x.shape, -1, dtype="i64")
        y = g.softmax(g.where(g.ge(rows, cols), x, float("-inf")))
    elif what == "arange_add":
        y = x + g.iota((8,), 0)
    else:
        cols = g.reshape(g.iota((8,), 0, dtype="i64"), (1, 8))
        rows = g.reshape(g.iota((4,), 0, dtype="i64"), (4, 1))
        y = g.where(g.le(cols - rows, 0), x, 0.0)
    g.output(y)
    exe = opfuse.compile(g, backend="cpu")
    assert exe.report["totals"]["after"]["kernels"] == 1
    inputs = g.random_inputs()
    np.testing.assert_allclose(exe(inputs["x"]), g.reference(**inputs)[0], rtol=1e-6)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda g: g.where(g.input("x", (4,)), 1.0, 2.0), "condition must be an i8 boolean"),
        (lambda g: g.gt(g.input("x", (4,)), g.input("n", (4,), "i64")), "different dtypes"),
        (lambda g: g.exp(g.input("n", (4,), "i64")), "exp: i64 operands"),
        (lambda g: g.add(g.input("m", (4,), "i8"), 1), "add: i8 operands"),
        (lambda g: g.sum(g.input("n", (4,), "i64")), "sum: i64 operands"),
        (lambda g: g.lt(g.input("n", (4,), "i64"), 0.5), "0.5 is not an integer"),
        (lambda g: g.iota((4,), 0, step=0.5, dtype="i64"), "step 0.5 is not an integer"),
        (lambda g: g.iota((4,), 0, dtype="i8"), "unknown dtype 'i8'"),
        (lambda g: g.iota((4,), 1), "axis 1 out of range"),
        (lambda g: g.cast(g.input("x", (4,)), "i16"), "unknown dtype 'i16'"),
        (
            lambda g: g.where(
                g.input("m", (4,), "i8"), g.input("x", (4,)), g.input("h", (4,), "f16")
            ),
            "different dtypes",
        ),
    ],
)
def test_mask_errors(build, message: str) -> None:
    with pytest.raises(OpfuseError, match=message):
        build(Graph("e"))
