"""Parts of the model declared new on purpose (``new=``, the command line's ``--new``).

A new head on a pretrained backbone, a detector's new neck: the checkpoint has nothing for
them, or nothing of their shape (21 classes on a 1000-class checkpoint), and that is the
point. Their keys are named by glob patterns over the model's keys (``"head.*"``; a pattern
without a wildcard names a key, or a module and every key under it: ``"head"``), matched
whole and case-sensitively. Each key a pattern names that the
checkpoint does not fill is initialised as the model's own code made it (on a meta model, as
its code computes it), or as ``init=`` says (``"normal"``, ``"zeros"``), and listed in
``report.new`` rather than ``missing``: it does not make the graft incomplete. A head whose rows
differ, which the graft re-initialises, is listed in ``report.new`` rather than
``reinitialised`` once declared (the checkpoint's head it replaces stays listed unused, saying
so). A key a pattern names that the checkpoint does fill is filled from the checkpoint all the
same, with a warning (the pattern names more than is new). A pattern that names no key of the
model is an error, before anything is filled, naming the model's modules nearest to it.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Collection, Iterable

import torch
from torch import nn

from ...errors import TorchgraftError
from ...text import few, quoted
from ..plan.adapt import Init, fresh_values
from ..plan.steps import REINITIALISED
from ..report.heads import HEAD_NAME
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
            near = nearest_modules(pattern, keys) or list(keys)[:3]
            raise TorchgraftError(
                f"new='{pattern}' (CLI: --new) names no key of the model; the nearest names in "
                f"it are {few(near, most=5, show=quoted)}. A pattern is a module's name (every "
                "key under it) or a glob over the keys, such as 'head.*'")
    return found


def nearest_modules(pattern: str, keys: Iterable[str], most: int = 5) -> list[str]:
    """The model's modules nearest to a pattern that names none of them, nearest first.

    Modules whose name is close to the pattern's words (``head.*`` -> ``heads``,
    ``classifier`` -> ``classifer``), then those named like a head, then the model's last
    module: what a user who meant a new head most likely meant.

    Args:
        pattern: A ``new=`` pattern.
        keys: The model's state-dict keys, in its order.
        most: How many to return.

    Returns:
        Module names, at most ``most``.
    """
    modules = list(dict.fromkeys(".".join(parts[:k]) for parts in (key.split(".") for key in keys)
                                 for k in range(1, len(parts))))  # every module, in order
    words = pattern.replace("*", "").replace("?", "").strip(".[]") or pattern
    leaves = {module: module.rpartition(".")[2] for module in modules}
    score = {m: max(difflib.SequenceMatcher(None, words, m).ratio(),
                    difflib.SequenceMatcher(None, words, leaves[m]).ratio()) for m in modules}
    close = sorted((m for m in modules if score[m] >= 0.6), key=lambda m: -score[m])
    heads = [m for m in modules if HEAD_NAME.search(leaves[m])]
    return list(dict.fromkeys([*close, *heads, *modules[-1:]]))[:most]


def declare_new(report: GraftReport, model: nn.Module, patterns: tuple[str, ...],
                init: Init) -> None:
    """Missing or re-initialised keys the patterns name become new; filled ones, a warning.

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
    for key in [*report.missing, *report.reinitialised]:
        pattern = next((p for p in patterns if named_by(p, key)), None)
        tensor = state.get(key)
        if pattern is None or tensor is None or tensor.is_meta:
            continue  # not declared, or nothing holds a value for it: as it was
        how = _initialised(report, key, tensor, init)
        report.new[key] = f"declared new (new='{pattern}'): {how}"
    _replaced(report, patterns)
    unused = set(report.unused)
    for key in report.new:
        if key not in unused:  # a checkpoint key of the same name keeps its reason
            report.reasons.pop(key, None)
    report.missing = [key for key in report.missing if key not in report.new]
    report.reinitialised = {k: v for k, v in report.reinitialised.items()
                            if k not in report.new}
    _filled_anyway(report, patterns)


def _initialised(report: GraftReport, key: str, tensor: torch.Tensor, init: Init) -> str:
    """How a key declared new gets its values (``init=``'s, given here), in words."""
    if init != "keep":
        with torch.no_grad():
            tensor.copy_(fresh_values(tensor.detach(), init))
        return f"init='{init}'"
    if key in report.initialised:
        return f"computed by the model's code ({report.initialised[key]})"
    return "the model's own values, as its code initialised them"


def _replaced(report: GraftReport, patterns: tuple[str, ...]) -> None:
    """The checkpoint's head that a head declared new replaces says so (it stays unused)."""
    unused = set(report.unused)
    replaced = {report.reasons.get(source): source for source in report.unused}
    for key in report.reinitialised:
        if key not in report.new:
            continue
        source = key if key in unused else replaced.get(f"'{key}' {REINITIALISED}")
        pattern = next(p for p in patterns if named_by(p, key))
        if source is not None:
            report.reasons[source] = (f"'{key}' is declared new (new='{pattern}'): the "
                                      "checkpoint's head of other rows is not used")


def _filled_anyway(report: GraftReport, patterns: tuple[str, ...]) -> None:
    """A warning for each pattern naming keys the checkpoint fills: they are not new."""
    for pattern in patterns:
        filled = [k for k in report.loaded if named_by(pattern, k)]
        if filled:
            report.warnings.append(
                f"new='{pattern}' names {len(filled)} keys the checkpoint fills (e.g. "
                f"'{filled[0]}' <- '{report.mapping[filled[0]]}'): they are filled from the "
                "checkpoint, not new")
