"""GPU parity with the CPU on what producers print: programs the CPU backend ran and the GPU
path refused (issue 10) compile to kernels that match numpy in the emulator (race check
on) and assemble with 0 spills for sm_80 and sm_90 (when ptxas is installed):

* a function that returns a ``linalg.fill`` (a kernel writes it);
* a scalar between kernels (``tensor.extract`` of a 0-d tensor, arithmetic on it in the
  host function, read inside a generic's body): a one-element buffer, also through a
  bundle's CPU library in a process without mlir;
* ``tensor.insert_slice`` and ``tensor.pad`` inside loop kernels;
* ``cf.assert`` in a generic's body: left out of the kernel (it had been vectorized into
  invalid IR: exit 2), and the program's notes say so.

f32 throughout: rtol 1e-5 / atol 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas

from test_codegen_common import run_bundle_without_mlir

HAVE_PTXAS = ptxas.find_ptxas() is not None
ID = "affine_map<(d0, d1) -> (d0, d1)>"


def _generic(x: str, body: str, out: str = "%e", t: str = "tensor<4x8xf32>") -> str:
    return (f"linalg.generic {{indexing_maps = [{ID}, {ID}], iterator_types = "
            f'["parallel", "parallel"]}} ins({x} : {t}) outs({out} : {t}) {{\n'
            f"    ^bb0(%a: f32, %o: f32):\n{body}\n  }} -> {t}")


MUL_C = "      %m = arith.mulf %a, %c : f32\n      linalg.yield %m : f32"
MUL_W = "      %m = arith.mulf %a, %w : f32\n      linalg.yield %m : f32"
MUL_TWO = "      %m = arith.mulf %a, %two : f32\n      linalg.yield %m : f32"
EXP = "      %m = math.exp %a : f32\n      linalg.yield %m : f32"
ASSERT_EXP = """      %ok = arith.cmpf olt, %a, %big : f32
      cf.assert %ok, "x must be below 1e30"
      %m = math.exp %a : f32
      linalg.yield %m : f32"""
T611 = "tensor<6x11xf32>"

CASES = {
    "returned_fill": (
        f"""func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {{
  %c = arith.constant 1.5 : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %f = linalg.fill ins(%c : f32) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = {_generic("%x", MUL_C)}
  return %y, %f : tensor<4x8xf32>, tensor<4x8xf32>
}}""",
        lambda x, s, u: (x * 1.5, np.full((4, 8), 1.5)),
    ),
    "scalar_between_kernels": (
        f"""func.func @main(%x: tensor<4x8xf32>, %s: tensor<f32>) -> tensor<4x8xf32> {{
  %v = tensor.extract %s[] : tensor<f32>
  %two = arith.constant 2.0 : f32
  %w = arith.mulf %v, %two : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %y = {_generic("%x", MUL_W)}
  return %y : tensor<4x8xf32>
}}""",
        lambda x, s, u: (x * s * 2,),
    ),
    "insert_slice": (
        f"""func.func @main(%x: tensor<4x8xf32>, %u: tensor<2x3xf32>) -> tensor<4x8xf32> {{
  %e = tensor.empty() : tensor<4x8xf32>
  %y = {_generic("%x", EXP)}
  %i = tensor.insert_slice %u into %y[1, 2] [2, 3] [1, 1] : tensor<2x3xf32> into tensor<4x8xf32>
  %two = arith.constant 2.0 : f32
  %z = {_generic("%i", MUL_TWO)}
  return %z : tensor<4x8xf32>
}}""",
        lambda x, s, u: (2 * _inserted(np.exp(x), u),),
    ),
    "pad_in_a_loop_kernel": (
        f"""func.func @main(%x: tensor<4x8xf32>) -> tensor<6x11xf32> {{
  %p = arith.constant -0.5 : f32
  %padded = tensor.pad %x low[1, 2] high[1, 1] {{
  ^bb0(%i: index, %j: index):
    tensor.yield %p : f32
  }} : tensor<4x8xf32> to tensor<6x11xf32>
  %e = tensor.empty() : tensor<6x11xf32>
  %y = {_generic("%padded", EXP, t=T611)}
  return %y : tensor<6x11xf32>
}}""",
        lambda x, s, u: (np.exp(np.pad(x, [(1, 1), (2, 1)], constant_values=-0.5)),),
    ),
    "assert_in_a_body": (
        f"""func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {{
  %e = tensor.empty() : tensor<4x8xf32>
  %big = arith.constant 1.0e30 : f32
  %y = {_generic("%x", ASSERT_EXP)}
  return %y : tensor<4x8xf32>
}}""",
        lambda x, s, u: (np.exp(x),),
    ),
}


def _inserted(dest: np.ndarray, src: np.ndarray) -> np.ndarray:
    out = dest.copy()
    out[1:3, 2:5] = src
    return out


def _inputs(text: str) -> tuple[list[np.ndarray], tuple]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 8)).astype(np.float32)
    s = np.array(0.75, np.float32)
    u = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    args = [x] + ([s] if "tensor<f32>" in text else []) + ([u] if "tensor<2x3xf32>" in text else [])
    return args, (x.astype(np.float64), 0.75, u.astype(np.float64))


@pytest.mark.parametrize("name", list(CASES))
def test_gpu_kernels_match_numpy_like_the_cpu(name, tmp_path):
    text, reference = CASES[name]
    args, values = _inputs(text)
    want = reference(*values)
    exe = opfuse.compile(text, backend="cpu")
    got_cpu = exe(*args)
    for g, w in zip(got_cpu if isinstance(got_cpu, tuple) else (got_cpu,), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    program = exe.gpu_program(("sm_80", "sm_90")) if HAVE_PTXAS else exe.gpu_program(lower=False)
    tensor_kernels = [k for k in program.kernels.values() if "opaque" not in k.name]
    assert all(k.emitter == "loop" for k in tensor_kernels), program.notes
    notes = [n for n in program.notes if "cf.assert" in n]
    assert bool(notes) == (name == "assert_in_a_body")
    if notes:
        assert "'x must be below 1e30' is not checked in the kernel" in notes[0]
        assert "cf.assert" not in program.kernels_ir
    for g, w in zip(emulate.run_program(program, args), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    if HAVE_PTXAS:
        for k in program.kernels.values():
            for chip in ("sm_80", "sm_90"):
                assert k.resources[chip]["spill_stores"] == 0, (k.name, chip)
    if name == "scalar_between_kernels":  # scalars cross the bundle's C interface boxed
        path = exe.save_bundle(tmp_path / "scalar.opfuse")
        (got,) = run_bundle_without_mlir(path, args, tmp_path)
        np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-6)
