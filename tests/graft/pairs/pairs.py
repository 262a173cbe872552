"""The pairs of the suite, each way, and how one case (pair x flavour, or a broken twin) runs.

A case writes the source in one flavour (the live module, a ``.pt`` of its state dict, a
``.safetensors`` of it, which stores keys sorted, or the library's own saved folder), grafts it
into a fresh target with no rules, and compares the target's outputs, through its library's own
forward, with the source's.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from tests.graft.pairs import references as ref
from tests.graft.pairs.codebases import ARCHS, TWIN_HEADS, Arch, Inputs
from tests.graft.pairs.values import randomise

FLAVOURS = ("module", "pt", "safetensors", "pretrained")
TWINS = ("deeper", "heads", "norms", "sorted")


@dataclass(frozen=True)
class Pair:
    """A source and a target of two code bases, and the reference mapping between them.

    Attributes:
        source: The source architecture.
        target: The target architecture.
        reference: The source's state dict to the target's (built lazily: the reverse way
            needs an example state dict to invert the forward mapping).
        norms: Two same-shape norms of the source (module paths), for the swapped twin
            (``None``: the architecture has no norms).
        heads: Whether the architecture has attention heads (for the head-count twin).
        siblings: Two same-shape siblings of one module of the source (tensors or modules,
            full names, ``*`` for any block number, in the order the module defines them), for
            the sorted twin (``None``: none chosen).
    """

    source: Arch
    target: Arch
    reference: Callable[[], ref.Mapping]
    norms: tuple[str, str] | None
    heads: bool = True
    siblings: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        return f"{self.source.name} -> {self.target.name}"


def both_ways(a: str, b: str, forward: ref.Mapping,
              norms: tuple[tuple[str, str] | None, tuple[str, str] | None], heads: bool = True,
              *, archs: Mapping[str, Arch] = ARCHS,
              inverse: Callable[[ref.State], ref.Mapping] | None = None,
              siblings: tuple[tuple[str, str] | None, tuple[str, str] | None] = (None, None),
              ) -> list[Pair]:
    """The pair A -> B with its reference, and B -> A with the inverse.

    ``inverse`` makes the way back from an example state dict of A; by default
    :func:`~tests.graft.pairs.references.inverse` of ``forward``, which holds for mappings
    that only move elements. ``norms`` and ``siblings`` are A's, then B's.
    """
    source, target = archs[a], archs[b]
    invert = inverse or functools.partial(ref.inverse, forward)

    def backwards() -> ref.Mapping:
        return invert(source.build().state_dict())

    return [Pair(source, target, lambda: forward, norms[0], heads, siblings[0]),
            Pair(target, source, backwards, norms[1], heads, siblings[1])]


def affine(norm: str) -> tuple[str, str]:
    """A norm's weight and bias: two same-shape siblings (for the sorted twin)."""
    return f"{norm}.weight", f"{norm}.bias"


#: transformers' Llama's same-shape siblings: the gate and up projections.
HF_LLAMA_GLU = ("model.layers.*.mlp.gate_proj", "model.layers.*.mlp.up_proj")
_META_GLU = ("layers.*.feed_forward.w1", "layers.*.feed_forward.w3")

PAIRS = [
    *both_ways("transformers GPT-NeoX", "GPT-NeoX-style GPT", ref.hf_gpt_neox_to_neox_gpt,
               (("gpt_neox.layers.0.input_layernorm",
                 "gpt_neox.layers.0.post_attention_layernorm"), ("blocks.0.ln1", "blocks.0.ln2")),
               siblings=(affine("gpt_neox.layers.*.input_layernorm"), affine("blocks.*.ln1"))),
    *both_ways("transformers Llama", "torchtune Llama", ref.hf_llama_to_torchtune,
               (("model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm"),
                ("layers.0.sa_norm", "layers.0.mlp_norm")),
               siblings=(HF_LLAMA_GLU, ("layers.*.mlp.w1", "layers.*.mlp.w3"))),
    *both_ways("transformers Llama", "gpt-fast Llama", ref.hf_llama_to_gpt_fast,
               (("model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm"),
                ("layers.0.attention_norm", "layers.0.ffn_norm")),
               siblings=(HF_LLAMA_GLU, _META_GLU)),
    *both_ways("transformers Llama", "Meta Llama", ref.hf_llama_to_meta,
               (("model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm"),
                ("layers.1.attention_norm", "layers.1.ffn_norm")),
               siblings=(HF_LLAMA_GLU, _META_GLU)),
    *both_ways("transformers GPT-2", "nanoGPT", ref.hf_gpt2_to_nanogpt,
               (("transformer.h.0.ln_1", "transformer.h.0.ln_2"),
                ("transformer.h.0.ln_1", "transformer.h.0.ln_2")),
               siblings=(affine("transformer.h.*.ln_1"), affine("transformer.h.*.ln_1"))),
    *both_ways("timm ResNet", "transformers ResNet", ref.timm_resnet_to_hf_resnet,
               (("layer1.0.bn1", "layer1.0.bn2"),
                ("resnet.encoder.stages.0.layers.0.layer.0.normalization",
                 "resnet.encoder.stages.0.layers.0.layer.1.normalization")), heads=False,
               siblings=(affine("layer1.*.bn1"),
                         affine("resnet.encoder.stages.*.layers.*.layer.0.normalization"))),
    *both_ways("efficientnet_pytorch EfficientNet", "transformers EfficientNet",
               ref.efficientnet_pytorch_to_hf,
               (("_blocks.1._bn0", "_blocks.1._bn1"),
                ("efficientnet.encoder.blocks.1.expansion.expand_bn",
                 "efficientnet.encoder.blocks.1.depthwise_conv.depthwise_norm")), heads=False,
               siblings=(affine("_blocks.*._bn0"),
                         affine("efficientnet.encoder.blocks.*.expansion.expand_bn"))),
    *both_ways("timm ViT", "transformers ViT", ref.timm_vit_to_hf_vit,
               (("blocks.0.norm1", "blocks.0.norm2"),
                ("vit.layers.0.layernorm_before", "vit.layers.0.layernorm_after")),
               siblings=(affine("blocks.*.norm1"), affine("vit.layers.*.layernorm_before"))),
    *both_ways("open_clip CLIP (OpenAI layout)", "transformers CLIP", ref.open_clip_to_hf_clip,
               (("transformer.resblocks.0.ln_1", "transformer.resblocks.0.ln_2"),
                ("text_model.encoder.layers.0.layer_norm1",
                 "text_model.encoder.layers.0.layer_norm2")),
               siblings=(affine("transformer.resblocks.*.ln_1"),
                         affine("text_model.encoder.layers.*.layer_norm1"))),
    *both_ways("openai-whisper", "transformers Whisper", ref.openai_whisper_to_hf_whisper,
               (("encoder.blocks.0.attn_ln", "encoder.blocks.0.mlp_ln"),
                ("model.encoder.layers.0.self_attn_layer_norm",
                 "model.encoder.layers.0.final_layer_norm")),
               siblings=(affine("encoder.blocks.*.attn_ln"),
                         affine("model.encoder.layers.*.self_attn_layer_norm"))),
]
PAIR_IDS = [pair.name for pair in PAIRS]

INPUTS = Inputs.make()


def outputs_equal(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-4) -> bool:
    """Equal within ``rtol`` of the expected output's scale."""
    if actual.shape != expected.shape:
        return False
    scale = float(expected.abs().max())
    return float((actual.double() - expected.double()).abs().max()) <= rtol * max(scale, 1e-12)


def run(arch: Arch, model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return arch.run(model.eval(), INPUTS).detach()


def write(arch: Arch, model: nn.Module, flavour: str, folder: Path) -> Any:
    """The source in one flavour: the module itself, or the path of what was written."""
    if flavour == "module":
        return model
    if flavour == "pt":
        torch.save(model.state_dict(), folder / "model.pt")
        return folder / "model.pt"
    if flavour == "safetensors":
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
                 if not v.is_sparse}
        save_file(state, str(folder / "model.safetensors"))  # stored sorted by name
        return folder / "model.safetensors"
    assert arch.saves is not None, f"{arch.name} has no saved-folder format"
    return arch.saves(model, folder)


def flavours(pair: Pair) -> list[str]:
    return [f for f in FLAVOURS if f != "pretrained" or pair.source.saves is not None]


def verdict(report: tg.GraftReport) -> str:
    """The report's verdict as text: ok, UNVERIFIED, INCOMPLETE or DIVERGED."""
    found = getattr(report, "verdict", None)
    if found is not None:
        text = str(getattr(found, "value", found))
        return "ok" if text.lower() == "ok" else text.upper()
    if report.divergence is not None:
        return "DIVERGED"
    return "ok" if report.ok else "INCOMPLETE"


@dataclass
class Outcome:
    """One case's result: the verdict, and whether the target computes what the source did."""

    verdict: str
    equal: bool
    report: tg.GraftReport

    def row(self) -> str:
        return f"{self.verdict} / {'equal' if self.equal else 'differ'}"


def graft_case(pair: Pair, flavour: str, folder: Path, *, twin: str | None = None,
               **options: Any) -> Outcome:
    """Write the source in ``flavour``, graft it into a fresh target, compare outputs.

    A twin breaks the case so that it has no right answer: ``deeper`` (the source has one more
    block), ``heads`` (the target has another head count, same shapes), ``norms`` (two
    same-shape norms of the source swapped in what is written; in a file that keeps its order,
    their places in it swapped too, so that the names say one thing and the order the other:
    with both agreeing on the swapped values, no file could tell). Outputs are compared with
    the source as built (unbroken), so a twin's outputs never agree. The ``sorted`` twin is
    not broken: a ``.safetensors`` file (stored sorted by name) whose two same-shape siblings
    (:attr:`Pair.siblings`) are renamed so that sorting puts the second before the first
    (:func:`write_sorted_siblings`); a graft that reads the sorted order as the order of
    definition fills them exchanged.
    """
    source, expected = built(pair.source, deeper=twin == "deeper")
    if twin == "norms":
        assert pair.norms is not None, f"{pair.name} has no norms to swap"
        source = copy.deepcopy(source)
        _swap(source, *pair.norms)
    target = pair.target.build(heads=TWIN_HEADS if twin == "heads" else None).eval()
    if twin == "sorted":
        assert pair.siblings is not None, f"{pair.name} has no siblings to rename"
        written = write_sorted_siblings(source.state_dict(), pair.siblings,
                                        folder / "model.safetensors")
    else:
        written = write(pair.source, source, flavour, folder)
    if twin == "norms" and flavour == "pt":
        torch.save(_reordered(source.state_dict(), *pair.norms), written)
    inputs = pair.target.inputs(INPUTS)
    if flavour == "module" and inputs is not None and pair.source.inputs(INPUTS) is not None:
        options.setdefault("example_inputs", inputs)
        options.setdefault("source_inputs", pair.source.inputs(INPUTS))
    report = tg.graft(written, target, **options)
    try:
        equal = outputs_equal(run(pair.target, target), expected)
    except Exception:  # a graft that left the target unable to run
        equal = False
    return Outcome(verdict(report), equal, report)


#: What the sorted twin renames the first and the second sibling to: sorted, the second
#: comes first.
SORTED_NAMES = ("b_first", "a_second")


def write_sorted_siblings(state: Mapping[str, torch.Tensor], siblings: tuple[str, str],
                          path: Path) -> Path:
    """A ``.safetensors`` of ``state`` with two same-shape siblings renamed
    :data:`SORTED_NAMES`, as a code base that names them so would.

    Args:
        state: The source's state dict.
        siblings: Full names (tensors, or modules whose tensors are renamed with them) under
            one parent, the first defined first; a ``*`` in a path stands for any block
            number (``layers.*.mlp.gate_proj``: every layer's).
        path: The file to write.
    """
    renamed: dict[str, torch.Tensor] = {}
    shapes: tuple[list[tuple[int, ...]], list[tuple[int, ...]]] = ([], [])
    patterns = [re.compile(rf"({_blocks(parent)}\.){re.escape(leaf)}(\.|$)")
                for parent, _, leaf in (name.rpartition(".") for name in siblings)]
    for key, value in state.items():
        for pattern, name, found in zip(patterns, SORTED_NAMES, shapes, strict=True):
            match = pattern.match(key)
            if match:
                found.append(tuple(value.shape))
                key = f"{match.group(1)}{name}{match.group(2)}{key[match.end():]}"
                break
        renamed[key] = value.detach().clone().contiguous()
    assert shapes[0] and shapes[0] == shapes[1], f"{siblings}: not same-shape siblings"
    assert len(renamed) == len(state), f"renaming {siblings} clashes with another key"
    save_file(renamed, str(path))
    return path


def _blocks(path: str) -> str:
    """A pattern of a module path where ``*`` stands for any block number."""
    return r"\.".join(r"\d+" if part == "*" else re.escape(part) for part in path.split("."))


def through_reference(pair: Pair) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A random source's state dict mapped by the pair's reference into a fresh target.

    Returns:
        ``load_state_dict``'s result (missing and unexpected keys), the target's outputs and
        the source's, each through its library's own forward.
    """
    source = randomise(pair.source.build())
    target = pair.target.build().eval()
    result = target.load_state_dict(pair.reference()(source.state_dict()), strict=False)
    return result, run(pair.target, target), run(pair.source, source)


def assert_never_ok(outcome: Outcome, twin: str) -> None:
    """A broken twin is never ok with other outputs than its source's.

    The deeper and heads twins have no right answer (the model cannot compute what the source
    did): never ok. The norms twin of a file that keeps its order sets the names against the
    order; where the order alone tells the two norms apart (they sit in different blocks), a
    graft that follows it fills the model right, and ok is then the truth. The sorted twin has
    a right answer, which its file alone cannot tell (unknown names, sorted order): ok only
    with equal outputs.
    """
    report = f"false ok (a broken twin)\n{outcome.report}"
    assert not (outcome.verdict == "ok" and not outcome.equal), report
    if twin not in ("norms", "sorted"):
        assert not outcome.equal  # the twin is broken: no graft can give the source's outputs
        assert outcome.verdict != "ok", report


@functools.cache
def built(arch: Arch, *, deeper: bool = False) -> tuple[nn.Module, torch.Tensor]:
    """A source model, randomised, and its outputs: built once per test session."""
    torch.manual_seed(0)
    model = randomise(arch.build(deeper=deeper))
    return model, run(arch, model)


def _reordered(state: dict[str, torch.Tensor], first: str,
               second: str) -> dict[str, torch.Tensor]:
    """The state dict with two modules' keys in each other's places."""
    keys = list(state)
    a = [k for k in keys if k.startswith(f"{first}.")]
    b = [k for k in keys if k.startswith(f"{second}.")]
    places = {k: i for i, k in enumerate(keys)}
    order = list(keys)
    for x, y in zip(a, b, strict=True):
        order[places[x]], order[places[y]] = y, x
    return {k: state[k] for k in order}


def _swap(model: nn.Module, first: str, second: str) -> None:
    a, b = model.get_submodule(first), model.get_submodule(second)
    with torch.no_grad():
        for (_, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            held = x.clone()
            x.copy_(y)
            y.copy_(held)


#: The flavours each twin is tried from: a bare state dict (nothing but names and shapes),
#: and a saved folder, whose config describes the source's model (verification from files);
#: the sorted twin, a file stored sorted by name.
TWIN_FLAVOURS = {"deeper": ("pt", "pretrained"), "heads": ("pt", "pretrained"),
                 "norms": ("pt",), "sorted": ("safetensors",)}


def _applies(pair: Pair, twin: str) -> bool:
    return ((twin != "heads" or pair.heads) and (twin != "norms" or pair.norms is not None)
            and (twin != "sorted" or pair.siblings is not None))


def twin_cases(pairs: Sequence[Pair] = PAIRS) -> list[tuple[Pair, str, str]]:
    """Every broken twin of a suite (by default the real-pairs suite): (pair, flavour, twin)."""
    return [(pair, flavour, twin) for pair in pairs for twin in TWINS if _applies(pair, twin)
            for flavour in TWIN_FLAVOURS[twin] if flavour in flavours(pair)]


def cases(pairs: Sequence[Pair] = PAIRS) -> list[tuple[Pair, str, str | None]]:
    """Every case of a suite: (pair, flavour, twin or ``None``)."""
    plain: list[tuple[Pair, str, str | None]] = [
        (pair, flavour, None) for pair in pairs for flavour in flavours(pair)]
    return plain + list(twin_cases(pairs))


def case_key(pair: Pair, flavour: str, twin: str | None) -> tuple[str, str]:
    """How :mod:`expectations` names a case: (pair name, ``flavour`` or ``twin/flavour``)."""
    return pair.name, flavour if twin is None else f"{twin}/{flavour}"
