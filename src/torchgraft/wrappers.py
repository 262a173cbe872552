"""Name prefixes that training wrappers add to every weight name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["WRAPPER_PREFIXES", "Wrapper", "detect_wrappers", "strip_wrappers"]


@dataclass(frozen=True)
class Wrapper:
    """A wrapper seen in weight names.

    Attributes:
        prefix: What it adds to every name, e.g. ``"module."``.
        source: What adds it, e.g. ``"DataParallel / DistributedDataParallel"``.
    """

    prefix: str
    source: str


WRAPPER_PREFIXES = (
    Wrapper("module.", "DataParallel / DistributedDataParallel"),
    Wrapper("_orig_mod.", "torch.compile"),
    Wrapper("model.", "PyTorch Lightning"),
)


def detect_wrappers(names: Iterable[str]) -> list[Wrapper]:
    """Return the wrappers whose prefix starts every name, outermost first.

    Nested wrappers are peeled in turn: ``module._orig_mod.conv.weight`` gives DataParallel,
    then torch.compile.

    Args:
        names: Weight names.

    Returns:
        The wrappers found; empty if the names are bare.
    """
    remaining = list(names)
    found: list[Wrapper] = []
    while remaining:
        wrapper = next((w for w in WRAPPER_PREFIXES
                        if all(n.startswith(w.prefix) for n in remaining)), None)
        if wrapper is None:
            break
        found.append(wrapper)
        remaining = [n.removeprefix(wrapper.prefix) for n in remaining]
    return found


def strip_wrappers(names: Iterable[str]) -> tuple[str, dict[str, str]]:
    """Remove the wrapper prefixes that every name shares.

    Args:
        names: Weight names.

    Returns:
        The prefix removed (``""`` if none, ``"module._orig_mod."`` for nested wrappers), and
        each name mapped to itself without it.
    """
    names = list(names)
    prefix = "".join(w.prefix for w in detect_wrappers(names))
    return prefix, {name: name.removeprefix(prefix) for name in names}
