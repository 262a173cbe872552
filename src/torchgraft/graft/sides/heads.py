"""Attention head counts and sizes: what a model's modules, a checkpoint's config or its format say.

Two attentions with the same weight shapes and another number of heads compute something else,
and a bare state dict holds names and shapes only. Each side's counts are read through one
table of the names code bases give them (:data:`HEAD_ATTRIBUTES`): a module's attributes, its
``config``, a ``config.json``. Where a graft crosses code bases and the source states no counts
(or others) than the model's, the model's head count is an assumption
(:func:`head_assumption`), which makes the verdict ``unverified`` until outputs are compared.

Readers of other frameworks' files put the head sizes the file states (GGUF metadata, Keras and
Flax ``[hidden, heads, head_dim]`` kernels) under ``__metadata__["head_dims"]``; a model's
attention modules say theirs (``head_dim``). Two attention layers with the same weight shapes
but other head sizes compute something else, so such a pair is refused, never loaded as ok
(:func:`head_size_mismatch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..evidence import COMPARE, Assumption
from ..tensors import Side

__all__ = ["HEADS_SETTLE", "HEAD_ATTRIBUTES", "Counts", "Described", "config_heads",
           "head_assumption", "head_counts_of", "head_size_mismatch", "model_heads",
           "owner_of"]

#: The attribute names (of a module, of its ``config``) and config keys that state an
#: attention's head counts, to the count each states: the one table of them. Where a module
#: states a count under several names, the first in this order is its own.
HEAD_ATTRIBUTES: dict[str, str] = {
    "num_heads": "heads", "n_head": "heads", "n_heads": "heads", "num_attention_heads": "heads",
    "encoder_attention_heads": "heads", "decoder_attention_heads": "heads",
    "n_audio_head": "heads", "n_text_head": "heads",
    "num_key_value_heads": "kv heads", "num_kv_heads": "kv heads", "n_kv_heads": "kv heads",
    "n_local_heads": "kv heads",
    "head_dim": "head size", "head_size": "head size", "attention_head_size": "head size",
    "hidden_size_per_attention_head": "head size",
}
_ORDER = ("heads", "kv heads", "head size")

#: How a head-count assumption is settled.
HEADS_SETTLE = (f"{COMPARE}; or graft from the source's saved folder, whose config.json "
                "states it")

#: Count (``heads``, ``kv heads``, ``head size``) to the values a side states.
Counts = dict[str, frozenset[int]]

#: Sub-configs are searched this deep (``text_config``, timm's ``model_args``).
_DEPTH = 3


@dataclass(frozen=True)
class Described:
    """What the two sides of a graft state of their models beyond names and shapes.

    Attributes:
        source: The head counts the source states: its module's attributes, the config.json
            beside its file, its format's metadata; empty for a bare state dict.
        target: The model's head counts, from its modules and their configs.
        source_where: Where the source's counts come from, for messages.
        source_is_module: Whether the source is a module. A file from another code base is
            told apart from same-shape siblings by its names' conventions only (numbers, role
            tables): those pairs are guesses (:mod:`~torchgraft.graft.plan.structure`).
        target_attention: Whether a module of the model states head counts of its own (an
            attention), not only its ``config`` (an MLP of a transformer holds one too).
    """

    source: Counts = field(default_factory=dict)
    target: Counts = field(default_factory=dict)
    source_where: str = "the checkpoint"
    source_is_module: bool = False
    target_attention: bool = False


def _gather(found: dict[str, set[int]], items: Iterable[tuple[str, Any]]) -> None:
    for name, value in items:
        count = HEAD_ATTRIBUTES.get(name)
        if count is not None and isinstance(value, int) and not isinstance(value, bool) \
                and value > 0:
            found.setdefault(count, set()).add(value)


def _frozen(found: dict[str, set[int]]) -> Counts:
    return {count: frozenset(found[count]) for count in _ORDER if count in found}


def _walk(config: Mapping[str, Any], found: dict[str, set[int]], depth: int) -> None:
    _gather(found, ((str(k), v) for k, v in config.items()))
    if depth < _DEPTH:
        for value in config.values():
            if isinstance(value, Mapping):
                _walk(value, found, depth + 1)


def config_heads(config: Mapping[str, Any]) -> Counts:
    """The head counts a config states, at its top and in its sub-configs.

    Args:
        config: A config's content (a transformers ``config.json``, timm's with its
            ``model_args``).

    Returns:
        Count to values; empty when it states none.
    """
    found: dict[str, set[int]] = {}
    _walk(config, found, 0)
    return _frozen(found)


def _config_data(config: Any) -> Mapping[str, Any]:
    """A ``config`` attribute's content: ``to_dict()`` (transformers), a dataclass, its fields."""
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        return data if isinstance(data, Mapping) else {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name, None) for f in dataclasses.fields(config)}
    return vars(config) if hasattr(config, "__dict__") else {}


def model_heads(model: nn.Module, *,
                modules: Iterable[tuple[str, nn.Module]] | None = None) -> tuple[Counts, bool]:
    """The head counts a model's modules state: their attributes and their ``config``.

    Args:
        model: The model.
        modules: Its ``named_modules()``, if already walked.

    Returns:
        Count to values (empty when no module states one), and whether a module states
        counts of its own (not through a config).
    """
    found: dict[str, set[int]] = {}
    configs: dict[int, Any] = {}
    own = False
    for _path, module in model.named_modules() if modules is None else modules:
        attributes = vars(module)
        if not HEAD_ATTRIBUTES.keys().isdisjoint(attributes):
            own = True
            _gather(found, ((name, attributes[name]) for name in HEAD_ATTRIBUTES
                            if name in attributes))
        config = attributes.get("config")
        if config is not None:
            configs.setdefault(id(config), config)
    for config in configs.values():
        _walk(_config_data(config), found, 0)
    return _frozen(found), own


def _stated(module: object, count: str) -> int | None:
    """The first value a module states for ``count`` (table order), a positive integer."""
    for name, stated in HEAD_ATTRIBUTES.items():
        value = getattr(module, name, None) if stated == count else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def head_counts_of(module: object) -> tuple[int, int] | None:
    """An attention module's (query heads, key/value heads), from :data:`HEAD_ATTRIBUTES`.

    A module that states no key/value heads has as many as query heads.

    Args:
        module: A module.

    Returns:
        The counts, or ``None`` when it states no query heads.
    """
    heads = _stated(module, "heads")
    if heads is None:
        return None
    return heads, _stated(module, "kv heads") or heads


def _text(counts: Counts) -> str:
    """``4 heads, 2 kv heads, head size 16``."""
    values = {c: " or ".join(str(v) for v in sorted(counts[c])) for c in counts}
    return ", ".join(f"head size {v}" if c == "head size" else f"{v} {c}"
                     for c, v in values.items())


def head_assumption(described: Described, attention: Callable[[], bool]) -> Assumption | None:
    """The model's head count as an assumption, unless the source states the same counts.

    Called for grafts across code bases.

    Args:
        described: What both sides state.
        attention: Whether the model has attention by its modules' roles, for a model none
            of whose modules states counts of its own (asked only then).

    Returns:
        The assumption, or ``None`` when the source's counts confirm the model's or the model
        has no attention.
    """
    source, target = described.source, described.target
    shared = source.keys() & target.keys()
    if shared and all(source[count] == target[count] for count in shared):
        return None
    if not described.target_attention and not attention():
        return None
    model = (f"the model's: {_text(target)}" if target
             else "the model's (its modules do not state it)")
    if not source:
        why = ("the checkpoint does not state its attention head count (a bare state dict of "
               "another code base), and another head count has the same shapes")
    elif shared:
        why = (f"{described.source_where} states {_text(source)}, not the model's: the same "
               "shapes with another head count")
    else:
        why = (f"{described.source_where} states {_text(source)}, which does not tell the "
               "model's head count")
    return Assumption("attention head count", model, why, HEADS_SETTLE)


def owner_of(key: str, head_dims: dict[str, int]) -> tuple[str, int] | None:
    """The attention module a key is under, and its head size, if a module states one.

    Args:
        key: A tensor key.
        head_dims: Module path to head size.

    Returns:
        The module's path and head size, or ``None``.
    """
    module = key
    while module:
        module = module.rpartition(".")[0]
        if module in head_dims:
            return module, head_dims[module]
    return None


def head_size_mismatch(target: str, source: str, src: Side, dst: Side) -> str | None:
    """Why ``source`` cannot fill ``target``: their attention modules' head sizes differ.

    Args:
        target: The target key.
        source: The source key.
        src: The source side (its ``head_dims`` from the file).
        dst: The target side (its ``head_dims`` from the model).

    Returns:
        The reason, or ``None`` when they agree or either side does not say.
    """
    if not src.head_dims or not dst.head_dims:
        return None
    stated, expected = owner_of(source, src.head_dims), owner_of(target, dst.head_dims)
    if stated is None or expected is None or stated[1] == expected[1]:
        return None
    return (f"Cannot load '{target}': the checkpoint's attention '{stated[0]}' has heads of "
            f"size {stated[1]} (the file says so), the model's '{expected[0]}' {expected[1]}: "
            "another number of heads, which the same shapes hide. Build the model with the "
            "checkpoint's head count.")
