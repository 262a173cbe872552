"""Roles of modules from their names: the conventions of the code bases people graft between.

A role (``q``, ``o``, ``gate``, ``norm#1``...) says what a module does whatever a code base
calls it: ``q_proj``, ``query``, ``wq`` and ``to_q`` are all ``q``. Structural matching uses
roles to tell apart candidates that shapes cannot (the q, k and v of a block, its two norms).
The conventions are data (:data:`CONVENTIONS`): a pattern searched at the end of a module's
path, the role it gives, and, where a code base gives a name its own meaning, the siblings
that say which code base it is (xformers' ``w3`` is the down projection where a ``w12``
sits beside it; Meta's is the up projection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["CONTEXTS", "CONVENTIONS", "LEAF_ROLES", "PLACES", "ROTARY_ORDERS", "Convention",
           "RotaryOrder", "joined_role", "leaf_role", "numbered", "role_of", "role_parts",
           "unit_of"]


@dataclass(frozen=True)
class Convention:
    """One naming convention.

    Attributes:
        role: The role it gives.
        pattern: A regex searched at the end of the module path (``$`` is added).
        siblings: Module names one of which must sit beside it for the convention to apply.
    """

    role: str
    pattern: str
    siblings: frozenset[str] = frozenset()
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(r"(?:^|\.)(?:" + self.pattern + r")$"))


_ATTN = (r"(?:attn|attention|self_attn|self_attention|mixer|attention\.output|encoder_attn|"
         r"cross_attn)\.")
_MLP = r"(?:mlp|ffn|feed_forward|feedforward|experts\.\d+|block_sparse_moe\.experts\.\d+)\."

#: Module names that make their sibling ``o`` or ``proj`` an attention output projection.
_ATTENTION_PARTS = frozenset({"q", "k", "v", "query", "key", "value", "wq", "q_proj", "qkv",
                              "c_attn", "wqkv", "Wqkv", "query_key_value", "qkv_proj"})

#: The conventions, first match wins: specific before generic.
CONVENTIONS: tuple[Convention, ...] = (
    Convention("qkv", r"\{q.*\}|qkv|c_attn|wqkv|Wqkv|qkv_proj|query_key_value|in_proj|to_qkv"),
    Convention("q", r"q|query|wq|q_proj|to_q|q_lin|self_q"),
    Convention("k", r"k|key|wk|k_proj|to_k|k_lin"),
    Convention("v", r"v|value|wv|v_proj|to_v|v_lin"),
    Convention("o", _ATTN + r"(?:o|o_proj|wo|out_proj|out_lin|to_out(?:\.0)?|dense|c_proj|"
                            r"proj|out)"),
    Convention("o", r"attention\.output\.dense"),
    Convention("o", r"o|wo|out|proj|o_proj|out_proj|dense|c_proj", siblings=_ATTENTION_PARTS),
    Convention("gate_up", r"\{gate.*\}|gate_up_proj|gate_up|w13|w12"),
    Convention("up_gate", r"\{up.*\}|up_gate_proj|up_gate|ff_proj"),
    Convention("down", r"w3", siblings=frozenset({"w12"})),
    Convention("gate", r"gate_proj|gate|wi_0|fc_gate|" + _MLP + r"w1"),
    Convention("up", r"up_proj|up|wi_1|" + _MLP + r"w3"),
    Convention("down", r"down_proj|down|" + _MLP + r"(?:w2|wo|c_proj|fc2|fc_out|lin2)|ff_out"),
    Convention("up", r"fc1|c_fc|fc_in|lin1|wi|dense_h_to_4h|intermediate\.dense"),
    Convention("down", r"fc2|fc_out|lin2|dense_4h_to_h|\d+\.output\.dense"),
    Convention("norm_q", r"q_norm|q_layernorm|query_norm|norm_q"),
    Convention("norm_k", r"k_norm|k_layernorm|key_norm|norm_k"),
    Convention("norm#1", r"attention\.output\.LayerNorm|input_layernorm|attention_norm|"
                         r"attn_norm|layernorm_before|ln_attn|self_attn_layer_norm|sa_norm|"
                         r"pre_attention_norm|attn_ln|cross_attn_ln|encoder_attn_layer_norm"),
    Convention("norm#2", r"\d+\.output\.LayerNorm|post_attention_layernorm|ffn_norm|"
                         r"mlp_norm|layernorm_after|ln_mlp|final_layer_norm|ff_norm|mlp_ln"),
    Convention("embed", r"embed_tokens|wte|tok_embeddings|word_embeddings|token_embedding|"
                        r"embed_in|tok_emb|token_embeddings"),
    Convention("pos_embed", r"wpe|position_embeddings|pos_embed|pos_emb|positional_embedding|"
                            r"embed_positions|position_embedding"),
    Convention("head", r"lm_head|head|classifier|embed_out|logits|(?:head\.)?fc|^output"),
)

#: Where a module sits, from any part of its path: a cross-attention, a shortcut. Prefixed to
#: its own role (``cross.q``), or its role when it has none of its own.
CONTEXTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("encoder", re.compile(r"(?:^|\.)encoder(?:\.|$)")),
    ("decoder", re.compile(r"(?:^|\.)decoder(?:\.|$)")),
    ("vision", re.compile(r"(?:^|\.)(?:vision_model|visual|vision_tower|vision_encoder)(?:\.|$)")),
    ("text", re.compile(r"(?:^|\.)(?:text_model|text_encoder|text_tower)(?:\.|$)")),
    ("cross", re.compile(r"(?:^|[._])(?:cross_attn|encoder_attn|crossattention|cross_attention)"
                         r"(?:[._]|$)")),
    ("shortcut", re.compile(r"(?:^|\.)(?:shortcut|downsample|skip|skip_connection|"
                            r"conv_shortcut|proj_shortcut)(?:\.|$)")),
)

#: Contexts that name a module's place inside a block, which code bases name unlike (latent
#: diffusion's resampling ``downsample`` is no shortcut; its ``nin_shortcut`` is one): they
#: keep modules from pairing across them first, and are set aside for what is left.
PLACES = frozenset({"shortcut"})


@dataclass(frozen=True)
class RotaryOrder:
    """How a naming family stores the rows of its rotary (RoPE) attention's q and k.

    Attributes:
        halves: The two halves of each head are apart (transformers' ``rotate_half``, after
            its conversion permuted Meta's rows); else each head's rotated pairs are adjacent
            rows (Meta's reference code, torchtune: ``x.reshape(..., -1, 2)``). Rows go into
            this order with :class:`~torchgraft.graft.layouts.ops.RotaryRows`'s ``to_halves``
            set to it.
        rows: A regex of the family's q and k keys (searched in a target key).
        fused: A regex of its fused ``[Q; K; V]`` keys (gpt-fast's ``wqkv``), whose q and k
            rows are reordered and v rows kept.
    """

    halves: bool
    rows: re.Pattern[str]
    fused: re.Pattern[str] | None = None


#: Naming families (:func:`~torchgraft.graft.layouts.catalogue.family_of`) whose attention is
#: rotary, and their row order. Between two families of different orders, q and k rows are
#: reordered; the names decide it, not a guess. torchtune's Llama builders use its pairwise
#: ``RotaryPositionalEmbeddings``; its Qwen2 (biased q/k/v) splits halves. Its Phi-3 (half-split)
#: has the Llama builders' names: only outputs compared can tell that one.
ROTARY_ORDERS: dict[str, RotaryOrder] = {
    "transformers-llama": RotaryOrder(
        True, re.compile(r"(^|\.)self_attn\.[qk]_proj\.(weight|bias)$")),
    "meta-llama": RotaryOrder(False, re.compile(r"(^|\.)attention\.w[qk]\.(weight|bias)$"),
                              re.compile(r"(^|\.)attention\.wqkv\.(weight|bias)$")),
    "torchtune-qwen2": RotaryOrder(True, re.compile(r"(^|\.)attn\.[qk]_proj\.(weight|bias)$")),
    "torchtune-llama": RotaryOrder(False, re.compile(r"(^|\.)attn\.[qk]_proj\.weight$")),
}

_NUMBERED_NORM = re.compile(r"(?:^|\.)(?:norm|ln|bn|layernorm|layer_norm|gn)_?(\d+)$")
#: A part of a fused tensor split by torchgraft (``attn.qkv[1]``), and the roles of its parts,
#: by the role of the fused module. A gated first projection under a plain name (``fc1``, role
#: ``up``) is split gate first (:mod:`~torchgraft.graft.layouts.glu`: a guess).
_PART = re.compile(r"^(.*)\[(\d+)\]$")
_PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up"), "up_gate": ("up", "gate"),
          "up": ("gate", "up")}


def role_of(path: str, siblings: frozenset[str] = frozenset()) -> str | None:
    """The role of a module from its path (``layers.0.self_attn.q_proj`` is ``q``).

    A context found anywhere in the path prefixes it: ``decoder.layers.0.encoder_attn.q_proj``
    is ``cross.q``, ``layer1.0.downsample.1`` is ``shortcut``.

    Args:
        path: The module's path.
        siblings: The names of the modules beside it (under the same parent).

    Returns:
        The role, or ``None`` when no convention names it.
    """
    contexts, own = role_parts(path, siblings)
    return joined_role(contexts, own)


def role_parts(path: str, siblings: frozenset[str] = frozenset()
               ) -> tuple[tuple[str, ...], str | None]:
    """A module's contexts (``cross``, ``encoder``...) and its own role, apart.

    Args:
        path: The module's path.
        siblings: The names of the modules beside it.

    Returns:
        The contexts found in the path, in :data:`CONTEXTS` order, and the role of its name.
    """
    return (tuple(name for name, pattern in CONTEXTS if pattern.search(path)),
            _own_role(path, siblings))


def joined_role(contexts: tuple[str, ...], own: str | None) -> str | None:
    """One role from contexts and an own role: ``cross.q``, ``shortcut``, ``q``, or None."""
    return ".".join([*contexts, *([own] if own else [])]) or None


def _own_role(path: str, siblings: frozenset[str]) -> str | None:
    part = _PART.match(path)
    if part:
        parts = _PARTS.get(_own_role(part.group(1), siblings) or "", ())
        index = int(part.group(2))
        return parts[index] if index < len(parts) else None
    numbered = _NUMBERED_NORM.search(path)
    if numbered:
        return f"norm#{int(numbered.group(1))}"
    for convention in CONVENTIONS:
        if convention.regex.search(path) and (
                not convention.siblings or convention.siblings & siblings):
            return convention.role
    stem = _OWN_LEAF.sub("", path)  # a bare parameter named for its role: q_bias is q's
    return _own_role(stem, siblings) if stem != path else None


#: A bare parameter's name that says whose tensor it is: ``q_bias``, ``v_bias``, ``k_weight``.
_OWN_LEAF = re.compile(r"_(?:bias|weight)$")


#: What a tensor of a module does, by its leaf name, where code bases name it otherwise: a
#: norm's scale is ``weight``, ``gamma``, ``g`` or ``scale``; its shift ``bias``, ``beta``, ``b``.
#: One signal among same-shape tensors of a module (a convention of code bases, not a fact of a
#: file): the stored order of a file that keeps its order of definition is the other.
LEAF_ROLES: dict[str, str] = {
    **dict.fromkeys(("weight", "gamma", "g", "scale", "w"), "scale"),
    **dict.fromkeys(("bias", "beta", "b", "shift", "offset"), "shift"),
    **dict.fromkeys(("running_mean", "moving_mean", "mean"), "mean"),
    **dict.fromkeys(("running_var", "moving_variance", "moving_var", "var", "variance"), "var"),
}


def leaf_role(leaf: str) -> str | None:
    """The role of a module's tensor from its leaf name (``gamma`` is a ``scale``), if known."""
    return LEAF_ROLES.get(leaf.lower())


#: A name that numbers its module among siblings: ``3``, or letters then a number (``b2``,
#: ``stage3``, ``layer_1``).
_NUMBERED = re.compile(r"\d+|[A-Za-z]+_?\d+")


def numbered(part: str) -> bool:
    """Whether a module name numbers it (``3``, ``b2``, ``stage3``).

    A numbered module holding modules of its own is a unit (a block, a stage).

    Args:
        part: One part of a module path.

    Returns:
        True for a number, or letters then a number.
    """
    return _NUMBERED.fullmatch(part) is not None


def unit_of(path: str) -> str:
    """The unit a module belongs to: its nearest numbered ancestor (a block), else the root.

    ``layer1.0.downsample.1`` and ``layer1.0.bn2`` are both in ``layer1.0``; timm's
    ``s1.b2.conv1.bn`` is in ``s1.b2.conv1`` (an ancestor numbered by letters and a number);
    ``features.3`` (a module of a top-level ``Sequential``) is in the root unit ``""``.

    Args:
        path: A module path.

    Returns:
        The unit's path.
    """
    parts = path.split(".")[:-1]
    last = max((k for k, part in enumerate(parts) if numbered(part)), default=-1)
    return ".".join(parts[: last + 1])
