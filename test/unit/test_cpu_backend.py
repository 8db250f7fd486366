"""CPU backend: lowering to LLVM (backends/cpu/lower.py), ExecutionEngine runtime (runtime/cpu.py)
and the Executable around them, checked against numpy.

Tolerances (max abs error against a float64 numpy reference unless stated):
    f32 elementwise / math: 1e-5 relative + 1e-5 absolute; f32 matmul/reductions: 1e-4;
    f16: 2e-3 relative + 2e-3 absolute (each op rounds to f16, like numpy's float16);
    bf16: 1e-2 relative + 1e-2 absolute (8-bit mantissa, each op rounded).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from mlir import ir
from mlir.passmanager import PassManager

from opfuse.backends.cpu import lower as cpu_codegen
from opfuse.errors import OpfuseError
from opfuse.ir import parse_module, print_module
from opfuse.runtime import cpu as cpu_runtime
from opfuse.driver.executable import Executable
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits

RNG = np.random.default_rng(1234)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def count_ops(module: ir.Module, name: str, func: str | None = None) -> int:
    n = 0
    for top in module.body.operations:
        top = top.operation
        if func is not None and ir.StringAttr(top.attributes["sym_name"]).value != func:
            continue

        def visit(op):
            nonlocal n
            n += op.name == name
            return ir.WalkResult.ADVANCE

        top.walk(visit)
    return n


# ----------------------------------------------------------------------------- modules

ID2 = "affine_map<(d0, d1) -> (d0, d1)>"
COL = "affine_map<(d0, d1) -> (d1)>"
ROW = "affine_map<(d0, d1) -> (d0)>"
ROWK = "affine_map<(d0, d1) -> (d0, 0)>"

# Plain: bias broadcast along rows ((d0,d1)->(d1)), then named elementwise ops.
PLAIN_ELEMENTWISE = f"""
func.func @main(%x: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {{
  %e = tensor.empty() : tensor<8x16xf32>
  %0 = linalg.generic {{indexing_maps = [{ID2}, {COL}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %b : tensor<8x16xf32>, tensor<16xf32>) outs(%e : tensor<8x16xf32>) {{
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    linalg.yield %s : f32
  }} -> tensor<8x16xf32>
  %1 = linalg.mul ins(%0, %x : tensor<8x16xf32>, tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) -> tensor<8x16xf32>
  %2 = linalg.exp ins(%1 : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) -> tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}}
"""

MATMULS = """
func.func @main(%a: tensor<16x32xf32>, %b: tensor<32x24xf32>, %bt: tensor<24x32xf32>,
                %x: tensor<2x8x16xf32>, %y: tensor<2x16x12xf32>)
    -> (tensor<16x24xf32>, tensor<16x24xf32>, tensor<2x8x12xf32>) {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x24xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<16x24xf32>) -> tensor<16x24xf32>
  %m = linalg.matmul ins(%a, %b : tensor<16x32xf32>, tensor<32x24xf32>)
      outs(%f : tensor<16x24xf32>) -> tensor<16x24xf32>
  %mt = linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                                       affine_map<(d0, d1, d2) -> (d1, d2)>,
                                       affine_map<(d0, d1, d2) -> (d0, d1)>]
      ins(%a, %bt : tensor<16x32xf32>, tensor<24x32xf32>) outs(%f : tensor<16x24xf32>) -> tensor<16x24xf32>
  %eb = tensor.empty() : tensor<2x8x12xf32>
  %fb = linalg.fill ins(%z : f32) outs(%eb : tensor<2x8x12xf32>) -> tensor<2x8x12xf32>
  %bm = linalg.batch_matmul ins(%x, %y : tensor<2x8x16xf32>, tensor<2x16x12xf32>)
      outs(%fb : tensor<2x8x12xf32>) -> tensor<2x8x12xf32>
  return %m, %mt, %bm : tensor<16x24xf32>, tensor<16x24xf32>, tensor<2x8x12xf32>
}
"""

# Row softmax written with a reduction to (d0) and one to (d0, 0) (keepdims), a linalg.reduce
# and a linalg.transpose of the input first. TY is the element type, NINF its -inf bits.
SOFTMAX_T = f"""
func.func @main(%xt: tensor<16x4xTY>) -> tensor<4x16xTY> {{
  %et = tensor.empty() : tensor<4x16xTY>
  %x = linalg.transpose ins(%xt : tensor<16x4xTY>) outs(%et : tensor<4x16xTY>) permutation = [1, 0]
  %ninf_t = arith.constant NINF : TY
  %em = tensor.empty() : tensor<4xTY>
  %fm = linalg.fill ins(%ninf_t : TY) outs(%em : tensor<4xTY>) -> tensor<4xTY>
  %m = linalg.reduce ins(%x : tensor<4x16xTY>) outs(%fm : tensor<4xTY>) dimensions = [1]
    (%in: TY, %acc: TY) {{
      %r = arith.maximumf %in, %acc : TY
      linalg.yield %r : TY
    }}
  %e = tensor.empty() : tensor<4x16xTY>
  %p = linalg.generic {{indexing_maps = [{ID2}, {ROW}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %m : tensor<4x16xTY>, tensor<4xTY>) outs(%e : tensor<4x16xTY>) {{
  ^bb0(%a: TY, %b: TY, %o: TY):
    %d = arith.subf %a, %b : TY
    %ex = math.exp %d : TY
    linalg.yield %ex : TY
  }} -> tensor<4x16xTY>
  %zero = arith.constant 0.0 : TY
  %es = tensor.empty() : tensor<4x1xTY>
  %fs = linalg.fill ins(%zero : TY) outs(%es : tensor<4x1xTY>) -> tensor<4x1xTY>
  %s = linalg.generic {{indexing_maps = [{ID2}, {ROWK}], iterator_types = ["parallel", "reduction"]}}
      ins(%p : tensor<4x16xTY>) outs(%fs : tensor<4x1xTY>) {{
  ^bb0(%a: TY, %acc: TY):
    %r = arith.addf %a, %acc : TY
    linalg.yield %r : TY
  }} -> tensor<4x1xTY>
  %o = linalg.generic {{indexing_maps = [{ID2}, {ROWK}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%p, %s : tensor<4x16xTY>, tensor<4x1xTY>) outs(%e : tensor<4x16xTY>) {{
  ^bb0(%a: TY, %b: TY, %out: TY):
    %d = arith.divf %a, %b : TY
    linalg.yield %d : TY
  }} -> tensor<4x16xTY>
  return %o : tensor<4x16xTY>
}}
"""

# erf, tanh, rsqrt, powf, exp, a compare and a select; TY is the element type.
MATH_T = f"""
func.func @main(%x: tensor<8x16xTY>, %y: tensor<8x16xTY>) -> tensor<8x16xTY> {{
  %e = tensor.empty() : tensor<8x16xTY>
  %r = linalg.generic {{indexing_maps = [{ID2}, {ID2}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %y : tensor<8x16xTY>, tensor<8x16xTY>) outs(%e : tensor<8x16xTY>) {{
  ^bb0(%a: TY, %b: TY, %o: TY):
    %one = arith.constant 1.0 : TY
    %t = math.tanh %a : TY
    %f = math.erf %b : TY
    %s = arith.addf %t, %f : TY
    %ab = math.absf %a : TY
    %ab1 = arith.addf %ab, %one : TY
    %rs = math.rsqrt %ab1 : TY
    %p = math.powf %ab1, %b : TY
    %m = arith.mulf %s, %rs : TY
    %q = arith.addf %m, %p : TY
    %ex = math.exp %b : TY
    %mx = arith.maximumf %q, %ex : TY
    %c = arith.cmpf ogt, %a, %b : TY
    %sel = arith.select %c, %mx, %q : TY
    linalg.yield %sel : TY
  }} -> tensor<8x16xTY>
  return %r : tensor<8x16xTY>
}}
"""


NINF = {"f32": "0xFF800000", "f16": "0xFC00", "bf16": "0xFF80"}


def softmax_module(ty: str) -> str:
    return SOFTMAX_T.replace("NINF", NINF[ty]).replace("TY", ty)


def math_ref(x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    s = np.tanh(x) + np.vectorize(math.erf)(y)
    ab1 = np.abs(x) + 1
    q = s / np.sqrt(ab1) + ab1**y
    return np.where(x > y, np.maximum(q, np.exp(y)), q)


def softmax_ref(xt):
    x = xt.astype(np.float64).T
    p = np.exp(x - x.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


# Outlined: a reshape-only callee (its result aliases its argument), a kernel with two
# results, host-level reshapes, a result returned twice and an input returned as is.
OUTLINED = f"""
func.func private @fusion_0_loop(%x: tensor<32xf32>) -> tensor<4x8xf32> {{
  %r = tensor.expand_shape %x [[0, 1]] output_shape [4, 8] : tensor<32xf32> into tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}}
func.func private @fusion_1_input(%x: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4x8xf32>) {{
  %ninf = arith.constant 0xFF800000 : f32
  %e = tensor.empty() : tensor<4xf32>
  %f = linalg.fill ins(%ninf : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %m = linalg.reduce ins(%x : tensor<4x8xf32>) outs(%f : tensor<4xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {{
      %r = arith.maximumf %in, %acc : f32
      linalg.yield %r : f32
    }}
  %e2 = tensor.empty() : tensor<4x8xf32>
  %s = linalg.generic {{indexing_maps = [{ID2}, {ROW}, {ID2}], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %m : tensor<4x8xf32>, tensor<4xf32>) outs(%e2 : tensor<4x8xf32>) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    linalg.yield %d : f32
  }} -> tensor<4x8xf32>
  %t = linalg.exp ins(%s : tensor<4x8xf32>) outs(%e2 : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %m, %t : tensor<4xf32>, tensor<4x8xf32>
}}
func.func @main(%x: tensor<32xf32>) -> (tensor<4x8xf32>, tensor<4xf32>, tensor<32xf32>, tensor<4x8xf32>, tensor<32xf32>) {{
  %x2 = func.call @fusion_0_loop(%x) : (tensor<32xf32>) -> tensor<4x8xf32>
  %m, %t = func.call @fusion_1_input(%x2) : (tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4x8xf32>)
  %c = tensor.collapse_shape %t [[0, 1]] : tensor<4x8xf32> into tensor<32xf32>
  return %t, %m, %c, %t, %x : tensor<4x8xf32>, tensor<4xf32>, tensor<32xf32>, tensor<4x8xf32>, tensor<32xf32>
}}
"""

_CHAIN = [("linalg.add", 2), ("linalg.mul", 2), ("linalg.sub", 2), ("linalg.max", 2),
          ("linalg.exp", 1), ("linalg.mul", 2)]  # fmt: skip


def _chain_op(res, op, arity, x, T):
    ins = f"{x}, %b : {T}, {T}" if arity == 2 else f"{x} : {T}"
    return f"  %e{res} = tensor.empty() : {T}\n  %{res} = {op} ins({ins}) outs(%e{res} : {T}) -> {T}\n"


def chain_module(n: int, fused: bool) -> str:
    """Six elementwise ops on n x n: one kernel of six ops, or six one-op kernels."""
    T = f"tensor<{n}x{n}xf32>"
    if fused:
        body = "".join(_chain_op(f"r{i}", op, a, f"%r{i - 1}" if i else "%x", T)
                       for i, (op, a) in enumerate(_CHAIN))  # fmt: skip
        kernels = f"func.func private @fusion_0_loop(%x: {T}, %b: {T}) -> {T} {{\n{body}  return %r5 : {T}\n}}\n"
        calls = f"  %v5 = func.call @fusion_0_loop(%a, %b) : ({T}, {T}) -> {T}\n"
    else:
        kernels = "".join(
            f"func.func private @fusion_{i}_loop(%x: {T}, %b: {T}) -> {T} {{\n"
            + _chain_op("r", op, a, "%x", T) + f"  return %r : {T}\n}}\n"
            for i, (op, a) in enumerate(_CHAIN)
        )  # fmt: skip
        calls = "".join(
            f"  %v{i} = func.call @fusion_{i}_loop({f'%v{i - 1}' if i else '%a'}, %b) : ({T}, {T}) -> {T}\n"
            for i in range(len(_CHAIN))
        )  # fmt: skip
    return kernels + f"func.func @main(%a: {T}, %b: {T}) -> {T} {{\n{calls}  return %v5 : {T}\n}}\n"


def chain_ref(a, b):
    return np.exp(np.maximum((a + b) * b - b, b)) * b


# ----------------------------------------------------------------------------- lowering


def test_lowering_stages_parse_and_keep_their_order():
    ctx = ir.Context()
    stages = cpu_codegen.lowering_stages()
    for stage in stages:
        if isinstance(stage.run, str):  # the others are Python rewrites
            PassManager.parse(f"builtin.module({stage.run})", ctx)
    PassManager.parse(f"builtin.module({cpu_codegen.KERNEL_PIPELINE})", ctx)
    assert cpu_codegen.STAGE == "cpu"
    names = [s.name for s in stages]
    assert names.index("bufferize") < names.index("results-to-out-params")
    assert names.index("results-to-out-params") < names.index("deallocate")
    # approximations see f32 math only, and run before the math ops are lowered
    assert names.index("extend-half-floats") < names.index("approximate-math")
    assert names.index("approximate-math") < names.index("math-to-llvm")
    # bf16 values become their bits once the module is LLVM dialect only (cpu_bf16.py);
    # f64 -> bf16 goes through f32 before arith-expand expands f32 -> bf16
    assert names[-2:] == ["reconcile-casts", "bf16-as-bits"]
    assert names.index("f64-to-bf16") < names.index("arith-expand")
    assert "<python:approximate-math>" in cpu_codegen.LOWERING_PIPELINE


def test_lower_to_llvm_works_on_a_copy():
    module = parse_module(OUTLINED)
    before = print_module(module, debug_info=True)
    lowered = cpu_codegen.lower_to_llvm(module)
    assert print_module(module, debug_info=True) == before
    assert lowered.operation.name == "builtin.module"
    names = {op.operation.name for op in lowered.body.operations}
    assert names == {"llvm.func", "llvm.mlir.global"}  # globals: the functions' workspaces
    assert "llvm.func @_mlir_ciface_opfuse_main(" in str(lowered)


def test_kernel_fusion_makes_one_loop_nest_and_leaves_the_host_alone():
    fused = parse_module(chain_module(8, fused=True))
    cpu_codegen.fuse_kernel_functions(fused)
    assert count_ops(fused, "linalg.generic", "fusion_0_loop") == 1
    assert count_ops(fused, "func.call", "main") == 1

    # A plain module's public function is the unfused baseline: never fused.
    plain = parse_module(PLAIN_ELEMENTWISE)
    text = print_module(plain)
    cpu_codegen.fuse_kernel_functions(plain)
    assert print_module(plain) == text


def test_matmul_is_not_fused_with_its_producers():
    module = parse_module(
        """
func.func private @fusion_0_output(%a: tensor<4x8xf32>, %b: tensor<8x6xf32>, %c: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %x = linalg.exp ins(%a : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = linalg.matmul ins(%x, %b : tensor<4x8xf32>, tensor<8x6xf32>) outs(%c : tensor<4x6xf32>) -> tensor<4x6xf32>
  return %m : tensor<4x6xf32>
}
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x6xf32>, %c: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %r = func.call @fusion_0_output(%a, %b, %c) : (tensor<4x8xf32>, tensor<8x6xf32>, tensor<4x6xf32>) -> tensor<4x6xf32>
  return %r : tensor<4x6xf32>
}"""
    )
    cpu_codegen.fuse_kernel_functions(module)
    # exp stays its own loop nest: fused into the matmul it would run once per column.
    assert count_ops(module, "linalg.matmul") == 1
    assert count_ops(module, "linalg.generic") == 1


def test_unsupported_op_is_a_clear_error():
    module = parse_module(
        """
func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %s = linalg.softmax dimension(1) ins(%a : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %s : tensor<4x8xf32>
}""",
        filename="softmax.mlir",
    )
    with pytest.raises(OpfuseError, match=r"cannot lower: linalg.softmax \(softmax.mlir:4:"):
        cpu_codegen.lower_to_llvm(module)


def test_declared_only_function_is_a_clear_error():
    module = parse_module(
        """
func.func private @ext(tensor<4xf32>) -> tensor<4xf32>
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %r = func.call @ext(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}"""
    )
    with pytest.raises(OpfuseError, match="@ext is declared but not defined"):
        cpu_codegen.lower_to_llvm(module)


def test_failing_pipeline_writes_a_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_DUMP_DIR", str(tmp_path))
    module = parse_module(
        """
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = tosa.abs %a : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}""",
        filename="tosa.mlir",
    )
    with pytest.raises(OpfuseError) as info:
        cpu_codegen.lower_to_llvm(module)  # tosa ops do not bufferize
    error = info.value
    assert error.exit_code == 2
    assert "tosa.mlir:3:8: error: op was not bufferized" in error.diagnostics
    assert error.diagnostics[-1].startswith("note: reproduce with: ")
    assert "--pass-pipeline='builtin.module(one-shot-bufferize" in error.diagnostics[-1]
    (folder,) = tmp_path.iterdir()
    assert {p.name for p in folder.iterdir()} == {"00-input.mlir", "pipeline.txt", "reproduce.sh"}
    assert "tosa.abs" in (folder / "00-input.mlir").read_text()


# ----------------------------------------------------------------------------- running


def test_plain_elementwise_with_broadcast_map():
    x, b = randn(8, 16), randn(16)
    out = Executable({"linalg": PLAIN_ELEMENTWISE})(x, b)
    assert out.dtype == np.float32 and out.shape == (8, 16)
    np.testing.assert_allclose(out, np.exp((x + b) * x), rtol=1e-5, atol=1e-5)


def test_matmuls():
    a, b, x, y = randn(16, 32), randn(32, 24), randn(2, 8, 16), randn(2, 16, 12)
    m, mt, bm = Executable({"linalg": MATMULS})(a, b, np.ascontiguousarray(b.T), x, y)
    np.testing.assert_allclose(m, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mt, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bm, x @ y, rtol=1e-4, atol=1e-4)


def test_reductions_keepdims_and_transpose_f32():
    xt = randn(16, 4)
    out = Executable({"linalg": softmax_module("f32")})(xt)
    np.testing.assert_allclose(out, softmax_ref(xt), rtol=1e-5, atol=1e-6)


def test_math_f32():
    x, y = randn(8, 16), randn(8, 16)
    out = Executable({"linalg": MATH_T.replace("TY", "f32")})(x, y)
    np.testing.assert_allclose(out, math_ref(x, y), rtol=1e-5, atol=1e-5)


def test_f16():
    x, y = randn(8, 16, dtype=np.float16), randn(8, 16, dtype=np.float16)
    out = Executable({"linalg": MATH_T.replace("TY", "f16")})(x, y)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), math_ref(x, y), rtol=2e-3, atol=2e-3)
    xt = randn(16, 4, dtype=np.float16)
    sm = Executable({"linalg": softmax_module("f16")})(xt)
    np.testing.assert_allclose(sm.astype(np.float64), softmax_ref(xt), rtol=2e-3, atol=2e-3)


def test_bf16_as_uint16_bits():
    x, y = float32_to_bf16_bits(randn(8, 16)), float32_to_bf16_bits(randn(8, 16))
    out = Executable({"linalg": MATH_T.replace("TY", "bf16")})(x, y)
    assert out.dtype == np.uint16
    ref = math_ref(bf16_bits_to_float32(x), bf16_bits_to_float32(y))
    np.testing.assert_allclose(bf16_bits_to_float32(out), ref, rtol=1e-2, atol=1e-2)
    xt = float32_to_bf16_bits(randn(16, 4))
    sm = Executable({"linalg": softmax_module("bf16")})(xt)
    ref = softmax_ref(bf16_bits_to_float32(xt))
    np.testing.assert_allclose(bf16_bits_to_float32(sm), ref, rtol=1e-2, atol=1e-2)


def test_bf16_bit_helpers_round_to_nearest_even():
    v = np.array([1.0, -2.5, 3.0e38, np.inf, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], np.float32)
    bits = float32_to_bf16_bits(v)
    back = bf16_bits_to_float32(bits)
    assert back[0] == 1.0 and back[1] == -2.5 and back[3] == np.inf
    assert back[4] == 1.0  # tie -> even
    assert back[5] == 1.0 + 2 * 2.0**-7
    assert np.isnan(bf16_bits_to_float32(float32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


def test_outlined_module_with_aliasing_callee_and_two_results():
    x = randn(32)
    t, m, c, t2, xo = Executable({"fused": OUTLINED})(x)
    x2 = x.reshape(4, 8)
    ref = np.exp(x2 - x2.max(1, keepdims=True))
    np.testing.assert_allclose(t, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m, x2.max(1))
    np.testing.assert_array_equal(c, t.reshape(-1))
    np.testing.assert_array_equal(t2, t)
    assert t2 is not t  # each result owns its memory
    np.testing.assert_array_equal(xo, x)
    assert not np.shares_memory(xo, x)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_elementwise_chain_fused_and_unfused_match_numpy(fused):
    a, b = RNG.random((64, 64), dtype=np.float32), RNG.random((64, 64), dtype=np.float32)
    out = Executable({"fused": chain_module(64, fused)})(a, b)
    np.testing.assert_allclose(out, chain_ref(a, b), rtol=1e-5, atol=1e-5)


def test_zero_d_and_integer_results():
    ex = Executable(
        {
            "linalg": """
func.func @main(%a: tensor<8xf32>, %s: tensor<f32>) -> (tensor<f32>, tensor<8xi32>) {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %r = linalg.reduce ins(%a : tensor<8xf32>) outs(%f : tensor<f32>) dimensions = [0]
    (%in: f32, %acc: f32) {
      %x = arith.addf %in, %acc : f32
      linalg.yield %x : f32
    }
  %r2 = linalg.add ins(%r, %s : tensor<f32>, tensor<f32>) outs(%e : tensor<f32>) -> tensor<f32>
  %e3 = tensor.empty() : tensor<8xi32>
  %i = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]} ins(%a : tensor<8xf32>) outs(%e3 : tensor<8xi32>) {
  ^bb0(%x: f32, %o: i32):
    %c = arith.fptosi %x : f32 to i32
    linalg.yield %c : i32
  } -> tensor<8xi32>
  return %r2, %i : tensor<f32>, tensor<8xi32>
}"""
        }
    )
    a = np.arange(8, dtype=np.float32) * 1.5
    total, ints = ex(a, np.array(2.0, np.float32))
    assert total.shape == () and total == a.sum() + 2  # exact: small integers and halves
    np.testing.assert_array_equal(ints, a.astype(np.int32))


def test_strided_input_and_inputs_untouched():
    x = randn(16, 8).T  # a transposed view: copied to contiguous before the call
    b = randn(16)
    keep = x.copy()
    out = Executable({"linalg": PLAIN_ELEMENTWISE})(x, b)
    np.testing.assert_allclose(out, np.exp((x + b) * x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(x, keep)


def test_cpu_program_directly():
    prog = cpu_codegen.jit(parse_module(PLAIN_ELEMENTWISE))
    x, b = randn(8, 16), randn(16)
    (out,) = prog(x, b)
    np.testing.assert_allclose(out, np.exp((x + b) * x), rtol=1e-5, atol=1e-5)
    lib_dir = cpu_runtime.runtime_library_dir()
    assert all((lib_dir / lib).is_file() for lib in cpu_runtime.RUNTIME_LIBRARIES)


# ----------------------------------------------------------------------------- Executable


def test_executable_api():
    report = object()
    ex = Executable.from_module(PLAIN_ELEMENTWISE, report=report)
    assert ex.report is report and ex.entry == "main" and ex.backend == "cpu"
    assert str(ex.signature) == "@main(tensor<8x16xf32>, tensor<16xf32>) -> (tensor<8x16xf32>)"
    assert ex.signature.inputs[1].shape == (16,) and ex.signature.outputs[0].dtype == np.float32
    assert "linalg.mul" in ex.ir("linalg")
    assert ex.stages == ("linalg",)
    assert "llvm.func @_mlir_ciface_opfuse_main" in ex.ir("cpu")  # lowered on demand
    with pytest.raises(OpfuseError, match="no 'ptx' stage"):
        ex.ir("ptx")
    x, b = randn(8, 16), randn(16)
    first, second = ex(x, b), ex(x, b)
    assert first is not second and not np.shares_memory(first, second)
    times = ex.time(x, b, repeat=3, warmup=1)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_executable_chooses_fused_stage_and_entry():
    ex = Executable({"linalg": PLAIN_ELEMENTWISE, "fused": OUTLINED})
    assert ex.signature.inputs[0].shape == (32,)
    with pytest.raises(OpfuseError, match="no function @nope"):
        Executable({"linalg": PLAIN_ELEMENTWISE}, entry="nope")
    with pytest.raises(OpfuseError, match="several public functions"):
        Executable({"linalg": PLAIN_ELEMENTWISE + PLAIN_ELEMENTWISE.replace("@main", "@other")})
    with pytest.raises(OpfuseError, match="needs a fused or linalg stage"):
        Executable({"ptx": "..."})


@pytest.mark.parametrize(
    "args, message",
    [
        ((randn(8, 16),), r"takes 2 input\(s\)"),
        ((randn(8, 15), randn(16)), r"input #0: expected shape \(8, 16\)"),
        ((randn(8, 16), randn(16, dtype=np.float64)), "input #1: expected dtype float32"),
        ((randn(8, 16), [0.0] * 16), "input #1: expected a numpy array"),
    ],
)
def test_input_validation(args, message):
    ex = Executable({"linalg": PLAIN_ELEMENTWISE})
    with pytest.raises(OpfuseError, match=message):
        ex(*args)


def test_bf16_dtype_error_mentions_bit_patterns():
    ex = Executable({"linalg": MATH_T.replace("TY", "bf16")})
    with pytest.raises(OpfuseError, match="uint16 bit patterns"):
        ex(randn(8, 16), randn(8, 16))


@pytest.mark.parametrize(
    "arg, message",
    [
        ("tensor<4xi1>", "i1 is not supported|store booleans as i8"),
        ("tensor<?xf32>", "dynamic shapes"),
    ],
)
def test_unsupported_signatures(arg, message):
    with pytest.raises(OpfuseError, match=message):
        Executable({"linalg": f"func.func @main(%a: {arg}) -> {arg} {{ return %a : {arg} }}"})


@pytest.mark.skipif(
    importlib.util.find_spec("pycuda") is not None, reason="PyCUDA present: cuda may be available"
)
def test_cuda_backend_unavailable_is_an_opfuse_error():
    with pytest.raises(OpfuseError, match="cuda backend not available"):
        Executable({"linalg": PLAIN_ELEMENTWISE}, backend="cuda")


@pytest.mark.parametrize("name", ["g6_encoder_layer", "g7_rmsnorm_swiglu"])
def test_matmuls_in_kernels_stay_micro_kernel_matmuls(name):
    """Regression: inside fused kernels, upstream elementwise fusion folded transposes and
    reshapes into the matmuls' indexing maps, leaving the reduction innermost and
    unvectorized: fused G5 ran 3x and fused G6 2.7x slower than unfused on the CPU. Now
    every contraction's inputs and result stay separate ops, so each f32 matmul is still a
    named matmul the packed micro-kernel takes (backends/cpu/matmul.py); one it does not
    take would be a generic with a parallel loop innermost. (G5 is one attention kernel
    now, lowered to its own loops: backends/cpu/attention.py.)"""
    import opfuse
    from mlir.dialects import linalg
    from opfuse.backends.cpu import matmul as cpu_matmul
    from opfuse.frontends.builder.graphs import graphs

    exe = opfuse.compile(graphs(scale=16)[name], backend="cpu")
    module = parse_module(exe.ir("fused"))
    cpu_codegen.prepare_loops(module)
    found = []

    def visit(op):
        if op.name.startswith("linalg.") and linalg.isa_contraction_op(op):
            its = op.attributes["iterator_types"] if "iterator_types" in op.attributes else None
            found.append((op.name, cpu_matmul.takes(op),
                          str(its).split(",")[-1] if its is not None else None))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    assert found, "expected matmuls in the kernels"
    for name_, taken, last in found:
        assert taken or (name_ == "linalg.generic" and "parallel" in last), found
    assert all(taken for _, taken, _ in found), found  # f32 graphs: every one a micro-kernel


def test_a_bound_call_keeps_its_program_alive():
    """Regression: ``CpuProgram.bind`` kept the inputs and descriptors alive but not the
    ExecutionEngine, so a bound call outliving its Executable jumped into freed JIT code
    (a crash in interleaved timing that dropped one program before the other)."""
    import gc

    exe = Executable({"linalg": PLAIN_ELEMENTWISE})
    x, b = randn(8, 16), randn(16)
    run = exe._compiled().bind(x, b)
    want = np.exp((x + b) * x)
    del exe
    gc.collect()
    for _ in range(3):
        np.testing.assert_allclose(run()[0], want, rtol=1e-5, atol=1e-6)
