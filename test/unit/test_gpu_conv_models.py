"""The GPU kernels of the convolutional models' layers (issue 14 item 5), imported from torch
as the zoo calls them: padded 2-D convolutions (grouped, strided, dilated) with BatchNorm
and ReLU, padded max and average pooling (the CNN); Whisper's padded 1-D convolution stem;
Wav2Vec2's feature encoder and its padded, grouped, weight-normed positional convolution
(the real ``transformers`` modules); ViT's patch embedding. Each program's kernels are
built by their own emitters (the convolutions by ``conv``; the fallback only where
``FALLBACK`` says why), run
in the emulator (race check on) against eager (f32: max error <= 1e-4 * max(1, max
|eager|)), and assemble with 0 spills at sm_80 and sm_90 when ptxas is there. The whole
zoo models' GPU kernels: ``python -m bench.zoo_gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas  # noqa: E402
from opfuse.frontends.torch.importer import import_module  # noqa: E402

from test_codegen_common import compile_cpu  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class WhisperStem(nn.Module):
    """WhisperEncoder's convolutions: GELU(conv1(x)), GELU(conv2(.)) with padding 1, the
    second with stride 2, then (batch, frames, channels)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(16, 32, 3, padding=1)
        self.conv2 = nn.Conv1d(32, 32, 3, stride=2, padding=1)

    def forward(self, x):
        x = nn.functional.gelu(self.conv1(x))
        return nn.functional.gelu(self.conv2(x)).permute(0, 2, 1)


class PatchEmbedding(nn.Module):
    """ViT's patch embedding: an 8x8 convolution with stride 8, flattened to tokens."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 32, 8, stride=8)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


def _cnn():
    from test_torch_conv import MODELS

    return MODELS["conv2d_bn_relu_pool"][0]()


def _wav2vec2(part: str):
    transformers = pytest.importorskip("transformers")
    from transformers.models.wav2vec2 import modeling_wav2vec2 as w2v

    config = transformers.Wav2Vec2Config(
        hidden_size=32, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    if part == "features":
        return w2v.Wav2Vec2FeatureEncoder(config)
    return w2v.Wav2Vec2PositionalConvEmbedding(config)


#: Kernels left to the sequential fallback, and why: none. The weight norm over the
#: filter's dims 0 and 1 (``dim=2`` kept), a column reduction the rows emitter does not
#: cover, was one; it is a ``columns`` kernel now (opfuse-fuse-columns: the norm and
#: v / norm * g in one kernel, a thread per kept column).
FALLBACK: dict[str, str] = {}
#: Column reductions each case has (built by the column emitter).
COLUMNS = {"wav2vec2_positional_conv": 1}

CASES = {
    "cnn_padded_conv_and_pooling": (_cnn, (2, 3, 16, 16)),
    "whisper_conv_stem": (WhisperStem, (2, 16, 32)),
    "wav2vec2_feature_encoder": (lambda: _wav2vec2("features"), (2, 400)),
    "wav2vec2_positional_conv": (lambda: _wav2vec2("positions"), (2, 39, 32)),  # (batch, frames, hidden)
    "vit_patch_embedding": (PatchEmbedding, (2, 3, 32, 32)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gpu_kernels_match_eager(name):
    factory, shape = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(*shape)
    with torch.no_grad():
        want = model(x)
    want = want if isinstance(want, tuple) else (want,)
    imported = import_module(model, (x,))
    have_ptxas = ptxas.find_ptxas() is not None
    program = compile_cpu(imported.graph).gpu_program(("sm_80", "sm_90"), ptxas=have_ptxas)
    emitters = [k.emitter for k in program.kernels.values()]
    allowed = FALLBACK.get(name)
    assert emitters.count("fallback") == (1 if allowed else 0), program.notes
    assert all(allowed and allowed in note for note in program.notes), program.notes
    assert "conv" in emitters, emitters
    assert emitters.count("columns") == COLUMNS.get(name, 0), emitters
    if have_ptxas:
        for k in program.kernels.values():
            for chip in ("sm_80", "sm_90"):
                res = k.resources[chip]
                assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (k.name, chip, res)
    got = emulate.run_program(program, imported.arguments(x))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.numpy()
        assert g.shape == w.shape
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * scale)
