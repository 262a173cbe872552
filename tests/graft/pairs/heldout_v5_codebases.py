"""Tiny models of the held-out code bases of issue 37: none of torchgraft's tables or other
tests names them.

Each stands for a class of failure graft v4 showed on code bases it had never seen: the
original latent-diffusion VAE (``stable-diffusion-sdkit``'s ``ldm``: decoder levels ``up.{i}``
numbered the other way from diffusers' ``up_blocks``, shortcuts named ``nin_shortcut``,
attention as 1x1 convolutions ``q``/``k``/``v``/``proj_out``); transformers' CodeGen (a fused
``qkv_proj`` stored in blocks per model-parallel core, ``[q, v, k]`` inside each) against its
GPT-J; AI2's original OLMo (``ai2-olmo``: a fused ``[q; k; v]`` ``att_proj`` beside a fused
``[up; gate]`` ``ff_proj``, grouped key/value heads); OLMo-core (``ai2-olmo-core``: rotary as
complex rotations, Meta's row order, with grouped key/value heads); PyTorch's own
``nn.TransformerEncoder`` (``nn.MultiheadAttention``'s fused ``in_proj_weight`` in every
layer) against transformers' BERT encoder; timm's ConvNeXt V2 against transformers' (the global
response norms' same-shape ``weight`` and ``bias``: issue 37's false ok, from a file whose
sorting inverts them). Conventions as in :mod:`.codebases`:
``build(deeper, heads)``, the library's own forward, tiny configurations, random weights.
"""

from __future__ import annotations

import contextlib
import enum
import io
import sys
import types
import warnings
from pathlib import Path

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
    _plain_images,
    _plain_tokens,
    _save_pretrained,
    _timm_save,
    _tokens,
)
from tests.graft.pairs.heldout_codebases import CONVNEXT_DIMS, VISION_CLASSES

stubs.install()
stubs.stand_in("omegaconf", "cached_path", "bettermap")  # config loading, remote files: unused
stubs.bare_package("olmo")  # its __init__ imports its tokenizer and training utilities
# olmo.util is AI2's I/O grab-bag (S3, GCS, Weka, HF datasets); the model needs its StrEnum only
sys.modules.setdefault("olmo.util", types.ModuleType("olmo.util"))
sys.modules["olmo.util"].StrEnum = enum.StrEnum  # type: ignore[attr-defined]
# the original VAE's class is a LightningModule; Lightning (a trainer) is not installed
if "pytorch_lightning" not in sys.modules:
    sys.modules["pytorch_lightning"] = types.ModuleType("pytorch_lightning")
    sys.modules["pytorch_lightning"].LightningModule = nn.Module  # type: ignore[attr-defined]

#: The VAEs' widths per level (GroupNorm of 32 groups, as ldm hard-codes), and one more level
#: for the deeper twin.
VAE_CHANNELS = (32, 64, 64)
LATENT = 4
#: CodeGen splits its fused projection into 4 model-parallel blocks whatever the head count:
#: its heads twin has 8 heads (4 does not divide 2), the same shapes.
CODEGEN_CORES, CODEGEN_TWIN_HEADS, ROTARY_DIM = 4, 8, 8


# latent diffusion's VAE and diffusers' ---------------------------------------------------------

def ldm_vae(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """The original latent-diffusion ``AutoencoderKL`` (Stable Diffusion's first stage)."""
    with contextlib.redirect_stdout(io.StringIO()):  # it prints whether xformers imports
        from ldm.models.autoencoder import AutoencoderKL

    channels = _vae_channels(deeper)
    config = {"double_z": True, "z_channels": LATENT, "resolution": 32, "in_channels": 3,
              "out_ch": 3, "ch": channels[0], "ch_mult": [c // channels[0] for c in channels],
              "num_res_blocks": 1, "attn_resolutions": [], "dropout": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its shapes as it builds
        return AutoencoderKL(config, {"target": "torch.nn.Identity"}, embed_dim=LATENT)


def _vae_channels(deeper: bool) -> list[int]:
    return [*VAE_CHANNELS, *VAE_CHANNELS[-1:] * deeper]


def diffusers_vae_config(deeper: bool = False) -> dict[str, object]:
    channels = _vae_channels(deeper)
    return {"in_channels": 3, "out_channels": 3, "block_out_channels": channels,
            "down_block_types": ["DownEncoderBlock2D"] * len(channels),
            "up_block_types": ["UpDecoderBlock2D"] * len(channels), "layers_per_block": 1,
            "latent_channels": LATENT, "norm_num_groups": 32, "sample_size": 32}


def diffusers_vae(deeper: bool = False, heads: int | None = None) -> nn.Module:
    import diffusers

    return diffusers.AutoencoderKL(**diffusers_vae_config(deeper))


def _vae_inputs(x: Inputs) -> tuple[torch.Tensor, ...]:
    """The image, and ``sample_posterior=False``: the latent's mode, not a random sample (the
    original's default samples)."""
    return (x.images, False)  # type: ignore[return-value]


def _ldm_vae_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.images, sample_posterior=False)[0]


def _diffusers_vae_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.images, sample_posterior=False).sample


# transformers' CodeGen and GPT-J ---------------------------------------------------------------

def _codegen_heads(heads: int | None) -> int:
    return HEADS if heads is None else CODEGEN_TWIN_HEADS


def hf_codegen(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.CodeGenConfig(
        vocab_size=VOCAB, n_positions=64, n_ctx=64, n_embd=DIM, n_layer=LAYERS + deeper,
        n_head=_codegen_heads(heads), rotary_dim=ROTARY_DIM, n_inner=FFN,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    return transformers.CodeGenForCausalLM(config)


def hf_gptj(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.GPTJConfig(
        vocab_size=VOCAB, n_positions=64, n_embd=DIM, n_layer=LAYERS + deeper,
        n_head=_codegen_heads(heads), rotary_dim=ROTARY_DIM, n_inner=FFN,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    return transformers.GPTJForCausalLM(config)


# AI2's OLMo and transformers' --------------------------------------------------------------------

def ai2_olmo(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """AI2's original OLMo (OLMo 1): non-parametric layer norms, SwiGLU, grouped key/values."""
    from olmo.config import ModelConfig
    from olmo.model import OLMo

    n_heads, n_kv = _heads(heads)
    config = ModelConfig(
        d_model=DIM, n_heads=n_heads, n_kv_heads=n_kv, n_layers=LAYERS + deeper,
        mlp_hidden_size=2 * FFN, activation_type="swiglu", block_type="sequential", rope=True,
        rope_theta=10_000, alibi=False, include_bias=False, layer_norm_type="default",
        layer_norm_with_affine=False, attention_layer_norm=False, vocab_size=VOCAB,
        embedding_size=VOCAB, weight_tying=False, max_sequence_length=64, init_device="cpu",
        flash_attention=False, attention_dropout=0.0, residual_dropout=0.0,
        embedding_dropout=0.0)
    return OLMo(config)


def _ai2_olmo_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(x.tokens).logits


def hf_olmo(deeper: bool = False, heads: int | None = None) -> nn.Module:
    n_heads, n_kv = _heads(heads)
    config = transformers.OlmoConfig(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN,
        num_hidden_layers=LAYERS + deeper, num_attention_heads=n_heads,
        num_key_value_heads=n_kv, max_position_embeddings=64, rope_theta=10_000,
        tie_word_embeddings=False, pad_token_id=0, eos_token_id=0)
    return transformers.OlmoForCausalLM(config)


# OLMo-core -------------------------------------------------------------------------------------

def olmo_core_llama(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """A Llama as OLMo-core builds one (``llama_like``), rotary as complex rotations (Meta's
    interleaved pairs) and grouped key/value heads."""
    from olmo_core.nn.rope import RoPEType
    from olmo_core.nn.transformer import TransformerConfig

    n_heads, n_kv = _heads(heads)
    default_ffn = int(8 * DIM / 3)  # llama_like's hidden size, scaled to FFN
    config = TransformerConfig.llama_like(
        d_model=DIM, vocab_size=VOCAB, n_layers=LAYERS + deeper, n_heads=n_heads,
        n_kv_heads=n_kv, rope_theta=10_000, rope_type=RoPEType.complex,
        hidden_size_multiple_of=16, hidden_size_multiplier=FFN / default_ffn + 1e-6,
        layer_norm_eps=1e-6)
    model: nn.Module = config.build(init_device="cpu")
    return model


def _olmo_core_save(model: nn.Module, folder: Path) -> Path:
    """OLMo-core's own checkpoint: a distributed checkpoint folder of the model's state
    (``save_model_and_optim_state``, as its trainer writes ``model_and_optim/``)."""
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    with warnings.catch_warnings():  # no process group: torch saves as one process
        warnings.simplefilter("ignore", UserWarning)
        save_model_and_optim_state(folder / "model_and_optim", model)
    return folder / "model_and_optim"


# PyTorch's nn.TransformerEncoder and transformers' BERT encoder ----------------------------------

def torch_encoder(deeper: bool = False, heads: int | None = None) -> nn.Module:
    """PyTorch's post-norm encoder: ``nn.MultiheadAttention`` (fused ``in_proj_weight``)."""
    layer = nn.TransformerEncoderLayer(DIM, _heads(heads)[0], FFN, dropout=0.0,
                                       activation="gelu", batch_first=True)
    return nn.TransformerEncoder(layer, LAYERS + deeper, enable_nested_tensor=False)


def hf_bert_encoder(deeper: bool = False, heads: int | None = None) -> nn.Module:
    from transformers.models.bert.modeling_bert import BertEncoder

    config = transformers.BertConfig(
        hidden_size=DIM, num_hidden_layers=LAYERS + deeper,
        num_attention_heads=_heads(heads)[0], intermediate_size=FFN, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-5)
    config._attn_implementation = "eager"  # what BertModel would set for its encoder
    return BertEncoder(config)


def _hidden(_x: Inputs) -> tuple[torch.Tensor, ...]:
    """Hidden states for the encoders (a batch of 2 sequences of 12), fixed by a seed."""
    return (torch.randn(2, 12, DIM, generator=torch.Generator().manual_seed(0)),)


def _torch_encoder_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(*_hidden(x))


def _bert_encoder_run(model: nn.Module, x: Inputs) -> torch.Tensor:
    return model(*_hidden(x)).last_hidden_state


# timm's ConvNeXt V2 and transformers' ----------------------------------------------------------

def timm_convnextv2(deeper: bool = False, heads: int | None = None) -> nn.Module:
    import timm

    return timm.create_model("convnextv2_atto", depths=(1, 1, 2, 1 + deeper),
                             dims=CONVNEXT_DIMS, num_classes=VISION_CLASSES)


def hf_convnextv2(deeper: bool = False, heads: int | None = None) -> nn.Module:
    config = transformers.ConvNextV2Config(
        num_channels=3, hidden_sizes=list(CONVNEXT_DIMS), depths=[1, 1, 2, 1 + deeper],
        num_labels=VISION_CLASSES, image_size=32, layer_norm_eps=1e-6)
    return transformers.ConvNextV2ForImageClassification(config)


V5_ARCHS = {arch.name: arch for arch in (
    Arch("latent-diffusion AutoencoderKL", "stable-diffusion-sdkit", ldm_vae, _ldm_vae_run,
         _vae_inputs),
    Arch("diffusers AutoencoderKL", "diffusers", diffusers_vae, _diffusers_vae_run,
         _vae_inputs, _save_pretrained),
    Arch("transformers CodeGen", "transformers", hf_codegen, _logits, _tokens,
         _save_pretrained),
    Arch("transformers GPT-J", "transformers", hf_gptj, _logits, _tokens, _save_pretrained),
    Arch("AI2 OLMo", "ai2-olmo", ai2_olmo, _ai2_olmo_run, _tokens),
    Arch("transformers OLMo", "transformers", hf_olmo, _logits, _tokens, _save_pretrained),
    Arch("OLMo-core Llama (complex rotary)", "ai2-olmo-core", olmo_core_llama, _plain_tokens,
         _tokens, _olmo_core_save),
    Arch("torch TransformerEncoder", "torch", torch_encoder, _torch_encoder_run, _hidden),
    Arch("transformers BERT encoder", "transformers", hf_bert_encoder, _bert_encoder_run,
         _hidden),
    Arch("timm ConvNeXt V2", "timm", timm_convnextv2, _plain_images, _images, _timm_save),
    Arch("transformers ConvNeXt V2", "transformers", hf_convnextv2, _image_logits, _images,
         _save_pretrained),
)}
