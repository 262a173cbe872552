"""Sharded checkpoints: an ``*.index.json`` weight map over safetensors or torch shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bounds import MAX_INDEX_BYTES
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..meta import TensorRef
from .base import Contents, Format, ReadOptions
from .contain import contained, read_json

__all__ = ["FORMAT"]


def _weight_map(path: Path, *, follow_links: bool) -> tuple[dict[str, str], dict[str, Any]]:
    index = read_json(path, limit=MAX_INDEX_BYTES, what="the index", follow_links=follow_links)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CorruptCheckpointError(
            "the index has no 'weight_map' object of tensor name to shard file", path=path)
    metadata = index.get("metadata") or {}
    return weight_map, metadata if isinstance(metadata, dict) else {"metadata": metadata}


def _open(path: Path, options: ReadOptions) -> Contents:
    from .registry import open_contents

    weight_map, metadata = _weight_map(path, follow_links=options.follow_links)
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
