"""The model zoo check-step and benchmarks/docs/measured.py run: ten architectures built from their own config
classes (Hugging Face transformers) at a size a CPU trains a step of in well under a second, plus MLP-Mixer
(mixer.py). Each model's forward returns its training loss (language models: next-token or masked-token
cross-entropy against the inputs; encoder-decoder: the decoder's; image models: classification against random
labels), so its step is ``loss.backward(); optimizer.step()``. Weights are random (``torch.manual_seed(0)``):
timing does not depend on them, except MoE routing, which is whatever the random router picks.

Sizes: 2 layers (ResNet-50 and ConvNeXt keep their stage depths), hidden 256 for the transformers,
sequence 128 at batch 4, images 64x64 at batch 4 (ResNet-50 at batch 2 and half width: its 23 M parameters at
full width make the Adam step alone dominate), vocabulary 2048.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshplan.errors import MissingDependency

V, B, S, IMAGE = 2048, 4, 128, 64


@dataclass(frozen=True, kw_only=True)
class ZooModel:
    name: str
    title: str  # what it is, with its config class
    build: Callable[[], tuple[Any, tuple[Any, ...]]]  # -> (module whose forward returns the loss, inputs)


def _hf(model_cls: str, config_cls: str, keys: tuple[str, ...], **config: Any) -> Callable[[], Any]:
    """A builder of the Hugging Face model ``model_cls`` from ``config_cls(**config)``, wrapped to return
    ``.loss`` from keyword inputs ``keys``."""

    def build() -> Any:
        import torch

        try:
            import transformers
        except ModuleNotFoundError:
            raise MissingDependency("transformers", "transformers") from None
        # the configs' own warnings (GPT-2's default bos / eos ids beyond a small vocabulary, an unset loss_type)
        # concern generation, not the training step measured here
        transformers.logging.set_verbosity_error()
        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg)  # attention: transformers' default, SDPA where supported

        class Loss(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.model = inner

            def forward(self, *args: Any) -> Any:
                return self.model(**dict(zip(keys, args, strict=True))).loss

        return Loss(model).train()

    return build


def _tokens(*, labels: bool = True, decoder: bool = False) -> Callable[[], tuple[Any, ...]]:
    def make() -> tuple[Any, ...]:
        import torch

        ids = torch.randint(0, V, (B, S))
        return (ids, ids.clone()) if labels and not decoder else (ids, torch.randint(0, V, (B, S // 2)))

    return make


def _images(batch: int = B, classes: int = 100) -> Callable[[], tuple[Any, ...]]:
    def make() -> tuple[Any, ...]:
        import torch

        return torch.randn(batch, 3, IMAGE, IMAGE), torch.randint(0, classes, (batch,))

    return make


def _pair(model: Callable[[], Any], inputs: Callable[[], tuple[Any, ...]]) -> Callable[[], tuple[Any, tuple]]:
    def build() -> tuple[Any, tuple]:
        import torch

        torch.manual_seed(0)
        m = model()
        return m, inputs()

    return build


def _mixer() -> Any:
    from meshplan_research.mixer import MlpMixer

    return MlpMixer(image=IMAGE, patch=8, channels=256, depth=4, token_hidden=128, channel_hidden=1024).train()


LM = dict(vocab_size=V, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=S)
ZOO = {z.name: z for z in [
    ZooModel(name="gpt2", title="GPT-2 (GPT2Config: 2 layers, 256 hidden, 4 heads)", build=_pair(_hf(
        "GPT2LMHeadModel", "GPT2Config", ("input_ids", "labels"), vocab_size=V, n_embd=256, n_layer=2, n_head=4,
        n_positions=S), _tokens())),
    ZooModel(name="llama", title="Llama (LlamaConfig: 2 layers, 256 hidden, 4 heads, 2 KV heads, SwiGLU 688)",
             build=_pair(_hf("LlamaForCausalLM", "LlamaConfig", ("input_ids", "labels"), **LM, intermediate_size=688,
                             num_key_value_heads=2), _tokens())),
    ZooModel(name="mistral", title="Mistral (MistralConfig: 2 layers, 256 hidden, 8 heads, 2 KV heads, window 64)",
             build=_pair(_hf("MistralForCausalLM", "MistralConfig", ("input_ids", "labels"),
                             **{**LM, "num_attention_heads": 8}, intermediate_size=704, num_key_value_heads=2,
                             sliding_window=64), _tokens())),
    ZooModel(name="qwen-moe", title="Qwen MoE (Qwen2MoeConfig: 2 layers, 256 hidden, 8 experts top-2 of 128, "
             "shared expert 256)", build=_pair(_hf(
                 "Qwen2MoeForCausalLM", "Qwen2MoeConfig", ("input_ids", "labels"), **LM, num_key_value_heads=2,
                 intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                 num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1), _tokens())),
    ZooModel(name="bert", title="BERT (BertConfig: 2 layers, 256 hidden, 4 heads, masked LM)", build=_pair(_hf(
        "BertForMaskedLM", "BertConfig", ("input_ids", "labels"), **LM, intermediate_size=1024), _tokens())),
    ZooModel(name="t5", title="T5 (T5Config: 2 + 2 layers, d_model 256, 4 heads, decoder length 64)",
             build=_pair(_hf("T5ForConditionalGeneration", "T5Config", ("input_ids", "labels"), vocab_size=V,
                             d_model=256, d_kv=64, d_ff=1024, num_layers=2, num_heads=4, decoder_start_token_id=0,
                             pad_token_id=0),
                         _tokens(decoder=True))),
    ZooModel(name="vit", title="ViT (ViTConfig: 64x64 images, 8x8 patches, 2 layers, 256 hidden)", build=_pair(_hf(
        "ViTForImageClassification", "ViTConfig", ("pixel_values", "labels"), image_size=IMAGE, patch_size=8,
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, num_labels=100),
        _images())),
    ZooModel(name="resnet50", title="ResNet-50 (ResNetConfig: bottleneck stages 3-4-6-3 at half width, batch 2)",
             build=_pair(_hf("ResNetForImageClassification", "ResNetConfig", ("pixel_values", "labels"),
                             layer_type="bottleneck", depths=[3, 4, 6, 3], embedding_size=32,
                             hidden_sizes=[128, 256, 512, 1024], num_labels=100), _images(batch=2))),
    ZooModel(name="convnext", title="ConvNeXt (ConvNextConfig: stages 1-1-3-1, widths 48-96-192-384)",
             build=_pair(_hf("ConvNextForImageClassification", "ConvNextConfig", ("pixel_values", "labels"),
                             depths=[1, 1, 3, 1], hidden_sizes=[48, 96, 192, 384], num_labels=100), _images())),
    ZooModel(name="mlp-mixer", title="MLP-Mixer (Tolstikhin et al. 2021: 4 blocks, 256 channels, 8x8 patches)",
             build=_pair(_mixer, _images())),
]}

