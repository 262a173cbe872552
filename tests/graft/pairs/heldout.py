"""The held-out pairs, each way: code bases none of torchgraft's name tables lists.

Each pair is run as the real-pairs suite runs its own (:func:`~tests.graft.pairs.pairs.graft_case`:
every flavour, broken twins) against its reference mapping (:mod:`.heldout_references`). The
classes of failure they stand for are issue 27's: fused projections under unknown names
(litgpt's per-group ``attn.attn``, x-transformers' ``[up; gate]`` ``proj``), experts under
another naming family (litgpt's ``experts.{e}.fc_1``), re-parametrised weights (weight norm's
old and new names), a rotary family no table knows (x-transformers: Meta's row order, one
container numbering attention and MLP layers apart), modules outside the numbered blocks under
other names (ConvNeXt's and RegNet's stems and heads), split biases and relative-position
tables (BEiT), blocks named ``s1.b1`` with the shortcut defined last (RegNet).
"""

from __future__ import annotations

from tests.graft.pairs import heldout_references as held
from tests.graft.pairs.codebases import ARCHS
from tests.graft.pairs.heldout_codebases import HELDOUT_ARCHS
from tests.graft.pairs.pairs import HF_LLAMA_GLU, Pair, affine, both_ways

#: Every architecture the held-out pairs use, by name.
PAIR_ARCHS = {**ARCHS, **HELDOUT_ARCHS}
_LLAMA_NORMS = ("model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm")
_LITGPT_NORMS = ("transformer.h.0.norm_1", "transformer.h.0.norm_2")


def _lstm(module: str) -> tuple[str, str]:
    """An LSTM's input and hidden weights: the same shape where both are as wide."""
    return f"{module}.weight_ih_l0", f"{module}.weight_hh_l0"


HELDOUT_PAIRS: list[Pair] = [
    *both_ways("transformers Llama", "litgpt Llama", held.hf_llama_to_litgpt,
               (_LLAMA_NORMS, _LITGPT_NORMS), archs=PAIR_ARCHS,
               siblings=(HF_LLAMA_GLU, ("transformer.h.*.mlp.fc_1", "transformer.h.*.mlp.fc_2"))),
    *both_ways("transformers Mixtral", "litgpt Mixtral", held.hf_mixtral_to_litgpt,
               (_LLAMA_NORMS, _LITGPT_NORMS), archs=PAIR_ARCHS,
               siblings=(("model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.v_proj"),
                         ("transformer.h.*.mlp.experts.*.fc_1",
                          "transformer.h.*.mlp.experts.*.fc_2"))),
    *both_ways("x-transformers decoder", "transformers Llama (biased MLP)",
               held.x_transformers_to_hf_llama,
               (("attn_layers.layers.0.0.0", "attn_layers.layers.1.0.0"), _LLAMA_NORMS),
               archs=PAIR_ARCHS, inverse=held.hf_llama_to_x_transformers,
               siblings=(("attn_layers.layers.*.1.to_k", "attn_layers.layers.*.1.to_v"),
                         HF_LLAMA_GLU)),
    *both_ways("encodec", "transformers EnCodec", held.encodec_to_hf_encodec, (None, None),
               heads=False, archs=PAIR_ARCHS,
               siblings=(_lstm("encoder.model.7.lstm"), _lstm("encoder.layers.7.lstm"))),
    *both_ways("timm ConvNeXt", "transformers ConvNeXT", held.timm_convnext_to_hf_convnext,
               (("stem.1", "stages.0.blocks.0.norm"),
                ("convnext.embeddings.layernorm",
                 "convnext.encoder.stages.0.layers.0.layernorm")),
               heads=False, archs=PAIR_ARCHS,
               siblings=(affine("stem.1"), affine("convnext.embeddings.layernorm"))),
    *both_ways("timm BEiT", "transformers BEiT", held.timm_beit_to_hf_beit,
               (("blocks.0.norm1", "blocks.0.norm2"),
                ("beit.layers.0.layernorm_before", "beit.layers.0.layernorm_after")),
               archs=PAIR_ARCHS,
               siblings=(affine("blocks.*.norm1"), affine("beit.layers.*.layernorm_before"))),
    *both_ways("timm RegNetY", "transformers RegNetY", held.timm_regnet_to_hf_regnet,
               (("s1.b1.conv3.bn", "s1.b1.downsample.bn"),
                ("regnet.encoder.stages.0.layers.0.layer.3.normalization",
                 "regnet.encoder.stages.0.layers.0.shortcut.normalization")),
               heads=False, archs=PAIR_ARCHS,
               siblings=(affine("s1.b1.conv1.bn"),
                         affine("regnet.encoder.stages.*.layers.*.layer.0.normalization"))),
]
HELDOUT_PAIR_IDS = [pair.name for pair in HELDOUT_PAIRS]

#: The sides that belong to held-out code bases (the other side of a pair may be one the
#: tables know: transformers' Llama and Mixtral).
HELDOUT_SIDES = ("litgpt Llama", "litgpt Mixtral", "x-transformers decoder", "encodec",
                 "transformers EnCodec", "timm ConvNeXt", "transformers ConvNeXT", "timm BEiT",
                 "transformers BEiT", "timm RegNetY", "transformers RegNetY")
