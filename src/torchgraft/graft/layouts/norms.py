"""Norms whose weight stores its scale with a unit offset (``gamma - 1``), by code base.

transformers' Gemma computes ``x_normed * (1 + weight)``: a Gemma checkpoint's norm weights are
``gamma - 1`` (zeros at initialisation), where Llama's ``x_normed * weight`` stores ``gamma``.
Which norm classes do so is data (:data:`UNIT_OFFSET`); every other norm of a code base whose
norms are known (torch's own, transformers') stores its scale plainly. Between a unit-offset
norm and a plain one, 1 is added or subtracted. A norm of a class the table says nothing of (a
hand-written model's, x-transformers' ``g``) is measured: its own forward is run on a copy with
its scale set to 0, then to -1; the one that zeroes the output is the offset (a plain norm's
``x * 0``, a unit-offset norm's ``x * (1 + -1)``). Its scale is ``weight``, else its one 1-D
parameter other than a bias (``g``, ``gamma``, ``scale``). A norm whose forward cannot be run
so (a sharded one, one that raises) is assumed plain, as nearly every code base stores it, but
beside a unit-offset norm that assumption is a guess until outputs are compared.

A file does not say its norms' classes: its weights are taken as the model's own code base
stores them, as ``load_state_dict`` takes them, unless ``source_model=`` is a module of the
file's code base, whose classes then say it (otherwise a Gemma file into a plain model is
caught only by comparing outputs: from a folder with its ``config.json``, or with a
``source_model=`` that builds one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from copy import deepcopy
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
        A norm's scale key (``layers.0.norm.weight``) to 1.0 (a unit-offset norm), 0.0 (a
        plain one) or ``None`` (a class of a code base the table does not know whose forward
        did not say), for modules whose class is a norm with a scale.
    """
    found: dict[str, float | None] = {}
    for path, module in model.named_modules() if modules is None else modules:
        cls = _norm_class(type(module))
        scale = None if cls is None else _scale_of(module)
        if cls is None or scale is None:
            continue
        found[f"{path}.{scale}" if path else scale] = (
            1.0 if cls.__name__ in UNIT_OFFSET else
            0.0 if cls.__module__.startswith(KNOWN_CODEBASES) else _measured(module, scale))
    return found


def _state(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's own floating parameters and buffers.

    A frozen norm keeps its scale as a buffer (torchvision's ``FrozenBatchNorm2d``).
    """
    return [(name, t) for name, t in [*module.named_parameters(recurse=False),
                                      *module.named_buffers(recurse=False)]
            if t.is_floating_point()]


def _scale_of(module: nn.Module) -> str | None:
    """A norm's scale: its ``weight``, else its one 1-D parameter other than a bias."""
    if isinstance(getattr(module, "weight", None), torch.Tensor):
        return "weight"
    scales = [name for name, p in module.named_parameters(recurse=False)
              if p.dim() == 1 and name != "bias"]
    return scales[0] if len(scales) == 1 else None


def _probe_value(name: str, scale: str, offset: float) -> float:
    """What a probed norm's tensor holds: the scale ``-offset``, a variance 1, the rest 0."""
    if name == scale:
        return -offset
    return 1.0 if "var" in name else 0.0


#: The probe's input: two rows of the norm's width (a channel-first norm reads them as channels).
_PROBE_ROWS = 2


def _measured(module: nn.Module, scale: str) -> float | None:
    """The offset a norm's own forward shows: the scale (0 or -1) that zeroes its output.

    The forward runs on a copy of the norm alone, never on the caller's module: its scale
    (a parameter, or a buffer of a frozen norm) set, a variance (running statistics) 1, every
    other floating tensor 0. A norm whose tensors are sharded, or whose forward raises or
    returns no tensor, says nothing (``None``); so does one on the meta device that keeps
    buffers the probe does not set (their values would be unknown).
    """
    tensors = [*module.parameters(), *module.buffers()]
    on_meta = any(t.is_meta for t in tensors)
    probed = {name for name, _ in _state(module)}
    if any(type(t) not in (torch.Tensor, nn.Parameter) for t in tensors) or (
            on_meta and any(name not in probed for name, _ in module.named_buffers())):
        return None
    width = getattr(module, scale).shape[0]
    probe = torch.randn(_PROBE_ROWS, width, generator=torch.Generator().manual_seed(0))
    zeroes = []
    for offset in (0.0, 1.0):
        try:
            copy = deepcopy(module).eval()
            copy = (copy.to_empty(device="cpu") if on_meta else copy).float()
            with torch.no_grad():
                for name, tensor in _state(copy):
                    tensor.fill_(_probe_value(name, scale, offset))
                out = copy(probe)
        except Exception:  # the model's own code: any failure says nothing
            return None
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        zeroes.append(bool(out.abs().max() <= 1e-6 * probe.abs().max()))
    return (0.0 if zeroes[0] else 1.0) if zeroes.count(True) == 1 else None


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
    """The norms of both sides: scale key to offset (see :func:`norm_offsets`).

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
        if not self.source or target not in self.target:
            return 0.0, None
        stored, wanted = self.source.get(source, 0.0), self.target[target]
        delta = (stored or 0.0) - (wanted or 0.0)
        if (stored is None and wanted) or (wanted is None and stored):
            unknown = "model's" if wanted is None else "checkpoint's"
            return delta, Guess(
                (f"{source} {'with' if not delta else 'without'} the unit offset",),
                f"a unit-offset norm (weight = gamma - 1) beside a norm whose class the {unknown} "
                "code base does not tell: taken as plain (weight = gamma)")
        return delta, None
