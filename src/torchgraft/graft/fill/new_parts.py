"""Parts of the model declared new on purpose (``new=``, the command line's ``--new``).

A new head on a pretrained backbone, a detector's new neck: the checkpoint has nothing for
them, and that is the point. Their keys are named by glob patterns over the model's keys
(``"head.*"``; a pattern without a wildcard names a key, or a module and every key under
it: ``"head"``), matched whole and case-sensitively. Each key a pattern names that the
checkpoint does not fill is initialised as the model's own code made it (on a meta model, as
its code computes it), or as ``init=`` says (``"normal"``, ``"zeros"``), and listed in
``report.new`` rather than ``missing``: it does not make the graft incomplete. A key a pattern
names that the checkpoint does fill is filled from the checkpoint all the same, with a
warning (the pattern names more than is new). A pattern that names no key of the model is an
error, before anything is filled.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable

import torch
from torch import nn

from ...errors import TorchgraftError
from ..plan.adapt import Init, fresh_values
from ..report.report import GraftReport
from ..sides.model import state_tensors

__all__ = ["check_new", "declare_new", "named_by"]


def named_by(pattern: str, key: str) -> bool:
    """Whether a ``new=`` pattern names a key: the key itself, or a module above it."""
    return fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(key, f"{pattern}.*")


def check_new(patterns: Iterable[str], keys: Collection[str]) -> tuple[str, ...]:
    """The patterns, each checked to name at least one of the model's keys.

    Args:
        patterns: The caller's ``new=`` patterns (a lone string is one pattern).
        keys: The model's state-dict keys.

    Returns:
        The patterns, as a tuple.

    Raises:
        TorchgraftError: If a pattern is not a string, or names no key of the model.
    """
    found = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    for pattern in found:
        if not isinstance(pattern, str) or not pattern:
            raise TorchgraftError(f"new={pattern!r}: each pattern is a glob over the model's "
                                  "keys, such as 'head.*'")
        if not any(named_by(pattern, key) for key in keys):
            shown = ", ".join(f"'{k}'" for k in list(keys)[:3])
            raise TorchgraftError(f"new='{pattern}' (CLI: --new) names no key of the model "
                                  f"(its keys are such as {shown}); a pattern is a glob over "
                                  "them, such as 'head.*', or a module's name")
    return found


def declare_new(report: GraftReport, model: nn.Module, patterns: tuple[str, ...],
                init: Init) -> None:
    """Missing keys the patterns name become new; those the checkpoint filled, a warning.

    Args:
        report: The graft's report, changed in place.
        model: The filled model (unwrapped).
        patterns: The checked ``new=`` patterns.
        init: The caller's ``init=``: ``"keep"`` leaves the model's values; ``"normal"`` or
            ``"zeros"`` gives the new keys fresh ones.
    """
    if not patterns:
        return
    state = state_tensors(model)
    declared = {key: next(p for p in patterns if named_by(p, key)) for key in report.missing
                if any(named_by(p, key) for p in patterns)}
    for key, pattern in declared.items():
        tensor = state.get(key)
        if tensor is None or tensor.is_meta:
            continue  # nothing holds a value for it: still missing
        how = f"declared new (new='{pattern}'): "
        if init != "keep":
            with torch.no_grad():
                tensor.copy_(fresh_values(tensor.detach(), init))
            how += f"init='{init}'"
        elif key in report.initialised:
            how += f"computed by the model's code ({report.initialised[key]})"
        else:
            how += "the model's own values, as its code initialised them"
        report.new[key] = how
        report.reasons.pop(key, None)
    report.missing = [key for key in report.missing if key not in report.new]
    for pattern in patterns:
        filled = [k for k in report.loaded if named_by(pattern, k)]
        if filled:
            report.warnings.append(
                f"new='{pattern}' names {len(filled)} keys the checkpoint fills (e.g. "
                f"'{filled[0]}' <- '{report.mapping[filled[0]]}'): they are filled from the "
                "checkpoint, not new")
