"""The ``config.json`` beside a checkpoint: what its code base says of the model it saved."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import TorchgraftError, shown
from ...io.contain import read_json

__all__ = ["MAX_CONFIG_BYTES", "SIZES", "check_sizes", "extent", "read_config"]

#: config.json is read only up to this size (transformers' largest are tens of KiB).
MAX_CONFIG_BYTES = 4 << 20

#: Config entries that size the model built from it: its stacks (layers, experts), widths,
#: heads, channels and vocabulary, as transformers' configs (and others') name them. Each is
#: checked against the checkpoint before a model is built (:func:`check_sizes`).
SIZES = frozenset({
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers",
    "decoder_layers", "num_encoder_layers", "num_decoder_layers",
    "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
    "hidden_size", "d_model", "n_embd", "embed_dim", "intermediate_size", "d_ff", "ffn_dim",
    "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "moe_intermediate_size", "head_dim",
    "num_attention_heads", "num_key_value_heads", "n_head", "encoder_attention_heads",
    "decoder_attention_heads",
    "num_channels", "in_chans", "in_channels", "num_mel_bins", "vocab_size", "n_vocab",
})


def read_config(folder: Path) -> dict[str, Any] | None:
    """A folder's ``config.json``, read within bounds; ``None`` when it has none.

    Args:
        folder: The folder.

    Returns:
        The config's content, when it is a JSON object.

    Raises:
        TorchgraftError: If it is too large, not a regular file or not valid JSON.
    """
    path = folder / "config.json"
    if not path.is_file():
        return None
    data = read_json(path, limit=MAX_CONFIG_BYTES, what="config.json", error=TorchgraftError)
    return data if isinstance(data, dict) else None


def _scopes(config: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The config and its sub-configs (``text_config``...), each with its entries' prefix."""
    yield "", config
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield f"{key}.", value


def extent(shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, str]:
    """The largest size a checkpoint's tensors hold, and where it is.

    The largest of any tensor's dimensions and of the numbered parts of its keys, plus one
    (``layers.11``: twelve layers; stacked layers are a dimension).

    Args:
        shapes: Each key's shape.

    Returns:
        The size, and what holds it (for a message).
    """
    largest, where = 0, "no tensor"
    for key, shape in shapes.items():
        for dim in shape:
            if dim > largest:
                largest, where = dim, f"'{key}' of shape {tuple(shape)}"
        for part in key.split("."):
            if part.isdigit() and len(part) < 10 and int(part) + 1 > largest:
                largest, where = int(part) + 1, f"'{key}', part {part}"
    return largest, where


#: A size given per stage or block is a list of at most this many (a config's claim, bounded).
MAX_SIZES = 1024


def check_sizes(config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], *,
                path: Path) -> None:
    """Refuse a config that sizes its model past what the checkpoint holds, before it is built.

    Every entry of :data:`SIZES` (in the config and its sub-configs) must be a whole number no
    larger than the checkpoint's :func:`extent`: ``num_hidden_layers: 100000`` beside a
    two-layer checkpoint would build 100,000 layers to compare outputs with.

    Args:
        config: The config's content.
        shapes: The checkpoint's tensors' shapes, by key.
        path: The config file, named in the error.

    Raises:
        TorchgraftError: Naming the config, the entry, its value and the checkpoint's extent.
    """
    largest, where = extent(shapes)
    for prefix, scope in _scopes(config):
        for key in sorted(SIZES & scope.keys()):
            given = scope[key]
            values = given if isinstance(given, list) and len(given) <= MAX_SIZES else [given]
            for value in values:  # a size per stage (EfficientNet's in_channels) is a list
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise TorchgraftError(f"'{prefix}{key}' is {shown(given, 40)}, not a whole "
                                          "number (or a list of them)", path=path)
                if value > largest:
                    raise TorchgraftError(
                        f"'{prefix}{key}' is {shown(given, 40)}, more than the checkpoint beside "
                        f"it holds (its largest size is {largest}: {where}): refused before a "
                        "model is built from it", path=path)
