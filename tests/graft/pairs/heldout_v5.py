"""Issue 37's held-out pairs, each way: code bases none of torchgraft's tables or other tests
names, each chosen for a class of failure graft v4 showed where both codes are at hand.

- latent-diffusion's VAE and diffusers' ``AutoencoderKL``: decoder levels numbered the other
  way (``up.{i}`` is ``up_blocks.{n-1-i}``, two of them the same shape), shortcuts and
  resampling convolutions under other names, attention as 1x1 convolutions against Linear
  (four same-shape siblings in one block);
- transformers' CodeGen and GPT-J: a fused projection stored per model-parallel core,
  ``[q, v, k]`` inside each, against separate projections;
- AI2's OLMo and transformers': a fused ``[q; k; v]`` (grouped key/value heads) beside a
  fused ``[up; gate]``;
- OLMo-core's Llama and transformers': rotary by interleaved pairs with grouped heads;
- PyTorch's ``nn.TransformerEncoder`` and transformers' BERT encoder:
  ``nn.MultiheadAttention``'s fused ``in_proj_weight`` in every layer (modules paired across
  layers from a live module);
- timm's ConvNeXt V2 and transformers': the global response norms' same-shape ``weight`` and
  ``bias`` (issue 37's false ok: a file whose sorting inverts them, here the sorted twin).

Each pair runs as :mod:`.heldout`'s do (:func:`~tests.graft.pairs.pairs.graft_case`: every
flavour, broken twins, the sorted twin) against its reference (:mod:`.heldout_v5_references`).
"""

from __future__ import annotations

from tests.graft.pairs import heldout_v5_references as v5
from tests.graft.pairs.codebases import ARCHS
from tests.graft.pairs.heldout_v5_codebases import V5_ARCHS
from tests.graft.pairs.pairs import HF_LLAMA_GLU, Pair, affine, both_ways

#: Every architecture the pairs use, by name.
V5_PAIR_ARCHS = {**ARCHS, **V5_ARCHS}
_LLAMA_NORMS = ("model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm")
_GPTJ_NORMS = ("transformer.h.0.ln_1", "transformer.h.1.ln_1")

V5_PAIRS: list[Pair] = [
    *both_ways("latent-diffusion AutoencoderKL", "diffusers AutoencoderKL",
               v5.ldm_vae_to_diffusers_vae,
               (("decoder.mid.block_1.norm1", "decoder.mid.block_1.norm2"),
                ("decoder.mid_block.resnets.0.norm1", "decoder.mid_block.resnets.0.norm2")),
               heads=False, archs=V5_PAIR_ARCHS,
               siblings=(("decoder.mid.attn_1.q", "decoder.mid.attn_1.k"),
                         ("decoder.mid_block.attentions.0.to_q",
                          "decoder.mid_block.attentions.0.to_k"))),
    *both_ways("transformers CodeGen", "transformers GPT-J", v5.hf_codegen_to_hf_gptj,
               (_GPTJ_NORMS, _GPTJ_NORMS), archs=V5_PAIR_ARCHS,
               siblings=(affine("transformer.h.*.ln_1"),
                         ("transformer.h.*.attn.k_proj", "transformer.h.*.attn.v_proj"))),
    # neither OLMo has a norm with parameters; AI2's same-shape siblings are its embedding and
    # its output projection
    *both_ways("AI2 OLMo", "transformers OLMo", v5.ai2_olmo_to_hf_olmo, (None, None),
               archs=V5_PAIR_ARCHS,
               siblings=(("transformer.wte", "transformer.ff_out"), HF_LLAMA_GLU)),
    *both_ways("transformers Llama", "OLMo-core Llama (complex rotary)", v5.hf_llama_to_olmo_core,
               (_LLAMA_NORMS, ("blocks.0.attention_norm", "blocks.0.feed_forward_norm")),
               archs=V5_PAIR_ARCHS,
               siblings=(HF_LLAMA_GLU, ("blocks.*.feed_forward.w1", "blocks.*.feed_forward.w3"))),
    *both_ways("torch TransformerEncoder", "transformers BERT encoder",
               v5.torch_encoder_to_hf_bert,
               (("layers.0.norm1", "layers.0.norm2"),
                ("layer.0.attention.output.LayerNorm", "layer.0.output.LayerNorm")),
               archs=V5_PAIR_ARCHS,
               siblings=(affine("layers.*.norm1"),
                         ("layer.*.attention.self.query", "layer.*.attention.self.key"))),
    *both_ways("timm ConvNeXt V2", "transformers ConvNeXt V2", v5.timm_convnextv2_to_hf_convnextv2,
               (("stem.1", "stages.0.blocks.0.norm"),
                ("convnextv2.embeddings.layernorm",
                 "convnextv2.encoder.stages.0.layers.0.layernorm")),
               heads=False, archs=V5_PAIR_ARCHS,
               siblings=(affine("stages.*.blocks.*.mlp.grn"),
                         affine("convnextv2.encoder.stages.*.layers.*.grn"))),
]
V5_PAIR_IDS = [pair.name for pair in V5_PAIRS]

#: The sides that belong to held-out code bases (transformers' Llama is the tables' own).
V5_SIDES = ("latent-diffusion AutoencoderKL", "diffusers AutoencoderKL", "transformers CodeGen",
            "transformers GPT-J", "AI2 OLMo", "transformers OLMo",
            "OLMo-core Llama (complex rotary)", "torch TransformerEncoder",
            "transformers BERT encoder", "transformers ConvNeXt V2")
