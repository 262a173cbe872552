"""The ``config.json`` beside a checkpoint: what its code base says of the model it saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import TorchgraftError
from ...io.contain import read_json

__all__ = ["MAX_CONFIG_BYTES", "read_config"]

#: config.json is read only up to this size (transformers' largest are tens of KiB).
MAX_CONFIG_BYTES = 4 << 20


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
