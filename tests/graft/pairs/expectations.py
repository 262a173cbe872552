"""What the suite expects of each case, beyond ``ok`` with equal outputs.

:data:`NOT_YET`: cases that fail today, each with the reason (``xfail(strict=True)``: a case
that starts passing fails the suite until it is taken off this list). :data:`UNDECIDABLE`:
cases where nothing the source holds can decide, so UNVERIFIED is the right verdict.
"""

from __future__ import annotations

#: Why a pair fails today: what the engine lacks.
GAPS = {
    "timm ResNet -> transformers ResNet":
        "engine: from the sorted file, same-shape siblings (conv1/conv2/downsample.0, "
        "bn1/bn2/downsample.1) are aligned in lexical order: a false ok",
    "timm ViT -> transformers ViT":
        "engine: norm1/norm2 vs layernorm_before/layernorm_after not aligned by role; sorted: "
        "the parts of timm's fused qkv ambiguous with attn.proj",
}

#: Why a broken twin is reported ok today: by twin, or by ``twin/flavour``.
TWIN_GAPS = {
    "deeper/pretrained": "verification from the folder cannot fill transformers' own model from "
                         "its file: the file keeps transformers 4 names "
                         "(attention.attention.query), the v5 module has attention.q_proj "
                         "(engine: roles)",
    "heads/pretrained": "verification from the folder cannot fill transformers' own model from "
                        "its file: the file keeps transformers 4 names "
                        "(attention.attention.query), the v5 module has attention.q_proj "
                        "(engine: roles)",
    "heads": "a bare state dict does not say its head count: not ok where a layout depends on "
             "it (engine: rotary, per-head qkv); for plain copies only verification (a config, "
             "source_model=) can tell",
    "norms": "the file is self-consistent (two norms' values swapped under their own names): "
             "only outputs compared with the user's own source model can tell",
}

_FAILING: dict[str, tuple[str, ...]] = {
    "open_clip CLIP (OpenAI layout) -> transformers CLIP":
        ("heads/pt", "norms/pt"),
    "transformers CLIP -> open_clip CLIP (OpenAI layout)":
        ("heads/pt", "norms/pt"),
    "openai-whisper -> transformers Whisper":
        ("heads/pt", "norms/pt"),
    "transformers Whisper -> openai-whisper":
        ("heads/pt", "norms/pt"),
    "transformers GPT-2 -> nanoGPT":
        ("heads/pt", "norms/pt"),
    "nanoGPT -> transformers GPT-2":
        ("heads/pt", "norms/pt"),
    "efficientnet_pytorch EfficientNet -> transformers EfficientNet":
        ("norms/pt",),
    "transformers EfficientNet -> efficientnet_pytorch EfficientNet":
        ("norms/pt",),
    "timm ResNet -> transformers ResNet":
        ("norms/pt",),
    "transformers ResNet -> timm ResNet":
        ("norms/pt",),
    "timm ViT -> transformers ViT":
        ("heads/pt", "heads/pretrained", "norms/pt"),
    "transformers ViT -> timm ViT":
        ("heads/pt", "norms/pt"),
}

def _reason(pair: str, case: str) -> str:
    if "/" not in case:
        return GAPS[pair]
    return TWIN_GAPS[case] if case in TWIN_GAPS else TWIN_GAPS[case.partition("/")[0]]


NOT_YET = {(pair, case): _reason(pair, case) for pair, failing in _FAILING.items()
           for case in failing}

#: Cases where UNVERIFIED is the right verdict, with why no evidence can decide.
_HEAD_COUNT = ("a bare state dict does not say its head count, and GPT-NeoX's fused "
               "query_key_value is stored head by head: read with the model's head size, the "
               "split is a guess (the heads twin has the same shapes)")
_ROTARY_HEADS = ("a bare state dict does not say its head count, and the rotary rows of q and k "
                 "are reordered per head: read with the model's head size, the permutation is a "
                 "guess (the heads twin has the same shapes)")
UNDECIDABLE: dict[tuple[str, str], str] = {
    (pair, flavour): _HEAD_COUNT
    for pair in ("transformers GPT-NeoX -> GPT-NeoX-style GPT",
                 "GPT-NeoX-style GPT -> transformers GPT-NeoX")
    for flavour in ("pt", "safetensors")} | {
    (pair, flavour): _ROTARY_HEADS
    for pair in ("transformers Llama -> Meta Llama", "Meta Llama -> transformers Llama",
                 "transformers Llama -> gpt-fast Llama", "gpt-fast Llama -> transformers Llama",
                 "transformers Llama -> torchtune Llama", "torchtune Llama -> transformers Llama")
    for flavour in ("pt", "safetensors")}
