"""Issue 10's done-when module: a torch-mlir-style program written by hand after real
torch-mlir output (test/Inputs/torch-mlir/hand_written_net.mlir: a named module with
attributes, dense_resource weights, i1 masks, reductions that keep the reduced dim,
``tensor.pad`` + ``linalg.conv_2d_nchw_fchw``) compiles for the CPU and for sm_90 (ptxas,
0 spills; sm_80 too), matches numpy on the CPU (fused and unfused) and in the emulator
(race check on), and its convolution, masked softmax and LayerNorm are one kernel each,
read from the report.

The numpy reference reads the weights from the file's blobs with its own hex parse. f32:
rtol 1e-5 / atol 1e-5 (the LayerNorm statistics in f64 by the IR and by numpy).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import opfuse
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas
from opfuse.frontends.builder.reference import _conv2d

PATH = Path(__file__).resolve().parents[1] / "Inputs" / "torch-mlir" / "hand_written_net.mlir"
TOL = dict(rtol=1e-5, atol=1e-5)


def _blobs() -> dict[str, bytes]:
    found = re.findall(r'^\s*([\w.]+): "0x([0-9A-F]+)"', PATH.read_text(), re.M)
    return {k: bytes.fromhex(h)[4:] for k, h in found}


def _reference(x: np.ndarray, s: np.ndarray, h: np.ndarray) -> list[np.ndarray]:
    b = _blobs()
    f32 = lambda name, shape: np.frombuffer(b[name], np.float32).reshape(shape).astype(np.float64)  # noqa: E731
    w, bias = f32("torch_tensor_4_3_3_3_torch.float32", (4, 3, 3, 3)), f32("torch_tensor_4_torch.float32", (4,))
    conv = _conv2d(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), w, (1, 1), (1, 1), 1)
    conv = np.maximum(conv + bias.reshape(1, 4, 1, 1), 0)
    mask = np.frombuffer(b["torch_tensor_16_16_torch.uint8"], np.uint8).reshape(16, 16) != 0
    scores = np.where(mask, s, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    softmax = e / e.sum(-1, keepdims=True)
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    ln = (h - mean) / np.sqrt(var + 1e-5) * f32("torch_tensor_32_torch.float32", (32,))
    ln = ln + f32("torch_tensor_32_torch.float32_1", (32,))
    return [conv, softmax, ln]


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(3)
    args = [rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((1, 3, 8, 8), (16, 16), (16, 32))]
    want = _reference(*(a.astype(np.float64) for a in args))
    return opfuse.compile(str(PATH), backend="cpu"), args, want


def test_each_branch_is_one_kernel(case):
    exe, _, _ = case
    report = exe.report
    assert report["totals"]["before"]["kernels"] == 29 and report["totals"]["after"]["kernels"] == 3
    branches = {}
    for k in report["kernels"]:
        names = {m.split(".")[0] for m in k["members"]}
        assert len(names) == 1, k["members"]  # no kernel mixes two branches
        # (opfuse-fold-unit-dims' reshapes are named after their op: conv.pad.expand_shape)
        ops = {".".join(m.split(".")[:2]) for m in k["members"]}
        branches[names.pop()] = (k["kind"], len(ops))
    # every op of a branch (fills are copied into their users, not members): the
    # convolution's 4, the softmax's 8 (its keepdim expand_shape folds away), the LayerNorm's 16
    assert branches == {"conv": ("conv", 4), "softmax": ("input", 8), "layernorm": ("input", 16)}


def test_cpu_matches_numpy_fused_and_unfused(case):
    exe, args, want = case
    for program in (exe, opfuse.compile(str(PATH), backend="cpu", fusion=False)):
        for got, w in zip(program(*args), want):
            np.testing.assert_allclose(got, w, **TOL)


def test_gpu_kernels_assemble_and_match_numpy_in_the_emulator(case):
    exe, args, want = case
    have_ptxas = ptxas.find_ptxas() is not None
    program = exe.gpu_program(("sm_80", "sm_90"), ptxas=have_ptxas)
    assert sorted(k.emitter for k in program.kernels.values()) == ["conv", "rows", "rows"]
    assert not program.notes
    for k in program.kernels.values():
        assert ".entry " + k.entry in k.ptx["sm_90"]
        if have_ptxas:  # (the PTX is checked either way; cubins need ptxas)
            for chip in ("sm_80", "sm_90"):
                res = k.resources[chip]
                assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, chip, res)
    for got, w in zip(emulate.run_program(program, args), want):
        np.testing.assert_allclose(got, w, **TOL)
