"""The model zoo: Hugging Face ``transformers`` models built from their config objects (small
sizes, random weights, nothing downloaded), a small CNN and an embedding classifier, each
with the inputs it is normally called with (token ids and ``attention_mask``; pixels;
audio features).

Used by ``python -m bench --zoo`` (``bench.zoo``) and the model-zoo test
(``test/unit/test_model_zoo.py``). Needs ``torch`` and, for the transformers models,
``transformers`` (the ``zoo`` extra pins the version that accepts torch 2.13.0).
``HF_HUB_OFFLINE=1`` is set before ``transformers`` is imported: a model built from a config
never reaches the hub, and this makes sure of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

#: Sizes shared by the language models: small enough that the whole zoo compiles in minutes
#: on two cores, large enough that every code path (several heads, grouped KV heads, two
#: layers, a padded attention mask) is exercised.
BATCH, SEQ, VOCAB, HIDDEN, LAYERS, HEADS = 2, 8, 128, 32, 2, 4


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry.

    Attributes:
        name: Short name (the table's row).
        family: ``language`` (token ids in; every op must compile), ``vision`` or ``audio``.
        build: Makes the model (eval mode, seeded random weights).
        inputs: Makes the keyword arguments it is called with.
        fast: Part of the CI subset (``test_model_zoo.py`` without ``--runslow``).
    """

    name: str
    family: str
    build: Callable[[], Any]
    inputs: Callable[[], dict[str, Any]]
    fast: bool = False


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _seeded(make: Callable[[], Any]) -> Any:
    import torch

    torch.manual_seed(0)
    return make().eval()


def _token_inputs(*, token_types: bool = False, pad: bool = True) -> dict[str, Any]:
    """Token ids and an attention mask whose second row is right-padded by 3 tokens."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    if pad:
        mask[1, SEQ - 3 :] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        out["token_type_ids"] = (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ)
    return out


def _hf(config_name: str, model_name: str, **config: Any) -> Callable[[], Any]:
    def build() -> Any:
        tf = _transformers()
        cfg = getattr(tf, config_name)(**config)
        if model_name == "WhisperEncoder":  # not exported at the top level
            from transformers.models.whisper.modeling_whisper import WhisperEncoder

            return _seeded(lambda: WhisperEncoder(cfg))
        return _seeded(lambda: getattr(tf, model_name)(cfg))

    return build


_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=2 * HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    max_position_embeddings=64,
)
_GQA = dict(_DECODER, num_key_value_heads=2)
_ENCODER = _DECODER  # BERT-style configs take the same names


def _vision_inputs() -> dict[str, Any]:
    import torch

    return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(2))}


def _whisper_inputs() -> dict[str, Any]:
    import torch

    # (batch, mel bins, frames): Whisper's encoder wants 2 * max_source_positions frames
    return {"input_features": torch.randn(BATCH, 16, 32, generator=torch.Generator().manual_seed(3))}


def _wav2vec2_inputs() -> dict[str, Any]:
    import torch

    return {"input_values": torch.randn(BATCH, 400, generator=torch.Generator().manual_seed(4))}


def _small_cnn() -> Any:
    import torch.nn as nn

    class SmallCNN(nn.Sequential):
        """conv-BN-ReLU, max pool, strided conv-BN-ReLU, global average pool, linear."""

        def forward(self, pixel_values: Any) -> Any:
            return super().forward(pixel_values)

    return _seeded(
        lambda: SmallCNN(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 10),
        )
    )


def _embedding_classifier() -> Any:
    import torch
    import torch.nn as nn

    class EmbeddingClassifier(nn.Module):
        """Mean of the unmasked token embeddings, then a linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
            self.head = nn.Linear(HIDDEN, 5)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            m = attention_mask.unsqueeze(-1).to(torch.float32)
            pooled = (self.embed(input_ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
            return self.head(pooled)

    return _seeded(EmbeddingClassifier)


ZOO: list[ZooModel] = [
    ZooModel("gpt2", "language", _hf("GPT2Config", "GPT2Model", vocab_size=VOCAB, n_embd=HIDDEN,
             n_layer=LAYERS, n_head=HEADS, n_positions=64), _token_inputs, fast=True),
    ZooModel("bert", "language", _hf("BertConfig", "BertModel", **_ENCODER),
             lambda: _token_inputs(token_types=True), fast=True),
    ZooModel("roberta", "language", _hf("RobertaConfig", "RobertaModel", **_ENCODER,
             pad_token_id=1), _token_inputs),
    ZooModel("distilbert", "language", _hf("DistilBertConfig", "DistilBertModel",
             vocab_size=VOCAB, dim=HIDDEN, hidden_dim=2 * HIDDEN, n_layers=LAYERS,
             n_heads=HEADS, max_position_embeddings=64), _token_inputs),
    ZooModel("llama", "language", _hf("LlamaConfig", "LlamaModel", **_GQA), _token_inputs,
             fast=True),
    ZooModel("mistral", "language", _hf("MistralConfig", "MistralModel", **_GQA), _token_inputs),
    ZooModel("qwen2", "language", _hf("Qwen2Config", "Qwen2Model", **_GQA), _token_inputs),
    ZooModel("qwen3", "language", _hf("Qwen3Config", "Qwen3Model", **_GQA, head_dim=8),
             _token_inputs),
    ZooModel("gemma", "language", _hf("GemmaConfig", "GemmaModel", **_GQA, head_dim=8),
             _token_inputs),
    ZooModel("phi", "language", _hf("PhiConfig", "PhiModel", **_DECODER), _token_inputs),
    ZooModel("gpt_neox", "language", _hf("GPTNeoXConfig", "GPTNeoXModel", **_DECODER),
             _token_inputs),
    ZooModel("t5_encoder", "language", _hf("T5Config", "T5EncoderModel", vocab_size=VOCAB,
             d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
             num_heads=HEADS), _token_inputs),
    ZooModel("vit", "vision", _hf("ViTConfig", "ViTModel", hidden_size=HIDDEN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
             image_size=32, patch_size=8), _vision_inputs),
    ZooModel("whisper_encoder", "audio", _hf("WhisperConfig", "WhisperEncoder", d_model=HIDDEN,
             encoder_layers=LAYERS, encoder_attention_heads=HEADS, encoder_ffn_dim=2 * HIDDEN,
             num_mel_bins=16, max_source_positions=16), _whisper_inputs),
    ZooModel("wav2vec2", "audio", _hf("Wav2Vec2Config", "Wav2Vec2Model", hidden_size=HIDDEN,
             num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
             conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), _wav2vec2_inputs),
    ZooModel("small_cnn", "vision", _small_cnn, _vision_inputs, fast=True),
    ZooModel("embedding_classifier", "language", _embedding_classifier, _token_inputs, fast=True),
]

BY_NAME = {m.name: m for m in ZOO}
