"""An attention whose output merges the heads back (``O.transpose(1, 2).reshape(b, s, h*d)``,
as every multi-head attention does before its output projection) keeps the attention
kernels.

The planner takes the merge into the attention group (it saves writing O and reading it
back); the kernels' plan used to accept only outputs that hold P·V's elements in its own
order, so such a group lost the tiled CPU kernel (and the GPU attention emitters) and ran
as its ops' loops with the batch x heads x queries x keys scores in memory: 13.4 ms
against 2.1 ms unfused for 4x8x128x32 on one core, silently. Now the output's index is
P·V's, inverted through the transpose and the batch x heads split of a batched P·V.
Checked against torch eager on the CPU kernels (tiled and one-row) and the SIMT GPU
kernel in the emulator (race check on); an output the kernels still cannot place warns
instead of going slow unheard. In f16/bf16 the merge follows the cast back from the f32
accumulator, and opfuse-fuse-attention used to leave it in a kernel of its own (a
transpose was not one of the output ops it takes): now the tensor-core kernel writes the
merged heads, emulated with the race check on.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.nn import functional as F  # noqa: E402

import opfuse  # noqa: E402
from attention_cases import cpu_outputs  # noqa: E402
from opfuse.backends.gpu.build import attention_plan
from opfuse.testing.emulator import emulate  # noqa: E402
from opfuse.backends.gpu.compiler import compile_module  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402
from opfuse.runtime.schedule import bf16_bits_to_float32, float32_to_bf16_bits  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

#: Against eager, relative to max(1, max|eager|), as the other attention tests.
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


class MergedHeads(torch.nn.Module):
    """SDPA on [batch, heads, seq, dim], heads merged back to [batch, seq, heads * dim]."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        b, h, s, d = o.shape
        return o.transpose(1, 2).reshape(b, s, h * d)


_CACHE: dict = {}


def _compiled(dtype, causal: bool = False, shape=(2, 3, 70, 16)):
    key = (dtype, causal, shape)
    if key not in _CACHE:
        torch.manual_seed(0)
        model = MergedHeads(causal).eval()
        args = tuple(torch.randn(*shape).to(dtype) for _ in range(3))
        imported = import_module(model, args)
        _CACHE[key] = model, args, imported, opfuse.compile(imported.graph, backend="cpu")
    return _CACHE[key]


def _check(got, model, args, dtype):
    with torch.no_grad():
        want = model(*args).float().numpy()
    got = np.asarray(got, np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("causal", [False, True])
def test_one_attention_kernel_with_the_merge(causal):
    *_, exe = _compiled(torch.float32, causal)
    assert [k["kind"] for k in exe.report["kernels"]] == ["attention"]
    assert 'opfuse.cpu_attention = "tiles"' in exe.ir("cpu")


@pytest.mark.parametrize("path", ["tiles", "rows"])
def test_cpu_kernels_match_eager(path, monkeypatch):
    model, args, imported, _ = _compiled(torch.float32, True)
    got = cpu_outputs(imported.graph, imported.arguments(*args), path, monkeypatch)
    _check(got, model, args, torch.float32)


def test_simt_kernel_matches_eager():
    model, args, imported, exe = _compiled(torch.float32)
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention"], program.notes
    (got,) = emulate.run_program(program, imported.arguments(*args))
    _check(got, model, args, torch.float32)


def test_tensor_core_kernel_matches_eager():
    """bf16, head dim 32, 70 queries (partial query block and key tile), causal."""
    model, args, imported, exe = _compiled(torch.bfloat16, True, (2, 2, 70, 32))
    assert [k["kind"] for k in exe.report["kernels"]] == ["attention"]
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention_mma"], program.notes
    (got,) = emulate.run_program(program, imported.arguments(*args))
    _check(bf16_bits_to_float32(got), model, args, torch.bfloat16)
    bits = [float32_to_bf16_bits(np.asarray(a, np.float32)) for a in imported.arguments(*args)]
    _check(bf16_bits_to_float32(exe(*bits)), model, args, torch.bfloat16)  # the CPU tiles


def test_an_output_the_kernels_cannot_place_warns(monkeypatch):
    """The ops' loops stay correct, but the user is told they are slow, and why."""
    model, args, imported, _ = _compiled(torch.float32)
    monkeypatch.setattr(attention_plan, "_inverted", lambda *a: None)
    exe = opfuse.compile(imported.graph, backend="cpu")
    with pytest.warns(UserWarning, match=r"attention kernel @\w+ runs as its ops' loops"):
        got = exe(*imported.arguments(*args))  # the CPU code is made at the first call
    _check(got, model, args, torch.float32)


@pytest.mark.parametrize("perm", [(0, 3, 1, 2), (2, 0, 1, 3)])
def test_any_order_of_the_output_dims(perm):
    """The value dim moved off the innermost place (the tensor-core kernel stores its
    accumulator pairs along it) or the queries first: the CPU tiles and the tensor-core
    kernel (emulated) against float64, bf16."""
    from opfuse.frontends.builder.graph import Graph
    from opfuse.frontends.builder.graphs import _attention

    g = Graph("perm", dtype="bf16")
    q, k, v = (g.input(n, (2, 2, 40, 16)) for n in "qkv")
    g.output(g.transpose(_attention(g, q, k, v), perm))
    exe = opfuse.compile(g.to_mlir(), backend="cpu")
    assert [k["kind"] for k in exe.report["kernels"]] == ["attention"]
    rng = np.random.default_rng(0)
    bits = [float32_to_bf16_bits(rng.standard_normal((2, 2, 40, 16)).astype(np.float32))
            for _ in range(3)]
    qf, kf, vf = (bf16_bits_to_float32(b).astype(np.float64) for b in bits)
    s = qf @ kf.transpose(0, 1, 3, 2) / 4.0
    p = np.exp(s - s.max(-1, keepdims=True))
    want = ((p / p.sum(-1, keepdims=True)) @ vf).transpose(perm)
    program = compile_module(exe._source, lower=False)
    assert [k.emitter for k in program.kernels.values()] == ["attention_mma"], program.notes
    (gpu,) = emulate.run_program(program, bits)
    for got in (bf16_bits_to_float32(exe(*bits)), bf16_bits_to_float32(gpu)):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL[torch.bfloat16] * max(1.0, np.abs(want).max()))
