"""What issue 37's held-out suite expects, and which cases fall short today.

The bar is the held-out suite's (:mod:`.heldout_checks`): a module source with example inputs
ends ``ok`` with equal outputs; a file ``ok`` or ``UNVERIFIED`` with equal outputs; a file that
cannot tell (:data:`UNDECIDABLE`) ``UNVERIFIED`` with the guess named, settled ``ok`` by the
source's code; no broken twin ``ok``, the sorted twin never ``ok`` with other outputs.
:data:`NOT_YET` holds the cases that fall short on main today, each with the class of failure
seen in its report (``xfail(strict=True)``: a case that starts passing fails the suite until
it is taken off). A false ok fails a pair's case even under the mark; a twin is listed only
for the false ok it shows.

:data:`KNOWN_TO_TABLES` freezes what torchgraft's tables recognise of each held-out side today
(:mod:`.tables`), :data:`KNOWN_LAYOUTS` the layouts that apply between a pair's sides: a table
row that names more of them fails the suite, so no table makes a case pass.
"""

from __future__ import annotations

# The classes of failure seen on main (issue 37's list), one line each.

#: CodeGen's fused projection per model-parallel core: a bare file cannot say it.
PER_CORE_FILE = ("a bare file does not say that qkv_proj holds per-core [q, v, k] blocks "
                 "([Q; K; V] thirds have the same shapes): it must end UNVERIFIED naming the "
                 "split as a guess, settled by the source's code")
#: Interleaved-pair rotary with grouped heads: a bare file cannot say the order.
ROTARY_FILE = ("a bare file does not say OLMo-core's rotary order (complex rotations pair adjacent "
               "rows; halves have the same shapes): it must end UNVERIFIED naming the permutation, "
               "settled by the source's code")

_BARE = ("pt", "safetensors")
_CODEGEN = ("transformers CodeGen -> transformers GPT-J",
            "transformers GPT-J -> transformers CodeGen")
_TO_CORE = "transformers Llama -> OLMo-core Llama (complex rotary)"
_FROM_CORE = "OLMo-core Llama (complex rotary) -> transformers Llama"

#: None falls short today: the VAEs' levels numbered the other way, from a bare file, are
#: aligned by their shapes (:mod:`torchgraft.graft.plan.numbering`).
NOT_YET: dict[tuple[str, str], str] = {}

#: Files that cannot tell what a right fill needs: they must end UNVERIFIED (never ok) naming
#: the guess, and the same file with the source's code base as ``source_model=`` (and inputs)
#: must end ok with equal outputs. OLMo-core's own checkpoint (a distributed checkpoint of
#: the state) holds no config either.
UNDECIDABLE: dict[tuple[str, str], str] = {
    **{(pair, flavour): PER_CORE_FILE for pair in _CODEGEN for flavour in _BARE},
    **{(_TO_CORE, flavour): ROTARY_FILE for flavour in _BARE},
    **{(_FROM_CORE, flavour): ROTARY_FILE for flavour in (*_BARE, "pretrained")},
}

#: What the tables recognise of each side today (its state dict and saved files): generic
#: roles and fusion parts, except where noted.
KNOWN_TO_TABLES: dict[str, frozenset[str]] = {name: frozenset(entries) for name, entries in {
    "latent-diffusion AutoencoderKL": (
        "FUSIONS k", "FUSIONS q", "FUSIONS v", "context shortcut: conv", "role k: k",
        "role norm#1: norm1", "role norm#2: norm2", "role q: q", "role v: v"),
    "diffusers AutoencoderKL": (
        "context shortcut: conv_shortcut", "role k: to_k", "role norm#1: norm1",
        "role norm#2: norm2", "role q: to_q", "role v: to_v"),
    # qkv_proj is the conventions' name of a fused projection, read as [Q; K; V] thirds
    "transformers CodeGen": (
        "FUSIONS fc_in", "FUSIONS qkv_proj", "GLU_ORDERS fc_in", "role down: fc_out",
        "role embed: wte", "role head: lm_head", "role norm#1: ln_1", "role o: out_proj",
        "role qkv: qkv_proj", "role up: fc_in"),
    "transformers GPT-J": (
        "FUSIONS fc_in", "FUSIONS k_proj", "FUSIONS q_proj", "FUSIONS v_proj", "GLU_ORDERS fc_in",
        "role down: fc_out", "role embed: wte", "role head: lm_head", "role k: k_proj",
        "role norm#1: ln_1", "role o: out_proj", "role q: q_proj", "role up: fc_in",
        "role v: v_proj"),
    # the GLU table names AI2's ff_proj ([up; gate]); nothing names its att_proj
    "AI2 OLMo": ("FUSIONS ff_proj", "GLU_ORDERS ff_proj", "role down: ff_out",
                 "role embed: wte", "role up_gate: ff_proj"),
    # transformers' OLMo keeps Llama's names: the transformers-llama family
    "transformers OLMo": (
        "FUSIONS gate_proj", "FUSIONS k_proj", "FUSIONS q_proj", "FUSIONS up_proj",
        "FUSIONS v_proj", "family transformers-llama", "role down: down_proj",
        "role embed: embed_tokens", "role gate: gate_proj", "role head: lm_head",
        "role k: k_proj", "role o: o_proj", "role q: q_proj", "role up: up_proj",
        "role v: v_proj"),
    "OLMo-core Llama (complex rotary)": (
        "FUSIONS w1", "FUSIONS w3", "role down: w2", "role gate: w1",
        "role norm#1: attention_norm", "role up: w3"),
    "torch TransformerEncoder": (
        "BARE_PARAMETERS in_proj_bias", "BARE_PARAMETERS in_proj_weight", "FUSIONS in_proj",
        "role norm#1: norm1", "role norm#2: norm2", "role o: out_proj", "role qkv: in_proj"),
    "transformers BERT encoder": (
        "FUSIONS key", "FUSIONS query", "FUSIONS value", "role down: dense", "role k: key",
        "role norm#1: LayerNorm", "role norm#2: LayerNorm", "role o: dense", "role q: query",
        "role up: dense", "role v: value"),
    "transformers ConvNeXt V2": ("role head: classifier",),
}.items()}

#: The layouts that apply between a pair's sides today: shape-keyed, naming nothing.
_POINTWISE = "layout conv1x1-linear"
KNOWN_LAYOUTS: dict[str, frozenset[str]] = {name: frozenset(layouts) for name, layouts in {
    "latent-diffusion AutoencoderKL -> diffusers AutoencoderKL": (_POINTWISE,),
    "diffusers AutoencoderKL -> latent-diffusion AutoencoderKL": (_POINTWISE,),
    "timm ConvNeXt V2 -> transformers ConvNeXt V2": (_POINTWISE,),
    "transformers ConvNeXt V2 -> timm ConvNeXt V2": (_POINTWISE,),
}.items()}
