"""Grafts into a quantized model: the same architecture's checkpoint, loaded as torch loads it.

A quantized module packs its weight with its quantizer (``_packed_params``), so it cannot be
filled one tensor at a time, and no layout or adaptation applies to it. What does apply is the
plain case ``load_state_dict`` handles: a checkpoint of the same quantized architecture
(``torch.save(quantize_dynamic(model).state_dict())``), whose packed ``(weight, bias)`` entries
torchgraft reads as ``....0`` / ``....1``. Those are put back together and given to the model's
own ``load_state_dict``, every shape and dtype checked first; a float checkpoint is reported
missing with the way out (graft into the float model, then quantize).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...meta import TensorRef
from ...wrappers import strip_wrappers
from ..report.report import GraftReport

__all__ = ["graft_quantized"]

_FLOAT_ADVICE = ("the model is quantized: its packed weights are filled only from a checkpoint "
                 "of the same quantized model. Graft into the float model, then quantize it "
                 "(torch.ao.quantization.quantize_dynamic or convert)")


def _parts(key: str, value: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors a state-dict entry holds, named as torchgraft reads them from a file."""
    if isinstance(value, tuple):
        return [(f"{key}.{i}", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return [(key, value)] if isinstance(value, torch.Tensor) else []


def _same_kind(ref: TensorRef, expected: torch.Tensor) -> str | None:
    """Why a stored tensor cannot stand for ``expected`` in the model, or ``None``."""
    meta = ref.meta
    if tuple(meta.shape) != tuple(expected.shape) or meta.dtype != expected.dtype:
        return (f"checkpoint has {tuple(meta.shape)} {meta.dtype}, model expects "
                f"{tuple(expected.shape)} {expected.dtype}")
    return None


def _names(refs: dict[str, TensorRef], own: dict[str, Any]) -> dict[str, str]:
    """The model's key to the source's: as they are, or without the source's wrappers."""
    if any(key in refs for key, value in own.items() for key, _t in _parts(key, value)):
        return {n: n for n in refs}
    return {bare: n for n, bare in strip_wrappers(refs)[1].items()}


def _problems(parts: list[tuple[str, torch.Tensor]], refs: dict[str, TensorRef],
              names: dict[str, str]) -> dict[str, str]:
    """Why each tensor of a packed entry cannot be loaded (none: every one can)."""
    problems = {}
    for part, expected in parts:
        ref = refs.get(names.get(part, ""))
        why = "not in the checkpoint" if ref is None else _same_kind(ref, expected)
        if why is not None:
            problems[part] = why
    return problems


def _entry(key: str, value: Any, refs: dict[str, TensorRef], names: dict[str, str],
           report: GraftReport) -> Any:
    """The value of one state-dict entry: read from the source, or the model's own."""
    parts = _parts(key, value)
    if not parts:  # the packed weights' dtype: the model's own, checked through them
        return value
    problems = _problems(parts, refs, names)
    report.add_missing({part: f"Cannot load '{part}': {why}; "
                              f"{_FLOAT_ADVICE if '_packed_params' in part else 'left as it was'}"
                        for part, why in problems.items()})
    if problems:
        return value  # given back as it is: a packed module needs all its entries
    read = [refs[names[part]].read() for part, _t in parts]
    for part, _t in parts:
        report.loaded.append(part)
        report.mapping[part] = names[part]
        report.matched_by[part] = "exact" if names[part] == part else "wrapper"
    return tuple(read) if isinstance(value, tuple) else read[0]


def graft_quantized(refs: dict[str, TensorRef], target: nn.Module) -> GraftReport:
    """Load a checkpoint of the same quantized architecture into a quantized model.

    Args:
        refs: The source's tensors (a packed entry as ``key.0``, ``key.1``).
        target: The unwrapped quantized model, filled in place.

    Returns:
        The report: a packed entry is loaded when every tensor of it is there with the
        model's shape and dtype; nothing is renamed but wrapper prefixes.
    """
    own = target.state_dict()
    names = _names(refs, own)
    report = GraftReport(targets=[p for k, v in own.items() for p, _t in _parts(k, v)],
                         sources=list(refs))
    state = {key: _entry(key, value, refs, names, report) for key, value in own.items()}
    if report.loaded:
        state_dict: Any = type(own)(state)
        state_dict._metadata = getattr(own, "_metadata", None)  # versions: the packed dtype's
        target.load_state_dict(state_dict)
    used = set(report.mapping.values())
    report.unused = [n for n in refs if n not in used]
    for name in report.unused:
        report.reasons.setdefault(name, "not a tensor of this quantized model")
    return report
