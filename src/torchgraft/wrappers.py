"""Name prefixes that training wrappers add to every weight name."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["WRAPPER_PREFIXES", "Wrapper", "detect_wrappers", "strip_wrappers"]


@dataclass(frozen=True)
class Wrapper:
    """A wrapper seen in weight names.

    Attributes:
        prefix: What it adds to every name, e.g. ``"module."``.
        source: What adds it, e.g. ``"DataParallel / DistributedDataParallel"``.
        evidence: Top-level keys of the saved object, one of which must be there for the prefix
            to count as this wrapper's when a file is renamed (empty: the prefix on every name
            is evidence enough). ``model.`` is a real module of many models (transformers'
            ``LlamaForCausalLM``), a wrapper only inside a Lightning checkpoint.
    """

    prefix: str
    source: str
    evidence: tuple[str, ...] = ()


WRAPPER_PREFIXES = (
    Wrapper("module.", "DataParallel / DistributedDataParallel"),
    Wrapper("_orig_mod.", "torch.compile"),
    Wrapper("model.", "PyTorch Lightning",
            evidence=("pytorch-lightning_version", "lightning_version")),
)


def detect_wrappers(names: Iterable[str], *,
                    saved: Collection[str] | None = None) -> list[Wrapper]:
    """Return the wrappers whose prefix starts every name, outermost first.

    Nested wrappers are peeled in turn: ``module._orig_mod.conv.weight`` gives DataParallel,
    then torch.compile.

    Args:
        names: Weight names.
        saved: The top-level keys of the saved object (empty for a bare state dict), checked
            for each wrapper's evidence; ``None`` when names are only paired, never renamed in
            a file (a graft), where every known prefix counts.

    Returns:
        The wrappers found; empty if the names are bare.
    """
    remaining = list(names)
    found: list[Wrapper] = []
    known = [w for w in WRAPPER_PREFIXES
             if saved is None or not w.evidence or any(k in saved for k in w.evidence)]
    while remaining:
        wrapper = next((w for w in known
                        if all(n.startswith(w.prefix) for n in remaining)), None)
        if wrapper is None:
            break
        found.append(wrapper)
        remaining = [n.removeprefix(wrapper.prefix) for n in remaining]
    return found


def strip_wrappers(names: Iterable[str], *,
                   saved: Collection[str] | None = None) -> tuple[str, dict[str, str]]:
    """Remove the wrapper prefixes that every name shares.

    Args:
        names: Weight names.
        saved: The saved object's top-level keys, as for :func:`detect_wrappers`.

    Returns:
        The prefix removed (``""`` if none, ``"module._orig_mod."`` for nested wrappers), and
        each name mapped to itself without it.
    """
    names = list(names)
    prefix = "".join(w.prefix for w in detect_wrappers(names, saved=saved))
    return prefix, {name: name.removeprefix(prefix) for name in names}
