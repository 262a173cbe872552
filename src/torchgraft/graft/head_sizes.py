"""Attention head sizes as evidence: a file that states them against the model's own.

Readers of other frameworks' files put the head sizes the file states (GGUF metadata, Keras and
Flax ``[hidden, heads, head_dim]`` kernels) under ``__metadata__["head_dims"]``; a model's
attention modules say theirs (``head_dim``). Two attention layers with the same weight shapes
but other head counts compute something else, so such a pair is refused, never loaded as ok.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sides import Side

__all__ = ["HEAD_COUNT_ATTRIBUTES", "head_counts_of", "head_size_mismatch", "owner_of",
           "stated_head_dims"]

#: The attributes an attention module states its head counts in, by code base: (query heads,
#: key/value heads). A module without the second has as many key/value heads as query heads.
HEAD_COUNT_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("n_head", "n_local_heads"),  # gpt-fast
    ("n_heads", "n_kv_heads"),  # Meta's reference Llama
    ("num_heads", "num_key_value_heads"),  # transformers (4.x), nn.MultiheadAttention
    ("num_heads", "num_kv_heads"),  # torchtune
    ("num_attention_heads", "num_key_value_heads"),
)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def head_counts_of(module: object) -> tuple[int, int] | None:
    """An attention module's (query heads, key/value heads), from :data:`HEAD_COUNT_ATTRIBUTES`.

    Args:
        module: A module.

    Returns:
        The counts, or ``None`` when it states none.
    """
    found = [(_count(getattr(module, heads, None)), _count(getattr(module, kv_heads, None)))
             for heads, kv_heads in HEAD_COUNT_ATTRIBUTES]
    both = [(count, kv) for count, kv in found if count is not None and kv is not None]
    if both:
        return both[0]
    return next(((count, count) for count, _kv in found if count is not None), None)


def stated_head_dims(extras: dict[str, Any]) -> dict[str, int]:
    """The head sizes a file states: module path to ``head_dim``.

    Args:
        extras: A checkpoint's extras (plain data beside the weights).

    Returns:
        Module path to head size; empty when the file states none.
    """
    metadata = extras.get("__metadata__")
    stated = metadata.get("head_dims") if isinstance(metadata, dict) else None
    if not isinstance(stated, dict):
        return {}
    return {str(k): v for k, v in stated.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 0}


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
