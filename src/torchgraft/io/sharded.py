"""Sharded checkpoints: an ``*.index.json`` weight map over safetensors or torch shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..meta import TensorRef
from .base import Contents, Format, ReadOptions
from .contain import contained

__all__ = ["FORMAT"]


#: An index larger than this is not a weight map (a 70B model's index is about 100 KiB).
MAX_INDEX_BYTES = 64 * 1024 * 1024


def _weight_map(path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    size = path.stat().st_size
    if size > MAX_INDEX_BYTES:
        raise CorruptCheckpointError(f"the index is {size} bytes, more than any weight map "
                                     f"needs ({MAX_INDEX_BYTES})", path=path)
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(f"the index is not valid JSON: {exc}", path=path) from None
    except RecursionError:
        raise CorruptCheckpointError("the index nests too deeply to be a weight map",
                                     path=path) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CorruptCheckpointError(
            "the index has no 'weight_map' object of tensor name to shard file", path=path)
    metadata = index.get("metadata") or {}
    return weight_map, metadata if isinstance(metadata, dict) else {"metadata": metadata}


def _open(path: Path, options: ReadOptions) -> Contents:
    from .registry import open_contents

    weight_map, metadata = _weight_map(path)
    shards: dict[str, Contents] = {}
    contents = Contents("sharded", path, {}, [])
    try:
        for shard_name in dict.fromkeys(weight_map.values()):
            shard_path = contained(path.parent, shard_name, named_by=path, what="shard",
                                   follow_links=options.follow_links)
            if not shard_path.is_file():
                raise CheckpointNotFoundError(
                    f"shard '{shard_name}' named by the index is missing", path=path)
            shard = open_contents(shard_path, options)
            contents.closers.append(shard.close)
            if not isinstance(shard.root, dict):
                raise CorruptCheckpointError("the shard does not hold a state dict",
                                             path=shard_path)
            shards[shard_name] = shard
        root: dict[str, Any] = {}
        for name, shard_name in weight_map.items():
            ref = shards[shard_name].root.get(name)
            if not isinstance(ref, TensorRef):
                raise CorruptCheckpointError(
                    f"the index puts '{name}' in '{shard_name}', which does not hold it",
                    path=path)
            root[name] = ref
    except BaseException:
        contents.close()
        raise
    if metadata:
        root["__metadata__"] = metadata
    contents.root = root
    return contents


FORMAT = Format(name="sharded", open=_open, suffixes=(".index.json",))
