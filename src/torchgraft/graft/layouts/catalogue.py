"""Framework layouts: how another framework names and stores what PyTorch calls the same thing.

Each layout is data: renames (rules), which weights are stored transposed, and which rows are
stored in another order (rotary attention). A layout applies when the two sides' formats,
names or module types say they were written differently.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

from ...io import paddle_layout
from ...renames import Rule
from ..tensors import Side, TensorInfo
from .bare import transposed as bare_transposed
from .conventions import ROTARY_ORDERS
from .frameworks import FRAMEWORK_LAYOUTS
from .layout import Layout

__all__ = ["BARE_PROJECTIONS", "CLIP_HF_TO_OPENAI", "CLIP_OPENAI_TO_HF", "CONV_1X1",
           "GPT2_CONV1D", "LAYOUTS", "LLAMA_HF_TO_META", "LLAMA_META_TO_HF", "PADDLE", "ROTARY",
           "PEFT_ADAPTER", "QUANTIZED_PACKED", "SENTENCE_TRANSFORMERS", "UNIT_DIMS",
           "VIT_HF_TO_TIMM",
           "family_of", "layouts_for", "mark_file_kinds", "rotary_warning"]


def _leaf(info: TensorInfo) -> str:
    return info.name.rsplit(".", 1)[-1]


def _linear_weight(info: TensorInfo) -> bool:
    return info.kind in ("linear", None) and _leaf(info) == "weight" and len(info.shape) == 2


PADDLE = Layout(
    name="paddle",
    applies=lambda src, dst: src.format == "paddle",
    renames=paddle_layout.RENAMES,
    exports=paddle_layout.EXPORTS,
    transposed=lambda src, dst: (len(src.shape) == 2 and paddle_layout.stored_transposed(
        dst.kind, dst.name, len(dst.shape))),
    why=paddle_layout.TRANSPOSED_WHY,
)

#: GPT-2's ``Conv1D`` modules, by name; a file is in that layout when its fused attention or
#: first MLP weight is stored [in, out] (wider than tall).
_CONV1D_NAME = re.compile(r"(^|\.)(attn\.c_attn|attn\.q_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)"
                          r"\.(weight|bias)$")
_CONV1D_WIDE = {re.compile(r"(^|\.)attn\.c_attn\.weight$"): 3,
                re.compile(r"(^|\.)mlp\.c_fc\.weight$"): 4}
_WIDE_ENDINGS = ("attn.c_attn.weight", "mlp.c_fc.weight")  # a cheap test before the patterns


def _conv1d_pair(src: TensorInfo, dst: TensorInfo) -> bool:
    """Exactly one side is a Conv1D weight and the other a Linear (or unknown) weight."""
    if _leaf(src) != "weight" or len(src.shape) != 2 or len(dst.shape) != 2:
        return False
    if src.kind == "gpt2_conv1d":
        return _linear_weight(dst)
    return dst.kind == "gpt2_conv1d" and _linear_weight(src)


GPT2_CONV1D = Layout(
    name="gpt2-conv1d",
    applies=lambda src, dst: any(t.kind == "gpt2_conv1d"
                                 for side in (src, dst) for t in side.tensors.values()),
    transposed=_conv1d_pair,
    why="GPT-2's Conv1D stores weights as [in, out]",
)


#: Module kinds that may hold a pointwise (1x1) projection's weight; ``None``: a file's tensor.
_POINTWISE_KINDS = frozenset({"conv", "linear", None})


def _unit_kernel(src: TensorInfo, dst: TensorInfo) -> bool:
    """One side a convolution's weight whose kernel is all ones, the other a Linear's weight.

    ``[out, in, 1, 1]`` (or ``[out, in, 1]``...) is ``[out, in]`` with unit dimensions; a
    3x3 kernel is never squeezed.
    """
    if _leaf(src) != "weight" or {len(src.shape), len(dst.shape)} & {0, 1} or \
            {src.kind, dst.kind} - _POINTWISE_KINDS or len(src.shape) == len(dst.shape):
        return False
    flat, conv = sorted((src, dst), key=lambda info: len(info.shape))
    return (len(flat.shape) == 2 and flat.kind != "conv" and conv.kind != "linear"
            and conv.shape[:2] == flat.shape and set(conv.shape[2:]) == {1})


CONV_1X1 = Layout(
    name="conv1x1-linear",
    applies=lambda src, dst: any(len(info.shape) > 2 and set(info.shape[2:]) == {1}
                                 for side in (src, dst) for info in side.tensors.values()),
    reshaped=_unit_kernel,
    why="a 1x1 convolution is a Linear",
)


def mark_file_kinds(side: Side) -> Side:
    """Recognise module kinds from a file's names and shapes (GPT-2 ``Conv1D`` weights).

    Args:
        side: A side read from a file (no module kinds).

    Returns:
        The side, with ``gpt2_conv1d`` kinds where its names and shapes say so.
    """
    wide = any(pattern.search(name) and len(info.shape) == 2
               and info.shape[1] == factor * info.shape[0]
               for name, info in side.tensors.items() if name.endswith(_WIDE_ENDINGS)
               for pattern, factor in _CONV1D_WIDE.items())
    if wide:
        for name, info in list(side.tensors.items()):
            if _CONV1D_NAME.search(name) and info.kind is None:
                side.tensors[name] = TensorInfo(name, info.shape, info.dtype, "gpt2_conv1d")
    return side


# Name families: the same architecture written by two code bases, each with a text its
# pattern cannot match without: one search of all names for that text rules most families out.
# A block's modules may sit deeper inside it than the family's own code puts them (a wrapper
# module between the block and its attention): the patterns allow it.
_FAMILIES = {  # first match wins: transformers' CLIP has Llama's attention names
    "transformers-clip": ("self_attn.q_proj.weight", re.compile(
        r"^(text_model|vision_model)\.encoder\.layers\.\d+\.self_attn\.q_proj\.weight$")),
    "openai-clip": ("attn.in_proj_weight", re.compile(
        r"^(visual\.)?transformer\.resblocks\.\d+\.attn\.in_proj_weight$")),
    "transformers-llama": ("self_attn.q_proj.weight", re.compile(
        r"(^|\.)layers\.\d+\.(?:[^.]+\.)*self_attn\.q_proj\.weight$")),
    "meta-llama": (".attention.wq", re.compile(
        r"(^|\.)layers\.\d+\.(?:[^.]+\.)*attention\.wq(kv)?\.weight$")),
    "transformers-vit": ("layernorm_before.weight", re.compile(
        r"^vit\.(encoder\.layer|layers)\.\d+\.layernorm_before\.weight$")),
    "timm-vit": ("attn.qkv.weight", re.compile(r"^blocks\.\d+\.attn\.qkv\.weight$")),
    "torchtune-qwen2": ("attn.q_proj.bias", re.compile(
        r"(^|\.)layers\.\d+\.(?:[^.]+\.)*attn\.q_proj\.bias$")),
    "torchtune-llama": ("sa_norm.scale", re.compile(
        r"(^|\.)layers\.\d+\.(?:[^.]+\.)*sa_norm\.scale$")),
}
#: Families whose attention uses rotary (RoPE) rows, and the gated MLP that tells them from
#: other code bases with the same attention names.
_ROTARY_FAMILIES = frozenset(ROTARY_ORDERS)
_GATED = re.compile(r"(^|\.)(mlp\.gate_proj|feed_forward\.w1|mlp\.gate_up_proj|mlp\.w1)\.weight$")
#: transformers' Llama module paths and Meta's (torchtune's _FROM_META), ``{n}`` a layer number,
#: and whether transformers keeps the path under ``model.``. Both directions' renames come from
#: this one table. gpt-fast names Meta's way with q, k and v fused in ``wqkv`` (``[Q; K; V]``):
#: transformers' q, k, v fused (``{q_proj,k_proj,v_proj}``) are its ``wqkv``, and the parts of
#: its ``wqkv`` split (``wqkv[0]``...) are transformers' q, k, v.
_LLAMA_PATHS = (
    ("embed_tokens", "tok_embeddings", True),
    ("norm", "norm", True),
    ("lm_head", "output", False),
    ("layers.{n}.self_attn.q_proj", "layers.{n}.attention.wq", True),
    ("layers.{n}.self_attn.k_proj", "layers.{n}.attention.wk", True),
    ("layers.{n}.self_attn.v_proj", "layers.{n}.attention.wv", True),
    ("layers.{n}.self_attn.o_proj", "layers.{n}.attention.wo", True),
    ("layers.{n}.self_attn.{q_proj,k_proj,v_proj}", "layers.{n}.attention.wqkv", True),
    ("layers.{n}.self_attn.q_proj", "layers.{n}.attention.wqkv[0]", True),
    ("layers.{n}.self_attn.k_proj", "layers.{n}.attention.wqkv[1]", True),
    ("layers.{n}.self_attn.v_proj", "layers.{n}.attention.wqkv[2]", True),
    ("layers.{n}.mlp.gate_proj", "layers.{n}.feed_forward.w1", True),
    ("layers.{n}.mlp.down_proj", "layers.{n}.feed_forward.w2", True),
    ("layers.{n}.mlp.up_proj", "layers.{n}.feed_forward.w3", True),
    ("layers.{n}.input_layernorm", "layers.{n}.attention_norm", True),
    ("layers.{n}.post_attention_layernorm", "layers.{n}.ffn_norm", True),
)


#: Places in a path template: a block number, and a tensor's leaf (``in_proj_{leaf}``).
_PLACES = {"{n}": r"(\d+)", "{leaf}": r"(weight|bias)"}


def _template_rule(source: str, target: str, prefix: str = "") -> Rule:
    """A rule from one path template to another (:data:`_PLACES` in both).

    A template ending in ``.`` renames a module (whatever follows is kept); any other names
    one key.
    """
    pattern, replacement = re.escape(source), target
    places = sorted((place for place in _PLACES if place in source), key=source.find)
    for group, place in enumerate(places, 1):
        pattern = pattern.replace(re.escape(place), _PLACES[place])
        replacement = replacement.replace(place, f"\\{group}")
    return Rule("^" + prefix + pattern + ("" if source.endswith(".") else "$"), replacement)


def _llama_renames(*, to_meta: bool) -> tuple[Rule, ...]:
    """The renames from one Llama naming family to the other, from :data:`_LLAMA_PATHS`."""
    rules = []
    for hf, meta, under_model in _LLAMA_PATHS:
        if to_meta:
            rules.append(_template_rule(hf + ".", meta + ".",
                                        r"(?:model\.)?" if under_model else ""))
        else:
            rules.append(_template_rule(meta + ".", ("model." if under_model else "") + hf + "."))
    return tuple(rules)


def family_of(side: Side) -> str | None:
    """Which known naming family a side's names belong to (``"transformers-llama"``...).

    Args:
        side: A side.

    Returns:
        The family, or ``None``.
    """
    if "family" not in side.facts:  # asked by several layouts and warnings: scanned once
        text = "\n".join(side.tensors)
        side.facts["family"] = next(
            (family for family, (part, pattern) in _FAMILIES.items() if part in text
             and any(pattern.search(name) for name in side.tensors if part in name)), None)
    family: str | None = side.facts["family"]
    return family


def _between(src_family: str, dst_family: str) -> Callable[[Side, Side], bool]:
    return lambda src, dst: family_of(src) == src_family and family_of(dst) == dst_family


LLAMA_HF_TO_META = Layout(
    name="transformers-llama->meta-llama",
    applies=_between("transformers-llama", "meta-llama"),
    renames=_llama_renames(to_meta=True),
)

LLAMA_META_TO_HF = Layout(
    name="meta-llama->transformers-llama",
    applies=_between("meta-llama", "transformers-llama"),
    renames=_llama_renames(to_meta=False),
)

#: transformers' CLIP paths and OpenAI's (open_clip's ``CLIP``; ``{n}`` a block number,
#: ``{leaf}`` weight or bias), as transformers' convert_clip_original_pytorch_to_hf maps them.
#: Bare parameters stand for embeddings and projections (:mod:`.bare`); the fused q, k, v of
#: ``nn.MultiheadAttention`` are transformers' q, k, v fused (``{q_proj,k_proj,v_proj}``) or,
#: split (``in_proj[0]``...), its q, k, v.
_CLIP_PATHS: tuple[tuple[str, str], ...] = (
    ("text_model.embeddings.token_embedding.", "token_embedding."),
    ("text_model.embeddings.position_embedding.weight", "positional_embedding"),
    ("text_model.final_layer_norm.", "ln_final."),
    ("text_projection.weight", "text_projection"),
    ("vision_model.embeddings.class_embedding", "visual.class_embedding"),
    ("vision_model.embeddings.position_embedding.weight", "visual.positional_embedding"),
    ("vision_model.embeddings.patch_embedding.", "visual.conv1."),
    ("vision_model.pre_layrnorm.", "visual.ln_pre."),
    ("vision_model.post_layernorm.", "visual.ln_post."),
    ("visual_projection.weight", "visual.proj"),
    *((f"{hf}.encoder.layers.{{n}}.{hf_block}", f"{openai}transformer.resblocks.{{n}}.{block}")
      for hf, openai in (("text_model", ""), ("vision_model", "visual."))
      for hf_block, block in (
          ("layer_norm1.", "ln_1."), ("layer_norm2.", "ln_2."),
          ("self_attn.out_proj.", "attn.out_proj."), ("mlp.fc1.", "mlp.c_fc."),
          ("mlp.fc2.", "mlp.c_proj."),
          ("self_attn.{q_proj,k_proj,v_proj}.{leaf}", "attn.in_proj_{leaf}"),
          ("self_attn.q_proj.", "attn.in_proj[0]."), ("self_attn.k_proj.", "attn.in_proj[1]."),
          ("self_attn.v_proj.", "attn.in_proj[2]."))),
)

CLIP_HF_TO_OPENAI = Layout(
    name="transformers-clip->openai-clip",
    applies=_between("transformers-clip", "openai-clip"),
    renames=tuple(_template_rule(hf, openai) for hf, openai in _CLIP_PATHS),
)

CLIP_OPENAI_TO_HF = Layout(
    name="openai-clip->transformers-clip",
    applies=_between("openai-clip", "transformers-clip"),
    renames=tuple(_template_rule(openai, hf) for hf, openai in _CLIP_PATHS),
)


BARE_PROJECTIONS = Layout(
    name="bare [in, out] projections",
    applies=lambda src, dst: any(len(info.shape) == 2 and not name.endswith("weight")
                                 for side in (src, dst) for name, info in side.tensors.items()),
    transposed=bare_transposed,
    why="a bare projection parameter is stored [in, out] (x @ W), a Linear's weight [out, in]",
)

#: Between two rotary families of different row orders (:data:`.conventions.ROTARY_ORDERS`),
#: the target's q and k rows are reordered into its family's order.
ROTARY = tuple(
    Layout(name=f"{source}->{target} rotary rows", applies=_between(source, target),
           rotary=order)
    for source, target in itertools.permutations(ROTARY_ORDERS, 2)
    if ROTARY_ORDERS[source].halves != (order := ROTARY_ORDERS[target]).halves)

_VIT_BLOCK = r"^vit\.(?:encoder\.layer|layers)\.(\d+)\."
_VIT_NAMES = (  # transformers' names (files keep the 4.x ones, v5 modules rename), timm's
    (r"^vit\.embeddings\.cls_token$", "cls_token"),
    (r"^vit\.embeddings\.position_embeddings$", "pos_embed"),
    (r"^vit\.embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (_VIT_BLOCK + r"layernorm_before\.", r"blocks.\1.norm1."),
    (_VIT_BLOCK + r"layernorm_after\.", r"blocks.\1.norm2."),
    (_VIT_BLOCK + r"attention\.(?:attention\.\{query,key,value\}|"
                  r"\{q_proj,k_proj,v_proj\})\.", r"blocks.\1.attn.qkv."),
    (_VIT_BLOCK + r"attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
    (_VIT_BLOCK + r"(?:intermediate\.dense|mlp\.fc1)\.", r"blocks.\1.mlp.fc1."),
    (_VIT_BLOCK + r"(?:output\.dense|mlp\.fc2)\.", r"blocks.\1.mlp.fc2."),
    (r"^vit\.layernorm\.", "norm."),
    (r"^classifier\.", "head."),
)

VIT_HF_TO_TIMM = Layout(
    name="transformers-vit->timm-vit",
    applies=_between("transformers-vit", "timm-vit"),
    renames=tuple(Rule(p, r) for p, r in _VIT_NAMES),
)

_PACKED = re.compile(r"\._packed_params\._packed_params\.[01]$")

QUANTIZED_PACKED = Layout(
    name="quantized-packed",
    applies=lambda src, dst: (any(_PACKED.search(n) for n in src.tensors)
                              and not any(_PACKED.search(n) for n in dst.tensors)),
    renames=(Rule(r"\._packed_params\._packed_params\.0$", ".weight"),
             Rule(r"\._packed_params\._packed_params\.1$", ".bias")),
    across=False,
)

def _sentence_transformers(attribute: str) -> Layout:
    """A sentence-transformers folder grafted into a ``SentenceTransformer``.

    Parts are numbered modules there (``2_Dense.`` is module ``2.``), and the folder's own
    model sits in its first module's ``attribute`` (``model`` in recent releases,
    ``auto_model`` before).
    """
    return Layout(
        name=f"sentence-transformers ({attribute})",
        applies=lambda src, dst: (src.format == "sentence-transformers" and any(
            k.startswith(f"0.{attribute}.") for k in dst.tensors)),
        renames=(Rule(r"^(\d+)_[A-Za-z]\w*\.", r"\1."), Rule(r"^0\.", f"0.{attribute}.")),
        across=False,
    )


_LORA_FILE = re.compile(r"\.lora_[AB]\.weight$")

PEFT_ADAPTER = Layout(
    name="peft-adapter",
    applies=lambda src, dst: (any(_LORA_FILE.search(k) for k in src.tensors)
                              and any(".lora_A.default." in k for k in dst.tensors)),
    renames=(Rule(r"\.(lora_A|lora_B|lora_magnitude_vector)\.(weight|bias)$", r".\1.default.\2"),
             Rule(r"\.(lora_embedding_A|lora_embedding_B)$", r".\1.default")),
    across=False,
)
"""A PEFT adapter file (``save_pretrained``) into a ``PeftModel``: files leave out the adapter's
name, the model's state dict has it (``lora_A.default.weight``)."""

SENTENCE_TRANSFORMERS = tuple(_sentence_transformers(a) for a in ("model", "auto_model"))

def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _unit_dims(src: TensorInfo, dst: TensorInfo) -> bool:
    """The two shapes differ only by dimensions of size 1 (a bias stored ``[1, n]``).

    Modules of two known kinds that differ (a norm's and an embedding's) are no such pair.
    """
    return (src.shape != dst.shape and _squeezed(src.shape) == _squeezed(dst.shape)
            and math.prod(src.shape) == math.prod(dst.shape)
            and (src.kind is None or dst.kind is None or src.kind == dst.kind))


def _has_unit_dims(side: Side) -> bool:
    return any(1 in info.shape for info in side.tensors.values() if len(info.shape) > 1)


#: Any tensor stored with dimensions of size 1 added or removed: the same values in the same
#: order (TF's GPT-2 keeps a bias as ``[1, n]``). Shapes alone decide it; after the named
#: layouts, so a 1x1 convolution is still said to be a Linear.
UNIT_DIMS = Layout(
    name="unit-dimensions",
    applies=lambda src, dst: _has_unit_dims(src) or _has_unit_dims(dst),
    reshaped=_unit_dims,
    why="the same values with dimensions of size 1 added or removed",
    across=False,
)

LAYOUTS = (PADDLE, GPT2_CONV1D, CONV_1X1, LLAMA_HF_TO_META, LLAMA_META_TO_HF, *ROTARY,
           CLIP_HF_TO_OPENAI, CLIP_OPENAI_TO_HF, BARE_PROJECTIONS, VIT_HF_TO_TIMM,
           QUANTIZED_PACKED, PEFT_ADAPTER, *SENTENCE_TRANSFORMERS, UNIT_DIMS)


def layouts_for(source: Side, target: Side) -> list[Layout]:
    """Return the layouts that stand between a source and a target.

    Args:
        source: The source side.
        target: The target side.

    Returns:
        The layouts that apply, in :data:`LAYOUTS` order, then other frameworks' layouts
        that only the target reveals (:mod:`.framework_layouts`, built on :class:`Layout`).
    """
    return [layout for layout in (*LAYOUTS, *FRAMEWORK_LAYOUTS)
            if layout.applies(source, target)]


def rotary_warning(source: Side, target: Side) -> str | None:
    """A warning when one side is a rotary family and the other is not recognised.

    Args:
        source: The source side.
        target: The target side.

    Returns:
        The warning, or ``None`` when both families are known or neither is.
    """
    families = (family_of(source), family_of(target))
    if (families[0] is None) == (families[1] is None) or not (
            set(families) & _ROTARY_FAMILIES):
        return None
    known_side = source if families[0] is not None else target
    if not any(_GATED.search(name) for name in known_side.tensors):
        return None  # q_proj names without a gated MLP: not a Llama (Whisper, BART...)
    known = families[0] or families[1]
    return (f"one side is {known}, the other is not a naming family torchgraft knows: attention "
            "q/k rows matched there keep the source's rotary (RoPE) order, which may differ; "
            "check the outputs")
