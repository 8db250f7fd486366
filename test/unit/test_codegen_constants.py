"""Weights baked into the module (``dense<...>`` and ``dense_resource<...>`` constants, as
torch-mlir exports them) are kernel arguments on the GPU: the host schedule holds their
data as constant buffers and passes them, the bundle stores them, and no kernel embeds
them. Checked against numpy on the CPU backend, in the emulator and through a bundle run
in a process without mlir. f32, rtol 1e-6 / atol 1e-6.
"""

from __future__ import annotations

import zipfile

import numpy as np

import opfuse
from opfuse.testing.emulator import emulate
from opfuse.runtime import bundle as rb

from test_codegen_common import run_bundle_without_mlir

W = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
B = np.arange(8, dtype=np.float32) / 4
# a dense_resource blob is "0x", 4 bytes of alignment, then the little-endian data
BLOB = "0x04000000" + W.tobytes().hex().upper()
SOURCE = f"""
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
module {{
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {{
    %w = arith.constant dense_resource<scale_weight> : tensor<8xf32>
    %b = arith.constant dense<{B.tolist()}> : tensor<8xf32>
    %e = tensor.empty() : tensor<4x8xf32>
    %y = linalg.generic {{indexing_maps = [#id, #col, #col, #id], iterator_types = ["parallel", "parallel"]}}
        ins(%x, %w, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) outs(%e : tensor<4x8xf32>) {{
    ^bb0(%a: f32, %s: f32, %t: f32, %o: f32):
      %m = arith.mulf %a, %s : f32
      %r = arith.addf %m, %t : f32
      linalg.yield %r : f32
    }} -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }}
}}
{{-#
  dialect_resources: {{
    builtin: {{
      scale_weight: "{BLOB}"
    }}
  }}
#-}}
"""


def test_weights_are_kernel_arguments_passed_by_the_host(tmp_path):
    x = np.random.default_rng(0).uniform(-1, 1, (4, 8)).astype(np.float32)
    want = x * W + B
    exe = opfuse.compile(SOURCE, backend="cpu")
    np.testing.assert_allclose(exe(x), want, rtol=1e-6, atol=1e-6)

    program = exe.gpu_program(lower=False)
    (kernel,) = program.kernels.values()
    assert len(kernel.params) == 4  # x, the two weights, the result
    assert "dense" not in program.kernels_ir  # no kernel embeds the data
    consts = program.schedule.consts
    assert sorted(len(c) for c in consts.values()) == [8, 8]
    assert any(np.array_equal(c, W) for c in consts.values())
    assert any(np.array_equal(c, B) for c in consts.values())
    (got,) = emulate.run_program(program, [x])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    path = exe.save_bundle(tmp_path / "weights.opfuse")
    names = zipfile.ZipFile(path).namelist()
    assert sum(n.startswith("consts/") for n in names) == 2
    assert len(rb.load(path).schedule.consts) == 2
    (got,) = run_bundle_without_mlir(path, [x], tmp_path)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
