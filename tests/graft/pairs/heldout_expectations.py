"""What the held-out suite expects, and which cases fail it today (issue 27's measure).

Every case where a tensor-for-tensor mapping exists must be filled right (outputs equal); a
module source with example inputs must end ``ok``; a file (``.pt``, ``.safetensors``, a saved
folder, MLX's file) ``ok`` or honestly ``UNVERIFIED``; no broken twin ``ok``. :data:`NOT_YET`
holds the cases that fall short today, each with the class of failure that stops it
(``xfail(strict=True)``: a case that starts passing fails the suite until it is taken off).
The mark expects falling short only: a false ok (``ok`` with other outputs) or an error fails
a marked case too. A broken twin is never listed here: one reported ``ok`` is a false ok.

:data:`KNOWN_TO_TABLES` freezes what torchgraft's name tables recognise of each held-out side
today (:mod:`.tables`), and :data:`KNOWN_LAYOUTS` the layouts that apply between a pair's
sides: a table row that names more of them fails the suite, so no table makes a case pass.
"""

from __future__ import annotations

# The classes of failure, one line each.

#: A bare file of litgpt's or to litgpt's: its fused attention's rows are stored query group
#: by group, transformers' apart; [Q; K; V] blocks and groups have the same shapes, and nothing
#: in the file says which (no config of the other code base, no layout marker).
GROUPED_ATTENTION = ("litgpt's fused attn.attn holds its rows query group by group or as "
                     "[Q; K; V] blocks alike for a bare file (same shapes, no config): "
                     "unverified with the layout named; source_model= settles it")
#: x-transformers' rotary rows (Meta's order), its fused [up; gate] and its norms' unit offset
#: are stored as transformers' are, shapes alike, in a bare file.
X_CONVENTIONS = ("x-transformers' rotary order, [up; gate] halves and norms' unit offset are "
                 "not in a bare file's shapes: unverified with each guess named; source_model= "
                 "settles them")

_FILES = ("pt", "safetensors", "pretrained")
_BARE = ("pt", "safetensors")

_FAILING: dict[str, dict[str, str]] = {
}

NOT_YET: dict[tuple[str, str], str] = {
    (pair, case): reason for pair, failing in _FAILING.items() for case, reason in failing.items()}

#: Files that cannot tell what a right fill needs: they must end UNVERIFIED (never ok) naming
#: the guess, and the same file with the source's code base as ``source_model=`` (and inputs)
#: must end ok with equal outputs. litgpt's own folder (``lit_model.pth``) holds no transformers
#: config either; a transformers folder does, and its own model settles the graft into litgpt.
UNDECIDABLE: dict[tuple[str, str], str] = {
    (pair, flavour): GROUPED_ATTENTION
    for pair, flavours in {
        "transformers Llama -> litgpt Llama": _BARE,
        "litgpt Llama -> transformers Llama": _FILES,
        "transformers Mixtral -> litgpt Mixtral": _BARE,
        "litgpt Mixtral -> transformers Mixtral": _FILES,
    }.items() for flavour in flavours} | {
    (pair, flavour): X_CONVENTIONS for pair in (
        "x-transformers decoder -> transformers Llama (biased MLP)",
        "transformers Llama (biased MLP) -> x-transformers decoder")
    for flavour in _BARE}

#: What the tables recognise of each held-out side today (module state dicts and saved files):
#: generic roles (norms, heads, q/k/v), no naming family, fusion or expert entry of theirs,
#: except where noted.
_CONVNEXT_TIMM = ("FUSIONS fc1", "GLU_ORDERS fc1", "context shortcut: downsample.0",
                  "context shortcut: downsample.1", "role down: fc2", "role head: fc",
                  "role up: fc1")
KNOWN_TO_TABLES: dict[str, frozenset[str]] = {name: frozenset(entries) for name, entries in {
    "litgpt Llama": ("role embed: wte", "role head: lm_head", "role norm#1: norm_1",
                     "role norm#2: norm_2", "role o: proj"),
    # the router, mlp.gate, bears the GLU parts' name for a gate projection
    "litgpt Mixtral": ("FUSIONS gate", "role embed: wte", "role gate: gate",
                       "role head: lm_head", "role norm#1: norm_1", "role norm#2: norm_2",
                       "role o: proj"),
    "x-transformers decoder": ("role k: to_k", "role q: to_q", "role v: to_v"),
    "encodec": ("context shortcut: conv",),
    "transformers EnCodec": ("context shortcut: conv", "context shortcut: weight"),
    "timm ConvNeXt": _CONVNEXT_TIMM,
    "transformers ConvNeXT": ("role head: classifier",),
    # timm's BEiT has timm's ViT names for its qkv: the timm-vit family and the qkv fusion
    # know them; its split biases and relative-position tables no table names
    "timm BEiT": ("FUSIONS fc1", "FUSIONS qkv", "GLU_ORDERS fc1", "family timm-vit",
                  "role down: fc2", "role head: head", "role norm#1: norm1",
                  "role norm#2: norm2", "role o: proj", "role qkv: qkv", "role up: fc1"),
    # transformers' q/k/v names (its saved files keep BERT's query/key/value) are the fusion
    # table's parts
    "transformers BEiT": ("FUSIONS fc1", "FUSIONS k_proj", "FUSIONS key", "FUSIONS q_proj",
                          "FUSIONS query", "FUSIONS v_proj", "FUSIONS value", "GLU_ORDERS fc1",
                          "role down: dense", "role down: fc2", "role head: classifier",
                          "role k: k_proj", "role k: key", "role norm#1: layernorm_before",
                          "role norm#2: layernorm_after", "role o: dense", "role o: o_proj",
                          "role q: q_proj", "role q: query", "role up: dense", "role up: fc1",
                          "role v: v_proj", "role v: value"),
    "timm RegNetY": ("FUSIONS fc1", "GLU_ORDERS fc1", "context shortcut: bn",
                     "context shortcut: conv", "role down: fc2", "role head: fc",
                     "role up: fc1"),
    "transformers RegNetY": ("context shortcut: convolution", "context shortcut: normalization"),
    # mlx-whisper keeps openai-whisper's names, which the conventions know (but not its
    # mlp1/mlp2): this pair measures MLX's file (channels last, no marker, hash order)
    "mlx-whisper (MLX save_weights)": (
        "BARE_PARAMETERS positional_embedding", "FUSIONS key", "FUSIONS query", "FUSIONS value",
        "context cross: cross_attn_ln", "context cross: key", "context cross: out",
        "context cross: query", "context cross: value", "role embed: token_embedding",
        "role k: key", "role norm#1: attn_ln", "role norm#1: cross_attn_ln",
        "role norm#2: mlp_ln", "role o: out", "role pos_embed: positional_embedding",
        "role q: query", "role v: value"),
}.items()}

#: The layouts that apply between a pair's sides today: Mixtral's Hub renames (the known side's
#: own), and shape-keyed ones (a 2-D bare parameter, 1x1 convolutions) that name nothing.
_BARE, _POINTWISE = "layout bare [in, out] projections", "layout conv1x1-linear"
KNOWN_LAYOUTS: dict[str, frozenset[str]] = {name: frozenset(layouts) for name, layouts in {
    "transformers Mixtral -> litgpt Mixtral": ("layout mixtral-moe",),
    "litgpt Mixtral -> transformers Mixtral": ("layout mlp->mixtral-moe",),
    "encodec -> transformers EnCodec": (_BARE, _POINTWISE),
    "transformers EnCodec -> encodec": (_BARE, _POINTWISE),
    "timm BEiT -> transformers BEiT": (_BARE,),
    "transformers BEiT -> timm BEiT": (_BARE,),
    "timm RegNetY -> transformers RegNetY": (_POINTWISE,),
    "transformers RegNetY -> timm RegNetY": (_POINTWISE,),
    "mlx-whisper (MLX save_weights) -> openai-whisper (32 wide)": (_BARE,),
    "mlx-whisper (MLX save_weights) -> transformers Whisper (32 wide)": (_BARE,),
}.items()}
