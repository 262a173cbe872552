"""Norms whose weight stores its scale with a unit offset (``gamma - 1``), by code base.

transformers' Gemma computes ``x_normed * (1 + weight)``: a Gemma checkpoint's norm weights are
``gamma - 1`` (zeros at initialisation), where Llama's ``x_normed * weight`` stores ``gamma``.
Which norm classes do so is data (:data:`UNIT_OFFSET`); every other norm of a code base whose
norms are known (torch's own, transformers') stores its scale plainly. Between a unit-offset
norm and a plain one, 1 is added or subtracted. A norm of a class the table says nothing of (a
hand-written model's) is assumed plain, as nearly every code base stores it, but beside a
unit-offset norm that assumption is a guess until outputs are compared.

A file does not say its norms' classes: its weights are taken as the model's own code base
stores them, as ``load_state_dict`` takes them, unless ``source_model=`` is a module of the
file's code base, whose classes then say it (otherwise a Gemma file into a plain model is
caught only by comparing outputs: from a folder with its ``config.json``, or with a
``source_model=`` that builds one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..evidence import Guess

__all__ = ["KNOWN_CODEBASES", "UNIT_OFFSET", "NormOffsets", "norm_offsets"]

#: Norm classes that scale by ``1 + weight`` (transformers 5.24's models that do).
UNIT_OFFSET = frozenset({
    "GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "RecurrentGemmaRMSNorm",
    "T5GemmaRMSNorm", "T5Gemma2RMSNorm", "VaultGemmaRMSNorm", "Qwen3NextRMSNorm",
    "Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm", "Qwen4ExpTextRMSNorm", "Step3p7RMSNorm",
    "MiniMaxM3VLRMSNorm", "MuseGlimmerTextCenteredRMSNorm", "MuseSparkTextCenteredRMSNorm",
    "MuseSparkTextInputScaledRMSNorm", "NemotronLayerNorm1P", "VideoPrismLayerNorm",
})

#: Code bases (module prefixes of a class) whose norms not in :data:`UNIT_OFFSET` are plain.
KNOWN_CODEBASES = ("torch.nn.", "transformers.")


def norm_offsets(model: nn.Module, *,
                 modules: Iterable[tuple[str, nn.Module]] | None = None) -> dict[str, float | None]:
    """The offset each norm of a model stores its scale with.

    Args:
        model: An unwrapped module.
        modules: Its ``named_modules()``, if already walked.

    Returns:
        Norm module path to 1.0 (a unit-offset norm), 0.0 (a plain one) or ``None`` (a class
        of a code base the table does not know), for modules whose class is a norm with a
        ``weight``.
    """
    found: dict[str, float | None] = {}
    for path, module in model.named_modules() if modules is None else modules:
        cls = _norm_class(type(module))
        if cls is None or not isinstance(getattr(module, "weight", None), torch.Tensor):
            continue
        found[path] = (1.0 if cls.__name__ in UNIT_OFFSET else
                       0.0 if cls.__module__.startswith(KNOWN_CODEBASES) else None)
    return found


#: A module class to its own norm class, or ``None`` when it is no norm (found once per class).
_NORM_CLASSES: dict[type, type | None] = {}


def _norm_class(cls: type) -> type | None:
    """The norm class a module class is (FSDP2's FSDPGemmaRMSNorm: GemmaRMSNorm), if any."""
    if cls not in _NORM_CLASSES:
        own = next(c for c in cls.__mro__
                   if not c.__module__.startswith("torch.distributed.fsdp"))
        _NORM_CLASSES[cls] = own if "norm" in own.__name__.lower() else None
    return _NORM_CLASSES[cls]


@dataclass(frozen=True)
class NormOffsets:
    """The norms of both sides: module path to offset (see :func:`norm_offsets`).

    Attributes:
        source: The source module's norms; empty for a file, whose norms are taken as stored
            in the target's convention.
        target: The target's norms.
    """

    source: Mapping[str, float | None] = field(default_factory=dict)
    target: Mapping[str, float | None] = field(default_factory=dict)

    def matter(self) -> bool:
        """Whether any pair may need an offset or be a guess.

        It may with a source module's norms and a unit-offset or unknown norm on either side.
        """
        return bool(self.source) and any(
            offset != 0.0 for offset in (*self.source.values(), *self.target.values()))

    def between(self, source: str, target: str) -> tuple[float, Guess | None]:
        """What to add to a source norm weight for a target norm weight, and why it is a guess.

        Args:
            source: The source key.
            target: The target key.

        Returns:
            The offset to add (0.0: none), and the guess it is when one side is a unit-offset
            norm and the other's class is not known.
        """
        module = target.rpartition(".")[0]
        if not self.source or target.rpartition(".")[2] != "weight" or module not in self.target:
            return 0.0, None
        stored, wanted = self.source.get(source.rpartition(".")[0], 0.0), self.target[module]
        delta = (stored or 0.0) - (wanted or 0.0)
        if (stored is None and wanted) or (wanted is None and stored):
            unknown = "model's" if wanted is None else "checkpoint's"
            return delta, Guess(
                (f"{source} {'with' if not delta else 'without'} the unit offset",),
                f"a unit-offset norm (weight = gamma - 1) beside a norm whose class the {unknown} "
                "code base does not tell: taken as plain (weight = gamma)")
        return delta, None
