"""The torch importer (opfuse.frontends.torch.importer): numerics against torch eager, the IR it
writes, kernel counts after fusion against the hand-written G graphs, and its errors.

Numerics compare ``ImportedGraph.reference`` (the builder's numpy evaluation of the
imported graph: every op in float64, rounded to the graph dtype) with torch eager on the
CPU. Tolerance: max |reference - torch| <= TOL[dtype] * max |torch| (a few units in the
last place of the dtype: f32 1e-5, f16 5e-3, bf16 4e-2; measured worst cases on these
models: 9e-7, 1.6e-3, 1.2e-2).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from opfuse import ir as oir  # noqa: E402
from opfuse.report.tables import module_totals  # noqa: E402
from opfuse.errors import OpfuseError  # noqa: E402
from opfuse.frontends.torch.importer import (  # noqa: E402
    ImportedGraph,
    UnsupportedOpError,
    import_fx,
    import_module,
)
from torch_models import (  # noqa: E402
    CONCAT,
    MASKS,
    module_of,
    Attention,
    RMSNormSwiGLU,
    Softmax,
    encoder_layer,
    seed_mlp,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOL = {"f32": 1e-5, "f16": 5e-3, "bf16": 4e-2}
PASSES = ("fuse_elementwise", "fuse_producer_consumer", "fuse_reduction", "outline")
# torch.export's own deprecation noise, not ours
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


# --------------------------------------------------------------------------- models


class PreNormEncoder(nn.Module):
    """G6 as PyTorch: pre-norm layer, separate Q/K/V/O projections, GELU(tanh) FFN,
    tokens flattened to 2-D up front like the builder graph."""

    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ffn1, self.ffn2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.attn = Attention()

    def forward(self, x):
        b, t, d = x.shape
        tokens = x.reshape(b * t, d)
        h = self.ln1(tokens)

        def heads(proj):
            return proj(h).reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

        o = self.attn(heads(self.q), heads(self.k), heads(self.v))
        h1 = tokens + self.o(o.transpose(1, 2).reshape(b * t, d))
        f = F.gelu(self.ffn1(self.ln2(h1)), approximate="tanh")
        return (h1 + self.ffn2(f)).reshape(b, t, d)


class PreNormEncoder3D(PreNormEncoder):
    """The same layer written the usual way: 3-D activations, SDPA, view/transpose."""

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)

        def heads(proj):
            return proj(h).view(b, t, self.heads, -1).transpose(1, 2)

        o = F.scaled_dot_product_attention(heads(self.q), heads(self.k), heads(self.v))
        x = x + self.o(o.transpose(1, 2).reshape(b, t, d))
        return x + self.ffn2(F.gelu(self.ffn1(self.ln2(x)), approximate="tanh"))


# name -> (model factory, input shapes) for the numerics tests
NUMERICS: dict[str, tuple[Callable[[], nn.Module], list[tuple[int, ...]]]] = {
    "seed_mlp_tanh": (seed_mlp, [(2048, 256)]),
    "seed_mlp_erf": (lambda: seed_mlp(approximate="none"), [(2048, 256)]),
    "layernorm": (lambda: nn.LayerNorm(256), [(512, 256)]),
    "softmax": (Softmax, [(512, 256)]),
    "attention": (Attention, [(2, 4, 64, 32)] * 3),
    "causal_attention": (lambda: MASKS["causal_sdpa"][0](), [(2, 4, 64, 32)] * 3),
    "rmsnorm_swiglu": (lambda: RMSNormSwiGLU(256, 512), [(256, 256)]),
    "encoder_layer": (encoder_layer, [(2, 32, 256)]),
}
# f16/bf16 runs use smaller batches where the f32 run is the seed's full size
HALF_SHAPES = {"seed_mlp_tanh": [(256, 256)], "seed_mlp_erf": [(256, 256)]}


def _make(name: str, dtype: str, shapes=None):
    torch.manual_seed(0)
    factory, default_shapes = NUMERICS[name]
    model = factory().eval().to(DTYPES[dtype])
    inputs = tuple(torch.randn(*s).to(DTYPES[dtype]) for s in shapes or default_shapes)
    return model, inputs


def _assert_close(got: np.ndarray, want, dtype: str) -> None:
    want = want.detach().float().numpy().astype(np.float64)
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= TOL[dtype] * scale, f"max error {err:.3g} > {TOL[dtype]} * {scale:.3g}"


def _fused_totals(module):
    for name in PASSES:
        p = importlib.import_module(f"opfuse.passes.{name}")
        p.run(module, p.Options())
    return module_totals(module)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", list(NUMERICS))
def test_matches_torch_eager(name: str, dtype: str):
    shapes = HALF_SHAPES.get(name) if dtype != "f32" else None
    model, inputs = _make(name, dtype, shapes)
    imported = import_module(model, inputs)
    oir.parse_module(imported.to_mlir())  # the text the passes get is valid MLIR
    with torch.no_grad():
        want = model(*inputs)
    (got,) = imported.reference(*inputs)
    _assert_close(got, want, dtype)


def test_parameters_are_trailing_arguments():
    model, inputs = _make("seed_mlp_tanh", "f32", [(8, 256)])
    imported = import_module(model, inputs)
    assert [(i.kind, i.target) for i in imported.inputs] == [
        ("user", None),
        ("parameter", "0.weight"),
        ("parameter", "0.bias"),
        ("parameter", "2.weight"),
        ("parameter", "2.bias"),
    ]
    # the module's own tensors, passed as arguments, never copied into the IR
    assert all(p is q for p, q in zip(imported.params, model.parameters()))
    text = imported.to_mlir()
    assert "func.func @forward(%input: tensor<8x256xf32>" in text
    assert "%p_0_weight: tensor<256x256xf32>" in text
    assert "dense<" not in text and imported.outputs == ["gelu_1"]


def test_import_fx_from_dynamo():
    model, inputs = _make("seed_mlp_tanh", "f32", [(16, 256)])
    seen: list[tuple[ImportedGraph, list]] = []

    def backend(gm, example_inputs):
        seen.append((import_fx(gm, example_inputs), list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(model, backend=backend, dynamic=False)(*inputs)
    ((imported, arguments),) = seen
    # Dynamo lifts parameters to graph inputs: every argument is one the backend receives
    assert imported.params == [] and len(imported.user_inputs) == len(arguments) == 5
    (got,) = imported.reference(*arguments)
    _assert_close(got, want, "f32")


# --------------------------------------------------------------------------- more ops


OPS = {
    "chunk": (lambda x: sum(c * (i + 1) for i, c in enumerate(x.chunk(3, dim=-1))), [(4, 9)]),
    "split_slice_step": (lambda x: torch.split(x, [4, 5], 1)[1].exp() + x[:, ::2], [(4, 9)]),
    "unbind_select": (lambda x: x.unbind(0)[2] + x[1], [(3, 5)]),
    "var": (lambda x: x.var(-1, keepdim=True) + x.var(0), [(6, 6)]),
    "log_softmax_axis0": (lambda x: F.log_softmax(x, 0) + torch.softmax(x, 0), [(5, 8)]),
    "abs_clamp_relu6": (lambda x: x.abs().clamp(0.2, 0.7) + F.relu6(x) + F.hardtanh(x), [(4, 8)]),
    "sum_mean_amax": (lambda x: x.sum() + x.mean() + x.amax(-1, keepdim=True), [(4, 8)]),
    "matmul_3d_2d": (lambda x, w: x @ w, [(2, 3, 4), (4, 5)]),
    "matmul_broadcast": (lambda x, w: x @ w, [(2, 3, 4), (2, 1, 4, 5)]),
    "matmul_5d": (lambda x, w: x @ w, [(2, 2, 2, 3, 4), (2, 2, 2, 4, 5)]),
    "matmul_1d": (lambda x, w: (x @ w) + (w @ x[0]).sum(), [(3, 4), (4,)]),
    "sdpa_mask_scale": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
        [(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8), (4, 6)],
    ),
    "layernorm_2d": (nn.LayerNorm((4, 8)), [(3, 4, 8)]),
    "rmsnorm_default_eps": (nn.RMSNorm(8), [(3, 8)]),
    "arith": (
        lambda x, y: (x * x + 1).reciprocal()
        + x.pow(3)
        + (x * x + 1).pow(0.5)
        + torch.rsub(x, 1.0)
        + torch.sub(x, y, alpha=2)
        + torch.add(x, y, alpha=0.5)
        + torch.maximum(x, y)
        - torch.minimum(x, y)
        + x / 3,
        [(3, 8), (8,)],
    ),
    "unary": (
        lambda x: F.silu(x)
        + torch.sigmoid(x) * torch.tanh(x)
        - torch.erf(x)
        + torch.exp(x).log()
        + torch.sqrt(x * x)
        + torch.rsqrt(x * x + 1)
        + F.relu(-x),
        [(3, 8)],
    ),
    "shapes": (
        lambda x: x.unsqueeze(1).expand(3, 4, 8).reshape(12, 8)
        + x.repeat(4, 1)
        + x.t().contiguous().view(8, 3).t().repeat(4, 1).squeeze(),
        [(3, 8)],
    ),
    "tensor_constant": (lambda x: x * torch.tensor(2.0) + 1, [(4, 8)]),
}


@pytest.mark.parametrize("name", list(OPS))
def test_more_ops(name: str):
    f, shapes = OPS[name]
    torch.manual_seed(0)
    model = (f if isinstance(f, nn.Module) else module_of(f)).eval()
    inputs = tuple(torch.randn(*s) for s in shapes)
    imported = import_module(model, inputs)
    oir.parse_module(imported.to_mlir())
    with torch.no_grad():
        want = model(*inputs)
    (got,) = imported.reference(*inputs)
    _assert_close(got, want, "f32")


# --------------------------------------------------------------------------- masks


def _mask_model(name: str) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    factory, inputs = MASKS[name]
    return factory().eval(), inputs()


def _reference_matches_eager(model: nn.Module, inputs: tuple) -> str:
    """Import ``model``; every output of its reference matches eager (f32). Returns the
    imported MLIR text (checked to parse)."""
    imported = import_module(model, inputs)
    text = imported.to_mlir()
    oir.parse_module(text)
    with torch.no_grad():
        want = torch.utils._pytree.tree_flatten(model(*inputs))[0]
    got = imported.reference(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _assert_close(g, w, "f32")
    return text


@pytest.mark.parametrize("name", list(MASKS))
def test_masks_match_torch_eager(name: str):
    text = _reference_matches_eager(*_mask_model(name))
    assert "xi1>" not in text  # booleans are i8 tensors; i1 only inside bodies


def test_causal_mask_is_iotas_fused_into_the_softmax():
    """SDPA's is_causal compares two iotas of the scores' shape: the mask costs no kernel and
    no bytes, the program fuses like unmasked attention (QKᵀ, softmax, PV)."""
    model, inputs = _mask_model("causal_sdpa")
    causal = import_module(model, inputs)
    text = causal.to_mlir()
    assert text.count("linalg.index") == 2 and "arith.cmpi sge" in text
    assert "arith.select" in text and "0xFF800000" in text  # where(mask, s, -inf)
    plain = import_module(Attention().eval(), inputs)
    fused, unmasked = _fused_totals(causal.graph.to_module()), _fused_totals(
        plain.graph.to_module()
    )
    assert fused.kernels == unmasked.kernels == 3
    assert fused.bytes == unmasked.bytes


def test_masked_fill_constant_is_folded_into_the_where():
    """``masked_fill(m, -inf)`` decomposes to ``where(m, scalar_tensor(-inf), x)``: the
    scalar tensor becomes a constant of the where's body, not a tensor input."""
    model, inputs = _mask_model("gpt2_masked_fill")
    text = import_module(model, inputs).to_mlir()
    end = text.rindex('loc("where")')
    where = text[text.rindex("linalg.generic", 0, end) : end]
    assert " : tensor<1x1x16x16xi8>, tensor<2x4x16x16xf32>) outs(" in where  # 2 inputs
    assert "arith.constant 0xFF800000 : f32" in where and "arith.select" in where
    assert "arith.cmpf oeq" in text  # bias == 0 on the float buffer


def test_bool_argument_is_passed_as_int8():
    model, inputs = _mask_model("sdpa_bool_mask")
    imported = import_module(model, inputs)
    assert [i.dtype for i in imported.inputs] == ["f32", "f32", "f32", "i8"]
    assert "%mask: tensor<2x1x16x16xi8>" in imported.to_mlir()
    args = imported.arguments(*inputs)
    assert args[3].dtype == np.int8 and set(np.unique(args[3])) <= {0, 1}


# --------------------------------------------------------------------------- concatenation


@pytest.mark.parametrize("name", list(CONCAT))
def test_concat_models_match_torch_eager(name: str):
    torch.manual_seed(0)
    factory, make_inputs = CONCAT[name]
    assert "tensor.concat" in _reference_matches_eager(factory().eval(), make_inputs())


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_rope_half_precision_matches_torch_eager(dtype: str):
    factory, make_inputs = CONCAT["rope"]
    torch.manual_seed(0)
    inputs = tuple(t.to(DTYPES[dtype]) for t in make_inputs())
    model = factory().eval()
    (got,) = import_module(model, inputs).reference(*inputs)
    _assert_close(got, model(*inputs), dtype)


def test_rope_is_one_loop_kernel():
    """x * cos + cat(-x2, x1) * sin: 7 ops (two slices, neg, cat, two muls, add), one loop
    kernel after fusion, moving x, cos and sin in and the result out, nothing else."""
    factory, make_inputs = CONCAT["rope"]
    x, cos, sin = make_inputs()
    totals = _fused_totals(import_module(factory().eval(), (x, cos, sin)).graph.to_module())
    assert totals.kernels == 1
    assert totals.bytes == 4 * (2 * x.numel() + cos.numel() + sin.numel())


def test_llama_attention_applies_rope_in_one_kernel_per_projection():
    factory, make_inputs = CONCAT["llama_attention"]
    module = import_module(factory().eval(), make_inputs()).graph.to_module()
    _fused_totals(module)
    text = oir.print_module(module)
    kernels = re.split(r"(?=func\.func )", text)
    rope = [k for k in kernels if "tensor.concat dim(3)" in k]  # rotate_half of q and of k
    assert len(rope) == 2
    for k in rope:
        assert 'opfuse.kind = "loop"' in k.splitlines()[0] and "arith.negf" in k


# --------------------------------------------------------------------------- kernel counts


def _g_models() -> dict[str, tuple[nn.Module, tuple]]:
    """Torch versions of G1, G3-G7 at the sizes of examples/g*.mlir (planning only: the
    inputs are never read, so they are left uninitialized)."""
    torch.manual_seed(0)
    e = torch.empty
    return {
        "g1_mlp": (seed_mlp(), (e(2048, 256),)),
        "g3_softmax": (Softmax(), (e(4096, 4096),)),
        "g4_layernorm": (nn.LayerNorm(4096), (e(4096, 4096),)),
        "g5_attention": (Attention(), tuple(e(8, 8, 512, 64) for _ in range(3))),
        "g6_encoder_layer": (PreNormEncoder(512, 8, 2048), (e(8, 256, 512),)),
        "g6_encoder_layer:3d": (PreNormEncoder3D(512, 8, 2048), (e(8, 256, 512),)),
        "g7_rmsnorm_swiglu": (RMSNormSwiGLU(1024, 2816), (e(4096, 1024),)),
    }


# (hand-written, imported) kernel counts before fusion: the imported Linear layers add
# one weight transpose each, which producer-consumer fusion folds into the matmul.
UNFUSED = {
    "g1_mlp": (20, 22),
    "g3_softmax": (5, 5),
    "g4_layernorm": (11, 11),
    "g5_attention": (15, 15),
    "g6_encoder_layer": (69, 75),
    "g6_encoder_layer:3d": (69, 85),
    "g7_rmsnorm_swiglu": (13, 16),
}


@pytest.mark.parametrize("name", list(UNFUSED))
def test_fused_kernel_counts_match_hand_written(name: str):
    model, inputs = _g_models()[name]
    imported = import_module(model.eval(), inputs, name=name.split(":")[0])
    mine = imported.graph.to_module()
    theirs = oir.load(EXAMPLES / f"{name.split(':')[0]}.mlir")
    assert (module_totals(theirs).kernels, module_totals(mine).kernels) == UNFUSED[name]
    fused_mine, fused_theirs = _fused_totals(mine), _fused_totals(theirs)
    assert fused_mine.kernels == fused_theirs.kernels
    assert fused_mine.bytes == fused_theirs.bytes  # same kernels, same traffic


# --------------------------------------------------------------------------- errors


class SingularValues(nn.Module):
    def forward(self, x):
        return torch.linalg.svdvals(x)


def test_unsupported_op_names_op_and_module():
    model = nn.Sequential(nn.Linear(8, 8), SingularValues()).eval()
    with pytest.raises(UnsupportedOpError, match=r"aten\._linalg_svd") as info:
        import_module(model, (torch.randn(4, 8),))
    assert isinstance(info.value, OpfuseError)
    assert info.value.op == "aten._linalg_svd.default"
    assert "module '1'" in info.value.where and "SingularValues" in info.value.where
    assert "torch.linalg.svdvals(x)" in info.value.where  # the user's source line


def test_unsupported_argument_is_named():
    attn = module_of(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1))
    qkv = tuple(torch.randn(1, 2, 4, 8) for _ in range(3))
    with pytest.raises(UnsupportedOpError, match="scaled_dot_product_attention.*dropout_p"):
        import_module(attn, qkv)


@pytest.mark.parametrize(
    "f, match",
    [
        (lambda x: x.to(torch.float64), r"aten\._to_copy.*dtype torch\.float64"),
        (lambda x: x.long().sum(), r"aten\.sum.*reduction of i64"),  # a count of bools compiles
        (lambda x: x.long() & x.long(), r"aten\.bitwise_and.*booleans only"),
    ],
)
def test_builder_gaps_are_errors(f, match):
    with pytest.raises(UnsupportedOpError, match=match):
        import_module(module_of(f), (torch.randn(2, 3),))


def test_unheld_inputs_and_training_dropout_are_errors():
    with pytest.raises(OpfuseError, match="dtype torch.float64"):
        import_module(module_of(lambda x: x * 2), (torch.ones(2, 3, dtype=torch.float64),))
    with pytest.raises(OpfuseError, match="dropout"):
        import_module(nn.Dropout(0.5).train(), (torch.randn(2, 3),))


def test_core_package_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import opfuse, opfuse.frontends.torch.importer, opfuse.frontends.torch.decompositions\n"
        "try:\n"
        "    import torch\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
