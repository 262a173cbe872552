"""Reference mappings of issue 37's held-out pairs, each proven by equal outputs
(``test_heldout.py``).

Where a library ships its converter, it runs here: diffusers' ``convert_ldm_vae_checkpoint``
(the original latent-diffusion VAE to diffusers': decoder levels renumbered the other way,
1x1-convolution attention to Linear) and OLMo-core's ``convert_state_from_hf`` (transformers'
names to its own), followed by the rows of q and k put into Meta's rotary order as
transformers' ``convert_llama_weights_to_hf`` permutes them the other way. Where the
converter is a script outside the wheel, its mapping is followed by hand: transformers'
``convert_olmo_weights_to_hf`` (AI2's ``att_proj`` split ``[q; k; v]``, ``ff_proj`` chunked
``[up; gate]``), and the CodeGen-to-GPT-J converter CodeGen's users run (its fused
``qkv_proj`` read as transformers' CodeGen reads it: 4 blocks, one per model-parallel core,
each ``[q, v, k]``). PyTorch's ``nn.TransformerEncoder`` has no converter to BERT: its mapping
follows the two forwards (``in_proj_weight`` is ``[q; k; v]``) and is proven the same way.

timm's ConvNeXt V2 goes to transformers' as transformers' convert_convnextv2_to_pytorch takes
the original's names, which timm's checkpoint filter maps to its own (``grn.gamma`` and
``grn.beta`` are timm's ``mlp.grn.weight`` and ``mlp.grn.bias``, ``[dim]`` for ``[1, 1, 1,
dim]``; its pointwise layers are 1x1 convolutions).

Each mapping goes one way; the other is :func:`~tests.graft.pairs.references.inverse`.
"""

from __future__ import annotations

import re

from tests.graft.pairs import heldout_references as held
from tests.graft.pairs import references as ref
from tests.graft.pairs.codebases import DIM, HEADS, KV_HEADS
from tests.graft.pairs.heldout_v5_codebases import CODEGEN_CORES, diffusers_vae_config
from tests.graft.pairs.references import State, rename


def ldm_vae_to_diffusers_vae(state: State) -> State:
    """diffusers' own converter of the original VAE's checkpoint."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    converted: State = convert_ldm_vae_checkpoint(dict(state), diffusers_vae_config())
    return converted


def hf_codegen_to_hf_gptj(state: State) -> State:
    """CodeGen's ``qkv_proj`` rows as ``[cores, (q, v, k), rows per core]``; heads numbered
    core by core, as GPT-J's separate projections number them."""
    out: State = {}
    for key, value in state.items():
        if not key.endswith(".attn.qkv_proj.weight"):
            out[key] = value
            continue
        blocks = value.view(CODEGEN_CORES, 3, DIM // CODEGEN_CORES, DIM)
        for index, part in enumerate("qvk"):
            out[key.replace("qkv_proj", f"{part}_proj")] = blocks[:, index].reshape(DIM, DIM)
    return out


def ai2_olmo_to_hf_olmo(state: State) -> State:
    """transformers' convert_olmo_weights_to_hf: ``att_proj`` split into q, k and v (grouped
    key/value heads), ``ff_proj`` chunked into up, then gate."""
    out: State = {}
    head = DIM // HEADS
    for key, value in state.items():
        if key.endswith(".att_proj.weight"):
            parts = value.split([DIM, KV_HEADS * head, KV_HEADS * head])
            for name, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                out[key.replace("att_proj", f"self_attn.{name}")] = part
        elif key.endswith(".ff_proj.weight"):
            up, gate = value.chunk(2)
            out[key.replace("ff_proj", "mlp.up_proj")] = up
            out[key.replace("ff_proj", "mlp.gate_proj")] = gate
        else:
            out[key] = value
    return rename(out, (
        (r"transformer\.wte\.", "model.embed_tokens."),
        (r"transformer\.ff_out\.", "lm_head."),
        (r"transformer\.blocks\.(\d+)\.attn_out\.", r"model.layers.\1.self_attn.o_proj."),
        (r"transformer\.blocks\.(\d+)\.ff_out\.", r"model.layers.\1.mlp.down_proj."),
        (r"transformer\.blocks\.(\d+)\.self_attn\.", r"model.layers.\1.self_attn."),
        (r"transformer\.blocks\.(\d+)\.mlp\.", r"model.layers.\1.mlp."),
    ))


def hf_llama_to_olmo_core(state: State) -> State:
    """OLMo-core's converter from transformers' Llama, then q and k rows in Meta's rotary order
    (complex rotations pair adjacent rows)."""
    import transformers
    from olmo_core.nn.hf.convert import convert_state_from_hf

    config = transformers.LlamaConfig(num_hidden_layers=len(ref._llama_layers(state)),
                                      tie_word_embeddings=False)
    out: State = convert_state_from_hf(config, dict(state), model_type="llama")
    for key, value in out.items():
        if key.endswith("attention.w_q.weight"):
            out[key] = ref._to_meta_rotary(value, HEADS)
        elif key.endswith("attention.w_k.weight"):
            out[key] = ref._to_meta_rotary(value, KV_HEADS)
    return out


def torch_encoder_to_hf_bert(state: State) -> State:
    """``nn.MultiheadAttention``'s ``in_proj_weight``/``in_proj_bias`` are ``[q; k; v]``."""
    out: State = {}
    for key, value in state.items():
        if ".self_attn.in_proj_" in key:
            leaf = "weight" if key.endswith("weight") else "bias"
            for part, name in zip(value.chunk(3), ("query", "key", "value"), strict=True):
                out[key.replace(f"self_attn.in_proj_{leaf}",
                                f"attention.self.{name}.{leaf}")] = part
        else:
            out[key] = value
    layer = r"layers\.(\d+)\."
    return rename(out, (
        (layer + r"attention\.self\.", r"layer.\1.attention.self."),
        (layer + r"self_attn\.out_proj\.", r"layer.\1.attention.output.dense."),
        (layer + r"norm1\.", r"layer.\1.attention.output.LayerNorm."),
        (layer + r"linear1\.", r"layer.\1.intermediate.dense."),
        (layer + r"linear2\.", r"layer.\1.output.dense."),
        (layer + r"norm2\.", r"layer.\1.output.LayerNorm."),
    ))


def timm_convnextv2_to_hf_convnextv2(state: State) -> State:
    """As timm's ConvNeXt (V1) to transformers' (:mod:`.heldout_references`), under
    ``convnextv2.``; the global response norms to ``layers.{j}.grn``, shaped ``[1, 1, 1, dim]``;
    pointwise 1x1 convolutions to Linear."""
    grn = r"stages\.(\d+)\.blocks\.(\d+)\.mlp\.grn\."
    norms = rename({k: v.view(1, 1, 1, -1) for k, v in state.items() if ".grn." in k},
                   ((grn, r"convnextv2.encoder.stages.\1.layers.\2.grn."),))
    rest = held.timm_convnext_to_hf_convnext({k: v for k, v in state.items() if ".grn." not in k})
    pointwise = {k: v.flatten(1) if v.ndim == 4 and ".pwconv" in k else v
                 for k, v in rest.items()}
    return {re.sub(r"^convnext\.", "convnextv2.", k): v for k, v in pointwise.items()} | norms
