"""Tiny models of the held-out code bases: ones none of torchgraft's name tables lists.

The real-pairs suite (:mod:`.codebases`) holds the code bases graft's tables were written
for; these are the measure of what graft does without a table (issue 27): litgpt (its fused,
per-group interleaved ``attn.attn``, its ``fc_1``/``fc_2``/``proj`` MLP and experts),
x-transformers (a fused ``[up; gate]`` under ``proj``, Meta's rotary order, unit-offset norms
named ``g``, one numbered container for attention and MLP layers alike), Meta's encodec (old
weight-norm names) against transformers' EnCodec (new ones), and timm's ConvNeXt, BEiT and
RegNet against transformers' (other stems and heads, split q/v biases, relative-position
tables, ``s1.b1`` blocks and a shortcut defined after the convolutions). Each is built as its
code base builds it, with the same conventions as :mod:`.codebases` (``build(deeper, heads)``,
the library's own forward, tiny configurations, random weights).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from tests.graft.pairs import stubs
from tests.graft.pairs.codebases import (
    DIM,
    FFN,
    HEADS,
    LAYERS,
    VOCAB,
    Arch,
    Inputs,
    _heads,
    _image_logits,
    _images,
    _logits,
    _none,
    _plain_images,
    _plain_tokens,
    _save_pretrained,
    _timm_save,
    _tokens,
    _whisper_hf_logits,
    _whisper_logits,
)

stubs.install()
stubs.bare_package("litgpt")  # its __init__ imports its trainer and API (lightning, tokenizers)

EXPERTS, EXPERTS_PER_TOKEN = 4, 2
CONVNEXT_DIMS = (16, 32, 48, 64)
VISION_CLASSES = 10


# litgpt (0.4: fused attention rows interleaved per query group) ---------------------------------

def litgpt_config(*, deeper: bool = False, heads: int | None = None,
                  experts: bool = False) -> Any:
    """litgpt's ``Config`` of a tiny Llama (``experts``: a Mixtral, litgpt's ``LLaMAMoE``)."""
    from litgpt.config import Config

    n_heads, n_kv = _heads(heads)
    moe = {"mlp_class_name": "LLaMAMoE", "n_expert": EXPERTS,  # rotary base as litgpt's Mixtral
           "n_expert_per_token": EXPERTS_PER_TOKEN, "rope_base": 1_000_000} if experts else {
        "mlp_class_name": "LLaMAMLP", "rope_base": 10_000}
    return Config(name="tiny", block_size=64, vocab_size=VOCAB, padded_vocab_size=VOCAB,
                  n_layer=LAYERS + deeper, n_head=n_heads, n_embd=DIM, n_query_groups=n_kv,
                  rotary_percentage=1.0, parallel_residual=False, bias=False,
                  norm_class_name="RMSNorm", intermediate_size=FFN, norm_eps=1e-6, **moe)


def litgpt_llama(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from litgpt.model import GPT

    return GPT(litgpt_config(deeper=deeper, heads=heads))


def litgpt_mixtral(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from litgpt.model import GPT

    return GPT(litgpt_config(deeper=deeper, heads=heads, experts=True))


def _litgpt_save(model: nn.Module, folder: Path) -> Path:
    """litgpt's checkpoint folder, as its convert_hf_checkpoint writes one: ``lit_model.pth``
    (the state dict) and ``model_config.yaml`` (its ``save_config``)."""
    from litgpt.utils import save_config

    torch.save(model.state_dict(), folder / "lit_model.pth")
    save_config(model.config, folder)
    return folder


def hf_mixtral(deeper: bool = False, heads: int | None = None) -> nn.Module:
    n_heads, n_kv = _heads(heads)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN,
        num_hidden_layers=LAYERS + deeper, num_attention_heads=n_heads,
        num_key_value_heads=n_kv, num_local_experts=EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN, max_position_embeddings=64, rms_norm_eps=1e-6,
        tie_word_embeddings=False)
    return transformers.MixtralForCausalLM(config)


# x-transformers (multi-head: it repeats grouped key/value heads tiled, not interleaved) ---------

def x_transformers_decoder(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """A Llama as x-transformers builds one: RMSNorm, SwiGLU, rotary over whole heads."""
    from loguru import logger
    from x_transformers import Decoder, TransformerWrapper

    logger.disable("x_transformers")  # its advice on rotary widths for training
    n_heads = heads or HEADS
    return TransformerWrapper(
        num_tokens=VOCAB, max_seq_len=64, use_abs_pos_emb=False,
        attn_layers=Decoder(dim=DIM, depth=LAYERS + deeper, heads=n_heads,
                            attn_dim_head=DIM // n_heads, rotary_pos_emb=True,
                            rotary_emb_dim=DIM // n_heads, use_rmsnorm=True, ff_glu=True,
                            ff_swish=True, ff_mult=FFN / DIM))


def hf_llama_biased_mlp(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """transformers' Llama configured as x-transformers' decoder computes: biased MLP, multi-head
    attention, an epsilon as small as ``F.normalize``'s."""
    n_heads = heads or HEADS
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN,
        num_hidden_layers=LAYERS + deeper, num_attention_heads=n_heads,
        num_key_value_heads=n_heads, max_position_embeddings=64, rms_norm_eps=1e-12,
        tie_word_embeddings=False, mlp_bias=True)
    return transformers.LlamaForCausalLM(config)


# encodec (Meta) and transformers' EnCodec -------------------------------------------------------

#: 800 Hz, hop 8: 100 frames a second; 16-entry codebooks (4 bits): 0.8 kbps is 2 codebooks.
_CODEC = {"sample_rate": 800, "bandwidth": 0.8, "dimension": 16, "filters": 4, "bins": 16,
          "quantizers": 2}


def _ratios(deeper: bool) -> list[int]:
    return [4, 2] + [2] * deeper


def encodec_model(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """Meta's encodec, causal with weight norm (``weight_g``/``weight_v``), as its 24 kHz
    model is built (``EncodecModel._get_model``)."""
    import encodec
    from encodec.modules import SEANetDecoder, SEANetEncoder
    from encodec.quantization import ResidualVectorQuantizer

    common = {"channels": 1, "dimension": _CODEC["dimension"], "n_filters": _CODEC["filters"],
              "n_residual_layers": 1, "ratios": _ratios(deeper), "causal": True, "lstm": 2,
              "norm": "weight_norm"}
    with warnings.catch_warnings():  # torch.nn.utils.weight_norm is deprecated (not gone)
        warnings.simplefilter("ignore", FutureWarning)
        model = encodec.EncodecModel(
            SEANetEncoder(**common), SEANetDecoder(**common),
            ResidualVectorQuantizer(dimension=_CODEC["dimension"],
                                    n_q=_CODEC["quantizers"], bins=_CODEC["bins"]),
            target_bandwidths=[_CODEC["bandwidth"]], sample_rate=_CODEC["sample_rate"],
            channels=1, normalize=False)
    model.set_target_bandwidth(_CODEC["bandwidth"])
    return model


def hf_encodec(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """transformers' EnCodec with weight norm (torch's parametrizations: ``original0/1``)."""
    config = transformers.EncodecConfig(
        target_bandwidths=[_CODEC["bandwidth"]], sampling_rate=_CODEC["sample_rate"],
        audio_channels=1, normalize=False, hidden_size=_CODEC["dimension"],
        num_filters=_CODEC["filters"], num_residual_layers=1, upsampling_ratios=_ratios(deeper),
        norm_type="weight_norm", use_causal_conv=True, num_lstm_layers=2,
        codebook_size=_CODEC["bins"], codebook_dim=_CODEC["dimension"], chunk_length_s=None)
    return transformers.EncodecModel(config)


def _audio(x: Inputs) -> tuple[torch.Tensor, ...]:
    return (x.audio,)


def _codec_outputs(encoded: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    """The encoder's output and the decoded audio: the decoded audio alone goes through the
    quantizer's nearest codes, which hide a small change of the encoder."""
    return torch.cat([encoded.flatten(), decoded.flatten()])


def _encodec_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return _codec_outputs(model.encoder(x.audio), model(x.audio))


def _hf_encodec_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return _codec_outputs(model.encoder(x.audio), model(x.audio).audio_values)


# timm and transformers vision backbones ---------------------------------------------------------

def timm_convnext(deeper: bool = False, heads: int | None = None) -> nn.Module:
    import timm

    return timm.create_model("convnext_tiny", depths=(1, 1, 2, 1 + deeper), dims=CONVNEXT_DIMS,
                             num_classes=VISION_CLASSES)


def hf_convnext(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.ConvNextConfig(
        num_channels=3, hidden_sizes=list(CONVNEXT_DIMS), depths=[1, 1, 2, 1 + deeper],
        num_labels=VISION_CLASSES, image_size=32, layer_norm_eps=1e-6)
    return transformers.ConvNextForImageClassification(config)


def timm_beit(deeper: bool = False, heads: int | None = None) -> nn.Module:
    import timm

    return timm.create_model("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=DIM,
                             depth=LAYERS + deeper, num_heads=heads or HEADS, mlp_ratio=2.0,
                             num_classes=VISION_CLASSES)


def hf_beit(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.BeitConfig(
        image_size=32, patch_size=8, hidden_size=DIM, num_hidden_layers=LAYERS + deeper,
        num_attention_heads=heads or HEADS, intermediate_size=2 * DIM,
        num_labels=VISION_CLASSES, use_relative_position_bias=True,
        use_absolute_position_embeddings=False, use_mean_pooling=True,
        layer_scale_init_value=0.1, layer_norm_eps=1e-6)
    return transformers.BeitForImageClassification(config)


def timm_regnet(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """A RegNetY: widths 8, 16, 32, 64 in stages of 1, 1, 2, 1 (+1) blocks, groups of 8, built
    as timm's ``regnety_*`` factories build theirs (with this configuration)."""
    from timm.models import build_model_with_cfg
    from timm.models.regnet import RegNet, RegNetCfg

    config = RegNetCfg(depth=5 + deeper, w0=8, wa=10.0, wm=2.0, group_size=8, se_ratio=0.25,
                       stem_width=16)
    model: nn.Module = build_model_with_cfg(RegNet, "regnety_002", False, model_cfg=config,
                                            num_classes=VISION_CLASSES)
    return model


def hf_regnet(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.RegNetConfig(
        num_channels=3, embedding_size=16, hidden_sizes=[8, 16, 32, 64],
        depths=[1, 1, 2, 1 + deeper], groups_width=8, layer_type="y",
        num_labels=VISION_CLASSES)
    return transformers.RegNetForImageClassification(config)


# Whisper, 32 wide: the targets of mlx-whisper's file (a committed fixture, kept small) --------

WHISPER_WIDTH = 32


def openai_whisper_narrow(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from whisper.model import ModelDimensions, Whisper

    n_heads = heads or HEADS
    dims = ModelDimensions(n_mels=16, n_audio_ctx=8, n_audio_state=WHISPER_WIDTH,
                           n_audio_head=n_heads, n_audio_layer=LAYERS + deeper, n_vocab=VOCAB,
                           n_text_ctx=12, n_text_state=WHISPER_WIDTH, n_text_head=n_heads,
                           n_text_layer=LAYERS + deeper)
    return Whisper(dims)


def hf_whisper_narrow(deeper: bool = False, heads: int | None = None) -> nn.Module:
    n_heads = heads or HEADS
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, encoder_layers=LAYERS + deeper,
        encoder_attention_heads=n_heads, decoder_layers=LAYERS + deeper,
        decoder_attention_heads=n_heads, d_model=WHISPER_WIDTH,
        encoder_ffn_dim=4 * WHISPER_WIDTH, decoder_ffn_dim=4 * WHISPER_WIDTH,
        max_source_positions=8, max_target_positions=12, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None,
        begin_suppress_tokens=None)
    return transformers.WhisperForConditionalGeneration(config)


HELDOUT_ARCHS = {arch.name: arch for arch in (
    Arch("litgpt Llama", "litgpt", litgpt_llama, _plain_tokens, _tokens, _litgpt_save),
    Arch("litgpt Mixtral", "litgpt", litgpt_mixtral, _plain_tokens, _tokens, _litgpt_save),
    Arch("transformers Mixtral", "transformers", hf_mixtral, _logits, _tokens,
         _save_pretrained),
    Arch("x-transformers decoder", "x-transformers", x_transformers_decoder, _plain_tokens,
         _tokens),
    Arch("transformers Llama (biased MLP)", "transformers", hf_llama_biased_mlp, _logits,
         _tokens, _save_pretrained),
    Arch("encodec", "encodec", encodec_model, _encodec_run, _audio),
    Arch("transformers EnCodec", "transformers", hf_encodec, _hf_encodec_run, _audio,
         _save_pretrained),
    Arch("timm ConvNeXt", "timm", timm_convnext, _plain_images, _images, _timm_save),
    Arch("transformers ConvNeXT", "transformers", hf_convnext, _image_logits, _images,
         _save_pretrained),
    Arch("timm BEiT", "timm", timm_beit, _plain_images, _images, _timm_save),
    Arch("transformers BEiT", "transformers", hf_beit, _image_logits, _images,
         _save_pretrained),
    Arch("timm RegNetY", "timm", timm_regnet, _plain_images, _images, _timm_save),
    Arch("transformers RegNetY", "transformers", hf_regnet, _image_logits, _images,
         _save_pretrained),
    Arch("openai-whisper (32 wide)", "whisper", openai_whisper_narrow, _whisper_logits,
         _none),
    Arch("transformers Whisper (32 wide)", "transformers", hf_whisper_narrow,
         _whisper_hf_logits, _none, _save_pretrained),
)}
