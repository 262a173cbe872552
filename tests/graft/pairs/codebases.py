"""Tiny models of real code bases, each built the way that code base builds it.

Every architecture has a builder taking ``deeper`` (one more block: a broken twin) and ``heads``
(another head count with the same tensor shapes: a broken twin), a runner calling the library's
own forward, and the inputs it takes. Configurations are tiny; weights are random (seeded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn

from tests.graft.pairs import stubs
from tests.graft.pairs.handwritten import GptFastLlama, NeoXGPT
from tests.models import MetaLlama, NanoGPT

stubs.install()
for _package in ("torchtune", "torchtune.models", "torchtune.models.llama3"):
    stubs.bare_package(_package)

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, FFN = 96, 64, 2, 4, 2, 112
TWIN_HEADS = 2  # with TWIN_KV_HEADS: the same tensor shapes as HEADS, KV_HEADS
TWIN_KV_HEADS = 1
CHANNELS = (16, 32, 64, 128)  # the ResNets' stage widths (their stems are 64 wide)


@dataclass(frozen=True)
class Inputs:
    """One batch of every kind of input, fixed by a seed."""

    tokens: torch.Tensor
    images: torch.Tensor
    mel: torch.Tensor
    audio: torch.Tensor

    @classmethod
    def make(cls, seed: int = 0) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(3, VOCAB - 1, (2, 12), generator=generator)
        tokens[:, -1] = VOCAB - 1  # CLIP pools at the largest id (its end-of-text token)
        return cls(tokens, torch.randn(2, 3, 32, 32, generator=generator),
                   torch.randn(2, 16, 16, generator=generator),
                   torch.randn(2, 1, 64, generator=generator))  # mono waveforms, 8 codec frames


Runner = Callable[[nn.Module, Inputs], torch.Tensor]


@dataclass(frozen=True)
class Arch:
    """One code base's model.

    Attributes:
        name: Shown in test ids and the results table.
        codebase: The package (or hand-written layout) it comes from.
        build: ``build(deeper=False, heads=None)``.
        run: The library's own forward, to one output tensor.
        inputs: The positional inputs for ``tg.graft(example_inputs=...)``, or ``None`` where
            the forward needs keywords.
        saves: Writes the library's own saved folder (``save_pretrained``), if it has one.
    """

    name: str
    codebase: str
    build: Callable[..., nn.Module]
    run: Runner
    inputs: Callable[[Inputs], tuple[torch.Tensor, ...] | None]
    saves: Callable[[nn.Module, Path], Path] | None = None


def _heads(heads: int | None) -> tuple[int, int]:
    return (HEADS, KV_HEADS) if heads is None else (heads, TWIN_KV_HEADS)


def _save_pretrained(model: nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)  # type: ignore[operator]
    return folder


def _timm_save(model: nn.Module, folder: Path) -> Path:
    from timm.models import save_for_hf

    save_for_hf(model, str(folder))
    return folder


def _tokens(x: Inputs) -> tuple[torch.Tensor, ...]:
    return (x.tokens,)


def _images(x: Inputs) -> tuple[torch.Tensor, ...]:
    return (x.images,)


def _logits(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.tokens).logits


def _image_logits(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.images).logits


def _plain_tokens(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.tokens)


def _plain_images(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.images)


# transformers ---------------------------------------------------------------------------------

def hf_gpt_neox(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS + deeper,
        num_attention_heads=_heads(heads)[0], intermediate_size=4 * DIM, rotary_pct=0.25,
        max_position_embeddings=64, tie_word_embeddings=False, use_parallel_residual=True)
    return transformers.GPTNeoXForCausalLM(config)


def hf_llama(deeper: bool = False, heads: int | None = None) -> nn.Module:
    n_heads, n_kv = _heads(heads)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN,
        num_hidden_layers=LAYERS + deeper, num_attention_heads=n_heads,
        num_key_value_heads=n_kv, max_position_embeddings=64, rms_norm_eps=1e-6,
        tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config)


def hf_gpt2(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.GPT2Config(n_layer=LAYERS + deeper, n_embd=DIM,
                                     n_head=_heads(heads)[0], vocab_size=VOCAB, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def hf_resnet(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=64, layer_type="basic", hidden_sizes=list(CHANNELS),
        depths=[1, 1, 1, 1 + deeper], num_labels=10, downsample_in_first_stage=False)
    return transformers.ResNetForImageClassification(config)


def hf_vit(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=DIM, num_hidden_layers=LAYERS + deeper,
        num_attention_heads=_heads(heads)[0], intermediate_size=2 * DIM, num_labels=10,
        hidden_act="gelu", layer_norm_eps=1e-6)
    return transformers.ViTForImageClassification(config)


def hf_clip(deeper: bool = False, heads: int | None = None) -> nn.Module:
    common = {"hidden_size": DIM, "intermediate_size": 4 * DIM,
              "num_hidden_layers": LAYERS + deeper, "num_attention_heads": _heads(heads)[0],
              "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
    config = transformers.CLIPConfig(
        text_config={**common, "vocab_size": VOCAB, "max_position_embeddings": 12,
                     # eos 2: pool at the largest token id, as OpenAI's CLIP does
                     "bos_token_id": 1, "eos_token_id": 2},
        vision_config={**common, "image_size": 32, "patch_size": 8}, projection_dim=32)
    return transformers.CLIPModel(config)


#: EfficientNet-B0's first two stages, as efficientnet_pytorch's block strings; ``deeper``
#: repeats the second stage once more.
_EFFICIENTNET_BLOCKS = ("r1_k3_s11_e1_i32_o16_se0.25", "r{}_k3_s22_e6_i16_o24_se0.25")


def hf_efficientnet(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.EfficientNetConfig(
        image_size=32, width_coefficient=1.0, depth_coefficient=1.0, kernel_sizes=[3, 3],
        in_channels=[32, 16], out_channels=[16, 24], strides=[1, 2],
        num_block_repeats=[1, 2 + deeper], expand_ratios=[1, 6], hidden_dim=1280,
        num_labels=10, depthwise_padding=[])
    return transformers.EfficientNetForImageClassification(config)


def _clip_logits(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(input_ids=x.tokens, pixel_values=x.images).logits_per_image


def hf_whisper(deeper: bool = False, heads: int | None = None) -> nn.Module:
    n_heads = _heads(heads)[0]
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, encoder_layers=LAYERS + deeper,
        encoder_attention_heads=n_heads, decoder_layers=LAYERS + deeper,
        decoder_attention_heads=n_heads, d_model=DIM, encoder_ffn_dim=4 * DIM,
        decoder_ffn_dim=4 * DIM, max_source_positions=8, max_target_positions=12,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None)
    return transformers.WhisperForConditionalGeneration(config)


def _whisper_hf_logits(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(input_features=x.mel, decoder_input_ids=x.tokens).logits


# timm, open_clip, whisper, torchtune ----------------------------------------------------------

def timm_resnet(deeper: bool = False, heads: int | None = None) -> nn.Module:
    import timm

    return timm.create_model("resnet18", layers=(1, 1, 1, 1 + deeper), num_classes=10,
                             channels=CHANNELS)


def timm_vit(deeper: bool = False, heads: int | None = None) -> nn.Module:
    import timm

    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=DIM,
                             depth=LAYERS + deeper, num_heads=_heads(heads)[0], mlp_ratio=2.0,
                             num_classes=10)


def open_clip_model(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    n_heads = _heads(heads)[0]
    vision = CLIPVisionCfg(layers=LAYERS + deeper, width=DIM, head_width=DIM // n_heads,
                           patch_size=8, image_size=32)
    text = CLIPTextCfg(context_length=12, vocab_size=VOCAB, width=DIM, heads=n_heads,
                       layers=LAYERS + deeper)
    model = CLIP(embed_dim=32, vision_cfg=vision, text_cfg=text, quick_gelu=True)
    with torch.no_grad():  # zero at init; random, so that a graft that drops them shows
        model.visual.positional_embedding.normal_(0, 0.1)
    return model


def _open_clip_logits(model: nn.Module, x: Inputs) -> torch.Tensor:
    image, text, scale = model(x.images, x.tokens)[:3]
    return scale * image @ text.t()


def lukemelas_efficientnet(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from efficientnet_pytorch import EfficientNet
    from efficientnet_pytorch.utils import BlockDecoder, GlobalParams

    blocks = BlockDecoder.decode([_EFFICIENTNET_BLOCKS[0],
                                  _EFFICIENTNET_BLOCKS[1].format(2 + deeper)])
    params = GlobalParams(width_coefficient=1.0, depth_coefficient=1.0, image_size=32,
                          dropout_rate=0.2, num_classes=10, batch_norm_momentum=0.99,
                          batch_norm_epsilon=1e-3, drop_connect_rate=0.2, depth_divisor=8,
                          min_depth=None, include_top=True)
    return EfficientNet(blocks, params)


def openai_whisper(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from whisper.model import ModelDimensions, Whisper

    n_heads = _heads(heads)[0]
    dims = ModelDimensions(n_mels=16, n_audio_ctx=8, n_audio_state=DIM, n_audio_head=n_heads,
                           n_audio_layer=LAYERS + deeper, n_vocab=VOCAB, n_text_ctx=12,
                           n_text_state=DIM, n_text_head=n_heads, n_text_layer=LAYERS + deeper)
    return Whisper(dims)


def _whisper_logits(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.mel, x.tokens)


def torchtune_llama(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from torchtune.models.llama3._component_builders import llama3

    n_heads, n_kv = _heads(heads)
    return llama3(vocab_size=VOCAB, num_layers=LAYERS + deeper, num_heads=n_heads,
                  num_kv_heads=n_kv, embed_dim=DIM, max_seq_len=64, intermediate_dim=FFN,
                  norm_eps=1e-6, rope_base=10000)


# hand-written ---------------------------------------------------------------------------------

def nanogpt(deeper: bool = False, heads: int | None = None) -> nn.Module:
    return NanoGPT(VOCAB, 32, LAYERS + deeper, _heads(heads)[0], DIM)


def meta_llama(deeper: bool = False, heads: int | None = None) -> nn.Module:
    return MetaLlama(VOCAB, DIM, LAYERS + deeper, *_heads(heads), FFN)


def gpt_fast_llama(deeper: bool = False, heads: int | None = None) -> nn.Module:
    return GptFastLlama(VOCAB, DIM, LAYERS + deeper, *_heads(heads), FFN)


def neox_gpt(deeper: bool = False, heads: int | None = None) -> nn.Module:
    return NeoXGPT(VOCAB, DIM, LAYERS + deeper, _heads(heads)[0])


def _none(_x: Inputs) -> None:
    return None


ARCHS = {arch.name: arch for arch in (
    Arch("transformers GPT-NeoX", "transformers", hf_gpt_neox, _logits, _tokens,
         _save_pretrained),
    Arch("transformers Llama", "transformers", hf_llama, _logits, _tokens, _save_pretrained),
    Arch("transformers GPT-2", "transformers", hf_gpt2, _logits, _tokens, _save_pretrained),
    Arch("transformers ResNet", "transformers", hf_resnet, _image_logits, _images,
         _save_pretrained),
    Arch("transformers ViT", "transformers", hf_vit, _image_logits, _images, _save_pretrained),
    Arch("transformers CLIP", "transformers", hf_clip, _clip_logits, _none, _save_pretrained),
    Arch("transformers Whisper", "transformers", hf_whisper, _whisper_hf_logits, _none,
         _save_pretrained),
    Arch("transformers EfficientNet", "transformers", hf_efficientnet, _image_logits, _images,
         _save_pretrained),
    Arch("efficientnet_pytorch EfficientNet", "efficientnet_pytorch", lukemelas_efficientnet,
         _plain_images, _images),
    Arch("timm ResNet", "timm", timm_resnet, _plain_images, _images, _timm_save),
    Arch("timm ViT", "timm", timm_vit, _plain_images, _images, _timm_save),
    Arch("open_clip CLIP (OpenAI layout)", "open_clip", open_clip_model, _open_clip_logits,
         _none),
    Arch("openai-whisper", "whisper", openai_whisper, _whisper_logits, _none),
    Arch("torchtune Llama", "torchtune", torchtune_llama, _plain_tokens, _tokens),
    Arch("nanoGPT", "nanoGPT (hand-written)", nanogpt, _plain_tokens, _tokens),
    Arch("Meta Llama", "Meta llama (hand-written)", meta_llama, _plain_tokens, _tokens),
    Arch("gpt-fast Llama", "gpt-fast (hand-written)", gpt_fast_llama, _plain_tokens, _tokens),
    Arch("GPT-NeoX-style GPT", "hand-written GPT", neox_gpt, _plain_tokens, _tokens),
)}
