"""Reference mappings between code bases, written by hand after each library's conversion
script (transformers' convert_* scripts, torchtune's convert_weights, gpt-fast's
convert_hf_checkpoint), and proven by equal outputs in ``test_references.py``.

Each mapping goes one way (A's state dict to B's); the other way is derived by
:func:`inverse`: every mapping only moves elements (renames, splits, concatenations,
transposes, row permutations), so running it on a state dict of element indices says where
each element goes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from tests.graft.pairs.codebases import DIM, HEADS, KV_HEADS

State = dict[str, torch.Tensor]
Mapping = Callable[[State], State]
Table = tuple[tuple[str, str | None], ...]


def rename(state: State, table: Table) -> State:
    """Rename every key by the first pattern of ``table`` that matches its start (``None``:
    drop it); what follows the match is kept.

    Raises:
        KeyError: For a key no pattern matches (a mapping must account for every key).
    """
    out: State = {}
    for key, value in state.items():
        for pattern, replacement in table:
            if re.match(pattern, key):
                if replacement is not None:
                    out[re.sub(f"^(?:{pattern})", replacement, key, count=1)] = value
                break
        else:
            raise KeyError(f"no reference rule for '{key}'")
    return out


def _to_meta_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' rotary row order (halves) to Meta's (interleaved pairs), per head."""
    rows, cols = weight.shape
    return weight.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _pop(state: State, key: str) -> torch.Tensor:
    return state.pop(key)


def _llama_layers(state: State) -> list[str]:
    return sorted({m.group(1) for k in state if (m := re.match(r"model\.layers\.(\d+)\.", k))})


def _llama_rotary(state: State) -> State:
    """Permute q and k rows of a transformers Llama state dict into Meta's order."""
    out = dict(state)
    for n in _llama_layers(state):
        prefix = f"model.layers.{n}.self_attn."
        out[prefix + "q_proj.weight"] = _to_meta_rotary(state[prefix + "q_proj.weight"], HEADS)
        out[prefix + "k_proj.weight"] = _to_meta_rotary(state[prefix + "k_proj.weight"],
                                                        KV_HEADS)
    return out


#: transformers' Llama key, Meta's, torchtune's (its convert_weights); ``{n}`` a layer number.
_LLAMA_KEYS = (
    ("model.embed_tokens.weight", "tok_embeddings.weight", "tok_embeddings.weight"),
    ("model.norm.weight", "norm.weight", "norm.scale"),
    ("lm_head.weight", "output.weight", "output.weight"),
    *((f"model.layers.{{n}}.self_attn.{p}_proj.weight", f"layers.{{n}}.attention.w{p}.weight",
       f"layers.{{n}}.attn.{p}_proj.weight") for p in "qkv"),
    ("model.layers.{n}.self_attn.o_proj.weight", "layers.{n}.attention.wo.weight",
     "layers.{n}.attn.output_proj.weight"),
    ("model.layers.{n}.mlp.gate_proj.weight", "layers.{n}.feed_forward.w1.weight",
     "layers.{n}.mlp.w1.weight"),
    ("model.layers.{n}.mlp.down_proj.weight", "layers.{n}.feed_forward.w2.weight",
     "layers.{n}.mlp.w2.weight"),
    ("model.layers.{n}.mlp.up_proj.weight", "layers.{n}.feed_forward.w3.weight",
     "layers.{n}.mlp.w3.weight"),
    ("model.layers.{n}.input_layernorm.weight", "layers.{n}.attention_norm.weight",
     "layers.{n}.sa_norm.scale"),
    ("model.layers.{n}.post_attention_layernorm.weight", "layers.{n}.ffn_norm.weight",
     "layers.{n}.mlp_norm.scale"),
)


def _llama_table(column: int) -> Table:
    """Renames from transformers' Llama keys to column ``column`` of :data:`_LLAMA_KEYS`."""
    return (*((re.escape(row[0]).replace(r"\{n\}", r"(\d+)"), row[column].replace("{n}", r"\1"))
              for row in _LLAMA_KEYS), (r".*rotary_emb\.inv_freq", None))


def hf_llama_to_meta(state: State) -> State:
    return rename(_llama_rotary(state), _llama_table(1))


def hf_llama_to_torchtune(state: State) -> State:
    """After torchtune's convert_weights (hf_to_tune)."""
    return rename(_llama_rotary(state), _llama_table(2))


def hf_llama_to_gpt_fast(state: State) -> State:
    """After gpt-fast's convert_hf_checkpoint: Meta's rotary order, q, k, v concatenated."""
    meta = hf_llama_to_meta(state)
    for n in _llama_layers(state):
        prefix = f"layers.{n}.attention."
        meta[prefix + "wqkv.weight"] = torch.cat([_pop(meta, prefix + f"w{p}.weight")
                                                  for p in "qkv"])
    return meta


def hf_gpt_neox_to_neox_gpt(state: State) -> State:
    """GPT-NeoX's fused rows are per head: [head, (q, k, v), head_dim]."""
    out = dict(state)
    for key in [k for k in state if ".attention.query_key_value." in k]:
        fused = out.pop(key)
        per_head = fused.view(HEADS, 3, DIM // HEADS, *fused.shape[1:])
        for index, name in enumerate("qkv"):
            out[key.replace("query_key_value", f"qkv_{name}")] = \
                per_head[:, index].reshape(DIM, *fused.shape[1:])
    block = r"gpt_neox\.layers\.(\d+)\."
    return rename(out, (
        (r"gpt_neox\.embed_in\.weight", "wte.weight"),
        (block + r"input_layernorm\.", r"blocks.\1.ln1."),
        (block + r"post_attention_layernorm\.", r"blocks.\1.ln2."),
        (block + r"attention\.qkv_(q|k|v)\.", r"blocks.\1.attn.\2."),
        (block + r"attention\.dense\.", r"blocks.\1.attn.o."),
        (block + r"mlp\.dense_h_to_4h\.", r"blocks.\1.fc."),
        (block + r"mlp\.dense_4h_to_h\.", r"blocks.\1.proj."),
        (r"gpt_neox\.final_layer_norm\.", "ln_f."),
        (r"lm_head\.weight", "head.weight"),
        (r".*rotary_emb\.inv_freq", None),
    ))


_CONV1D = re.compile(r"\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def hf_gpt2_to_nanogpt(state: State) -> State:
    """GPT-2's Conv1D weights are stored [in, out]; nanoGPT's Linear [out, in]."""
    return {k: v.t() if _CONV1D.search(k) else v for k, v in state.items()
            if not re.search(r"\.attn\.(masked_)?bias$", k)}


def timm_resnet_to_hf_resnet(state: State) -> State:
    def stage(match: re.Match[str]) -> str:
        return f"resnet.encoder.stages.{int(match.group(1)) - 1}.layers.{match.group(2)}."

    staged = {re.sub(r"^layer(\d)\.(\d+)\.", stage, k): v for k, v in state.items()}
    block = r"(resnet\.encoder\.stages\.\d\.layers\.\d+\.)"
    return rename(staged, (
        (r"conv1\.(.*)", r"resnet.embedder.embedder.convolution.\1"),
        (r"bn1\.(.*)", r"resnet.embedder.embedder.normalization.\1"),
        (block + r"conv1\.(.*)", r"\1layer.0.convolution.\2"),
        (block + r"bn1\.(.*)", r"\1layer.0.normalization.\2"),
        (block + r"conv2\.(.*)", r"\1layer.1.convolution.\2"),
        (block + r"bn2\.(.*)", r"\1layer.1.normalization.\2"),
        (block + r"downsample\.0\.(.*)", r"\1shortcut.convolution.\2"),
        (block + r"downsample\.1\.(.*)", r"\1shortcut.normalization.\2"),
        (r"fc\.(.*)", r"classifier.1.\1"),
    ))


def efficientnet_pytorch_to_hf(state: State) -> State:
    """efficientnet_pytorch's (lukemelas) names to transformers' EfficientNet."""
    block = r"_blocks\.(\d+)\."
    into = r"efficientnet.encoder.blocks.\1."
    return rename(state, (
        (r"_conv_stem\.", "efficientnet.embeddings.convolution."),
        (r"_bn0\.", "efficientnet.embeddings.batchnorm."),
        (block + r"_expand_conv\.", into + "expansion.expand_conv."),
        (block + r"_bn0\.", into + "expansion.expand_bn."),
        (block + r"_depthwise_conv\.", into + "depthwise_conv.depthwise_conv."),
        (block + r"_bn1\.", into + "depthwise_conv.depthwise_norm."),
        (block + r"_se_reduce\.", into + "squeeze_excite.reduce."),
        (block + r"_se_expand\.", into + "squeeze_excite.expand."),
        (block + r"_project_conv\.", into + "projection.project_conv."),
        (block + r"_bn2\.", into + "projection.project_bn."),
        (r"_conv_head\.", "efficientnet.encoder.top_conv."),
        (r"_bn1\.", "efficientnet.encoder.top_bn."),
        (r"_fc\.", "classifier."),
    ))


def _split_qkv(state: State, key: str, names: list[str]) -> None:
    """Split a fused [Q; K; V] tensor in place into three keys."""
    for part, name in zip(state.pop(key).chunk(3), names, strict=True):
        state[name] = part


def timm_vit_to_hf_vit(state: State) -> State:
    out = dict(state)
    for key in [k for k in state if ".attn.qkv." in k]:
        _split_qkv(out, key, [key.replace("attn.qkv", f"attn.{p}_proj") for p in "qkv"])
    block = r"blocks\.(\d+)\."
    return rename(out, (
        (r"cls_token", "vit.embeddings.cls_token"),
        (r"pos_embed", "vit.embeddings.position_embeddings"),
        (r"patch_embed\.proj\.(.*)", r"vit.embeddings.patch_embeddings.projection.\1"),
        (block + r"norm1\.(.*)", r"vit.layers.\1.layernorm_before.\2"),
        (block + r"norm2\.(.*)", r"vit.layers.\1.layernorm_after.\2"),
        (block + r"attn\.(q|k|v)_proj\.(.*)", r"vit.layers.\1.attention.\2_proj.\3"),
        (block + r"attn\.proj\.(.*)", r"vit.layers.\1.attention.o_proj.\2"),
        (block + r"mlp\.(fc1|fc2)\.(.*)", r"vit.layers.\1.mlp.\2.\3"),
        (r"norm\.(.*)", r"vit.layernorm.\1"),
        (r"head\.(.*)", r"classifier.\1"),
    ))


def open_clip_to_hf_clip(state: State) -> State:
    """After transformers' convert_clip_original_pytorch_to_hf: MHA in_proj split, the two
    projections stored [in, out] transposed, bare parameters renamed."""
    out = dict(state)
    for key in [k for k in state if k.endswith(("attn.in_proj_weight", "attn.in_proj_bias"))]:
        leaf = "weight" if key.endswith("weight") else "bias"
        base = key.rpartition(".")[0]
        _split_qkv(out, key, [f"{base}.{p}_proj.{leaf}" for p in "qkv"])
    out["text_projection"] = out["text_projection"].t()
    out["visual.proj"] = out["visual.proj"].t()
    table: list[tuple[str, str | None]] = [
        (r"token_embedding\.weight", "text_model.embeddings.token_embedding.weight"),
        (r"positional_embedding", "text_model.embeddings.position_embedding.weight"),
        (r"ln_final\.(.*)", r"text_model.final_layer_norm.\1"),
        (r"text_projection", "text_projection.weight"),
        (r"logit_scale", "logit_scale"),
        (r"visual\.class_embedding", "vision_model.embeddings.class_embedding"),
        (r"visual\.positional_embedding", "vision_model.embeddings.position_embedding.weight"),
        (r"visual\.conv1\.weight", "vision_model.embeddings.patch_embedding.weight"),
        (r"visual\.ln_pre\.(.*)", r"vision_model.pre_layrnorm.\1"),
        (r"visual\.ln_post\.(.*)", r"vision_model.post_layernorm.\1"),
        (r"visual\.proj", "visual_projection.weight"),
    ]
    for source, target in ((r"visual\.transformer", "vision_model"), ("transformer", "text_model")):
        for pattern, replacement in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                                     (r"attn\.(q|k|v)_proj", r"self_attn.\2_proj"),
                                     (r"attn\.out_proj", "self_attn.out_proj"),
                                     (r"mlp\.c_fc", "mlp.fc1"), (r"mlp\.c_proj", "mlp.fc2")):
            table.append((source + r"\.resblocks\.(\d+)\." + pattern + r"\.(weight|bias)",
                          target + r".encoder.layers.\1." + replacement + r".\g<" +
                          ("3" if "(q|k|v)" in pattern else "2") + ">"))
    return rename(out, tuple(table))


def openai_whisper_to_hf_whisper(state: State) -> State:
    """After transformers' convert_openai_to_hf; the output projection is the token
    embedding (tied)."""
    table: list[tuple[str, str | None]] = [
        (r"encoder\.positional_embedding", "model.encoder.embed_positions.weight"),
        (r"decoder\.positional_embedding", "model.decoder.embed_positions.weight"),
        (r"encoder\.(conv\d)\.(.*)", r"model.encoder.\1.\2"),
        (r"encoder\.ln_post\.(.*)", r"model.encoder.layer_norm.\1"),
        (r"decoder\.ln\.(.*)", r"model.decoder.layer_norm.\1"),
        (r"decoder\.token_embedding\.weight", "model.decoder.embed_tokens.weight"),
    ]
    for pattern, replacement in (
            (r"attn\.query", "self_attn.q_proj"), (r"attn\.key", "self_attn.k_proj"),
            (r"attn\.value", "self_attn.v_proj"), (r"attn\.out", "self_attn.out_proj"),
            (r"cross_attn\.query", "encoder_attn.q_proj"),
            (r"cross_attn\.key", "encoder_attn.k_proj"),
            (r"cross_attn\.value", "encoder_attn.v_proj"),
            (r"cross_attn\.out", "encoder_attn.out_proj"),
            ("attn_ln", "self_attn_layer_norm"), ("cross_attn_ln", "encoder_attn_layer_norm"),
            (r"mlp\.0", "fc1"), (r"mlp\.2", "fc2"), ("mlp_ln", "final_layer_norm")):
        table.append((r"(encoder|decoder)\.blocks\.(\d+)\." + pattern + r"\.(weight|bias)",
                      r"model.\1.layers.\2." + replacement + r".\3"))
    out = rename(state, tuple(table))
    out["proj_out.weight"] = out["model.decoder.embed_tokens.weight"]
    return out


def inverse(mapping: Mapping, example: State) -> Mapping:
    """The mapping the other way, for state dicts shaped as ``example`` (the A side).

    Runs ``mapping`` on a state dict whose elements are their own indices; keys of A that no
    element of B comes from are left out (the target keeps its own: buffers it computes).
    """
    keys = [k for k, v in example.items() if v.is_floating_point() or v.ndim == 0]
    sizes = [example[k].numel() for k in keys]
    indices = torch.arange(sum(sizes), dtype=torch.float64).split(sizes)
    moved = mapping({k: i.view(example[k].shape) for k, i in zip(keys, indices, strict=True)})

    def backwards(state: State) -> State:
        where = torch.cat([moved[k].flatten() for k in moved]).long()
        values = torch.cat([state[k].detach().flatten().double() for k in moved])
        flat = torch.full((sum(sizes),), float("nan"), dtype=torch.float64)
        flat[where] = values
        out: State = {}
        for key, chunk in zip(keys, flat.split(sizes), strict=True):
            if chunk.isnan().all():
                continue
            if chunk.isnan().any():
                raise KeyError(f"the mapping fills '{key}' only in part")
            out[key] = chunk.view(example[key].shape).to(example[key].dtype)
        return out

    return backwards
