"""Reference mappings of the held-out pairs, each proven by equal outputs (``test_heldout.py``).

Where a code base publishes a converter, the mapping is that converter: litgpt's own
``convert_hf_checkpoint`` runs here; transformers' conversion scripts (not shipped in its
wheel) are followed by hand: convert_encodec_checkpoint_to_pytorch (Meta's encodec names to
transformers', weight norm as ``g``/``v``), convert_convnext_to_pytorch and
convert_beit_unilm_to_pytorch (whose source names timm's checkpoint filters also read), and
convert_regnet_to_pytorch (which pairs timm's modules with transformers' in traced order),
with transformers 5's module names where they changed (BEiT's ``q_proj``...). x-transformers
has no converter: its mapping is derived from the two forwards and proven the same way.

As in :mod:`.references`, each mapping goes one way and the other is derived with
:func:`~tests.graft.pairs.references.inverse`, except where a value changes on the way (the
unit offset of x-transformers' norms), which is undone before the moves are inverted.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from tests.graft.pairs import references as ref
from tests.graft.pairs.codebases import FFN, HEADS
from tests.graft.pairs.heldout_codebases import EXPERTS, litgpt_config
from tests.graft.pairs.references import State, rename


def _litgpt_from_hf(state: State, *, experts: bool) -> State:
    """litgpt's convert_hf_checkpoint (``copy_weights_hf_llama``), run on the state dict."""
    from litgpt.scripts.convert_hf_checkpoint import copy_weights_hf_llama

    out: State = {}
    copy_weights_hf_llama(litgpt_config(experts=experts), {}, out, dict(state))
    return out


def hf_llama_to_litgpt(state: State) -> State:
    """litgpt keeps transformers' rotary order; its ``attn.attn`` holds q, k and v per query
    group: ``[q (heads/groups heads); k; v]`` for each group in turn."""
    return _litgpt_from_hf(state, experts=False)


def _hub_experts(state: State) -> State:
    """transformers 5's stacked experts as its Mixtral checkpoints on the Hub name them (its own
    conversion mapping, undone): ``block_sparse_moe.experts.{e}.w1/w3/w2``."""
    out: State = {}
    for key, value in state.items():
        match = re.match(r"(model\.layers\.\d+\.)mlp\.(gate\.weight|experts\.(\w+))$", key)
        if match is None:
            out[key] = value
            continue
        block, what, stacked = match.group(1) + "block_sparse_moe.", match.group(2), match.group(3)
        if stacked is None:
            out[block + what] = value  # the router
            continue
        for expert in range(EXPERTS):
            if stacked == "gate_up_proj":  # [E, 2 * ffn, dim]: gate rows, then up rows
                out[f"{block}experts.{expert}.w1.weight"] = value[expert, :FFN]
                out[f"{block}experts.{expert}.w3.weight"] = value[expert, FFN:]
            else:  # down_proj [E, dim, ffn]
                out[f"{block}experts.{expert}.w2.weight"] = value[expert]
    return out


def hf_mixtral_to_litgpt(state: State) -> State:
    """Experts apart under litgpt's names (``mlp.experts.{e}.fc_1/fc_2/proj``)."""
    return _litgpt_from_hf(_hub_experts(state), experts=True)


def _from_meta_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Meta's rotary row order (pairs adjacent) to transformers' (halves apart), per head."""
    rows, cols = weight.shape
    return weight.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


#: x-transformers' layer names (``layers.{i}.1`` is an attention for even i, a feed-forward for
#: odd i) to transformers' Llama's, by what follows ``layers.{i}.``.
_X_TRANSFORMERS_LAYER = {
    ("0.0.g", 0): "input_layernorm.weight", ("0.0.g", 1): "post_attention_layernorm.weight",
    ("1.to_q.weight", 0): "self_attn.q_proj.weight",
    ("1.to_k.weight", 0): "self_attn.k_proj.weight",
    ("1.to_v.weight", 0): "self_attn.v_proj.weight",
    ("1.to_out.weight", 0): "self_attn.o_proj.weight",
    ("1.ff.2.weight", 1): "mlp.down_proj.weight", ("1.ff.2.bias", 1): "mlp.down_proj.bias",
}
#: x-transformers' keys outside its layers.
_X_TRANSFORMERS_OUTER: dict[str, Callable[[torch.Tensor], State]] = {
    "token_emb.emb.weight": lambda v: {"model.embed_tokens.weight": v},
    "attn_layers.final_norm.g": lambda v: {"model.norm.weight": v},
    "to_logits.weight": lambda v: {"lm_head.weight": v},
    "attn_layers.rotary_pos_emb.inv_freq": lambda v: {},  # computed by both
}
_X_TRANSFORMERS_NORMS = re.compile(r"(layernorm|^model\.norm)\.weight$")


def _x_transformers_moves(state: State) -> State:
    """Every move of x-transformers' state dict into transformers' Llama: two x-transformers
    layers make a Llama layer; q and k rows go from Meta's rotary order into transformers';
    the fused GLU ``ff.0.proj`` is ``[up; gate]`` (``up, gate = proj(x).chunk(2)``)."""
    out: State = {}
    for key, value in state.items():
        match = re.match(r"attn_layers\.layers\.(\d+)\.(.*)$", key)
        if match is None:
            out.update(_X_TRANSFORMERS_OUTER[key](value))
            continue
        index, rest = int(match.group(1)), match.group(2)
        prefix = f"model.layers.{index // 2}."
        if rest.startswith("1.ff.0.proj."):
            up, gate = value.chunk(2)
            leaf = rest.rpartition(".")[2]
            out[f"{prefix}mlp.up_proj.{leaf}"], out[f"{prefix}mlp.gate_proj.{leaf}"] = up, gate
            continue
        name = _X_TRANSFORMERS_LAYER[(rest, index % 2)]
        rotary = name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight")
        out[prefix + name] = _from_meta_rotary(value, HEADS) if rotary else value
    return out



def _unit_offset(state: State, offset: float) -> State:
    """x-transformers' RMSNorm scales by ``g + 1`` (``norm_add_unit_offset``, its default)."""
    return {k: v + offset if _X_TRANSFORMERS_NORMS.search(k) else v for k, v in state.items()}


def x_transformers_to_hf_llama(state: State) -> State:
    return _unit_offset(_x_transformers_moves(state), 1.0)


def hf_llama_to_x_transformers(example: State) -> ref.Mapping:
    """The way back, for x-transformers state dicts shaped as ``example``: the offset undone,
    then the moves inverted."""
    moves_back = ref.inverse(_x_transformers_moves, example)
    return lambda state: moves_back(_unit_offset(state, -1.0))


def encodec_to_hf_encodec(state: State) -> State:
    """After transformers' convert_encodec_checkpoint_to_pytorch: ``model.{i}`` is ``layers.{i}``,
    the streaming wrappers' ``conv.conv``/``convtr.convtr`` one ``conv``; weight norm is torch's
    parametrization there (``weight_g``, ``weight_v`` are ``original0``, ``original1``)."""
    out: State = {}
    for key, value in state.items():
        new = re.sub(r"^(encoder|decoder)\.model\.", r"\1.layers.", key)
        new = re.sub(r"\.(conv\.conv|convtr\.convtr)\.", ".conv.", new)
        new = re.sub(r"\.weight_([gv])$", lambda m: ".parametrizations.weight.original" +
                     ("0" if m.group(1) == "g" else "1"), new)
        out[re.sub(r"^quantizer\.vq\.layers\.(\d+)\._codebook\.",
                   r"quantizer.layers.\1.codebook.", new)] = value
    return out


def timm_convnext_to_hf_convnext(state: State) -> State:
    """After transformers' convert_convnext_to_pytorch, read through timm's checkpoint filter
    (its names for the same modules: ``stem``, ``stages.{i}.blocks``, ``conv_dw``, ``mlp.fc``)."""
    stage = r"stages\.(\d+)\."
    return rename(state, (
        (r"stem\.0\.", "convnext.embeddings.patch_embeddings."),
        (r"stem\.1\.", "convnext.embeddings.layernorm."),
        (stage + r"downsample\.", r"convnext.encoder.stages.\1.downsampling_layer."),
        (stage + r"blocks\.(\d+)\.gamma", r"convnext.encoder.stages.\1.layers.\2."
                                          "layer_scale_parameter"),
        (stage + r"blocks\.(\d+)\.conv_dw\.", r"convnext.encoder.stages.\1.layers.\2.dwconv."),
        (stage + r"blocks\.(\d+)\.norm\.", r"convnext.encoder.stages.\1.layers.\2.layernorm."),
        (stage + r"blocks\.(\d+)\.mlp\.fc(\d)\.",
         r"convnext.encoder.stages.\1.layers.\2.pwconv\3."),
        (r"head\.norm\.", "convnext.layernorm."),
        (r"head\.fc\.", "classifier."),
    ))


def timm_beit_to_hf_beit(state: State) -> State:
    """After transformers' convert_beit_unilm_to_pytorch: the fused ``qkv`` weight split, the
    query and value biases (``q_bias``, ``v_bias``; the key has none) to their projections, a
    relative-position table per block, layer scales ``gamma_{i}`` to ``lambda_{i}``."""
    out = dict(state)
    for key in [k for k in state if k.endswith(".attn.qkv.weight")]:
        ref._split_qkv(out, key, [key.replace("attn.qkv", f"attn.{p}_proj") for p in "qkv"])
    block = r"blocks\.(\d+)\."
    into = r"beit.layers.\1."
    return rename(out, (
        (r"cls_token", "beit.embeddings.cls_token"),
        (r"patch_embed\.proj\.", "beit.embeddings.patch_embeddings.projection."),
        (block + r"gamma_(\d)", into + r"lambda_\2"),
        (block + r"norm1\.", into + "layernorm_before."),
        (block + r"norm2\.", into + "layernorm_after."),
        (block + r"attn\.(q|v)_bias", into + r"attention.\2_proj.bias"),
        (block + r"attn\.(q|k|v)_proj\.", into + r"attention.\2_proj."),
        (block + r"attn\.relative_position_bias_table",
         into + "relative_position_bias.relative_position_bias_table"),
        (block + r"attn\.proj\.", into + "attention.o_proj."),
        (block + r"mlp\.", into + "mlp."),
        (r"fc_norm\.", "beit.pooler.layernorm."),
        (r"head\.", "classifier."),
    ))


def timm_regnet_to_hf_regnet(state: State) -> State:
    """After transformers' convert_regnet_to_pytorch (timm's modules in traced order): blocks
    ``s{i}.b{j}`` are ``stages.{i-1}.layers.{j-1}``; the shortcut (``downsample``, defined after
    the convolutions) comes first there."""
    def block(match: re.Match[str]) -> str:
        return (f"regnet.encoder.stages.{int(match.group(1)) - 1}."
                f"layers.{int(match.group(2)) - 1}.")

    numbered = {re.sub(r"^s(\d+)\.b(\d+)\.", block, k): v for k, v in state.items()}
    inside = r"(regnet\.encoder\.stages\.\d+\.layers\.\d+\.)"
    return rename(numbered, (
        (r"stem\.conv\.", "regnet.embedder.embedder.convolution."),
        (r"stem\.bn\.", "regnet.embedder.embedder.normalization."),
        (inside + r"conv1\.conv\.", r"\1layer.0.convolution."),
        (inside + r"conv1\.bn\.", r"\1layer.0.normalization."),
        (inside + r"conv2\.conv\.", r"\1layer.1.convolution."),
        (inside + r"conv2\.bn\.", r"\1layer.1.normalization."),
        (inside + r"se\.fc1\.", r"\1layer.2.attention.0."),
        (inside + r"se\.fc2\.", r"\1layer.2.attention.2."),
        (inside + r"conv3\.conv\.", r"\1layer.3.convolution."),
        (inside + r"conv3\.bn\.", r"\1layer.3.normalization."),
        (inside + r"downsample\.conv\.", r"\1shortcut.convolution."),
        (inside + r"downsample\.bn\.", r"\1shortcut.normalization."),
        (r"head\.fc\.", "classifier.1."),
    ))
