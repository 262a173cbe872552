"""Folders of several models: a diffusers pipeline and a sentence-transformers model.

A diffusers pipeline folder lists its parts in ``model_index.json`` (``"unet": ["diffusers",
"UNet2DConditionModel"]``), each in a subfolder of that name; a sentence-transformers folder
lists its modules in ``modules.json`` (``{"name": "2", "path": "2_Dense", ...}``), the first
one's weights in the folder itself. Opened as one checkpoint, every part's weights are
prefixed with the part's name (``unet.``, ``vae.``, ``2_Dense.``; a module kept in the folder
itself by its ``name``, ``0.``), so a model with a module per part grafts from the whole folder;
``component="unet"`` opens one part alone, its keys as they are. Parts without weights
(tokenizers, schedulers, pooling) are listed in the extras. Each part is opened lazily by its
own format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bounds import MAX_INDEX_BYTES, parse_json
from ..containers import select_weights
from ..errors import (
    CorruptCheckpointError,
    OutsideCheckpointError,
    TensorNotFoundError,
    TorchgraftError,
)
from .base import Contents, Format, ReadOptions
from .contain import contained, read_contained
from .registry import checkpoint_in, open_contents

__all__ = ["FORMAT", "MAX_COMPONENTS"]

#: More parts than this is not a pipeline.
MAX_COMPONENTS = 64
_INDEXES = {"model_index.json": "diffusers", "modules.json": "sentence-transformers"}


def _claims(path: Path) -> bool:
    return any((path / name).is_file() for name in _INDEXES)


def _index(path: Path, options: ReadOptions) -> tuple[str, Any]:
    for name, kind in _INDEXES.items():
        if (path / name).is_file():
            data = read_contained(path, name, named_by=path, what=name, limit=MAX_INDEX_BYTES,
                                  follow_links=options.follow_links)
            return kind, parse_json(data, what=name, path=path / name)
    raise CorruptCheckpointError("no model_index.json or modules.json", path=path)


def _parts(kind: str, index: Any, path: Path) -> dict[str, str]:
    """Part name to its folder, relative to ``path`` (``""``: the folder itself)."""
    parts: dict[str, str] = {}
    if kind == "diffusers" and isinstance(index, dict):
        for name, spec in index.items():
            if not str(name).startswith("_") and isinstance(spec, list) and spec and spec[0]:
                parts[str(name)] = str(name)
    elif kind == "sentence-transformers" and isinstance(index, list):
        for module in index:
            if not isinstance(module, dict) or not isinstance(module.get("path", ""), str):
                raise CorruptCheckpointError("modules.json lists a module without a path",
                                             path=path)
            folder = module.get("path", "")
            parts[folder or str(module.get("name", len(parts)))] = folder
    else:
        raise CorruptCheckpointError(f"the {kind} index is malformed", path=path)
    if len(parts) > MAX_COMPONENTS:
        raise CorruptCheckpointError(f"the index lists {len(parts)} parts, more than any "
                                     f"pipeline ({MAX_COMPONENTS})", path=path)
    for name, folder in parts.items():
        if folder and ("/" in folder or "\\" in folder):
            raise CorruptCheckpointError(f"part '{name}' is not a folder inside the pipeline "
                                         f"('{folder}')", path=path)
    return parts


def _open_part(path: Path, folder: str, options: ReadOptions) -> Contents | None:
    where = contained(path, folder, named_by=path, what="part folder",
                      follow_links=options.follow_links) if folder else path
    if not where.is_dir():
        return None
    if not folder:  # the folder itself: its own checkpoint file, not the folder again
        try:
            target = checkpoint_in(where, follow_links=options.follow_links)
        except OutsideCheckpointError:
            raise
        except TorchgraftError:
            return None
        return open_contents(target, options.part())
    if _claims(where):
        raise CorruptCheckpointError("a pipeline inside a pipeline is not read", path=where)
    try:
        checkpoint_in(where, follow_links=options.follow_links)
    except OutsideCheckpointError:
        raise
    except TorchgraftError:
        return None  # a tokenizer, a scheduler, a pooling layer: configuration only
    return open_contents(where, options.part())


def _open(path: Path, options: ReadOptions) -> Contents:
    kind, index = _index(path, options)
    parts = _parts(kind, index, path)
    if options.component is not None:
        if options.component not in parts:
            raise TensorNotFoundError(f"no part '{options.component}' in this {kind} folder; "
                                      f"its parts: {', '.join(parts)}", path=path)
        opened = _open_part(path, parts[options.component], options)
        if opened is None:
            raise TensorNotFoundError(f"part '{options.component}' holds no weights",
                                      path=path)
        return opened
    root: dict[str, Any] = {}
    listing: dict[str, Any] = {}
    closers = []
    try:
        for name, folder in parts.items():
            opened = _open_part(path, folder, options)
            if opened is None:
                listing[name] = "no weights"
                continue
            closers.append(opened.close)
            weights = select_weights(opened.root).weights
            listing[name] = {"format": opened.format, "path": str(opened.path.relative_to(path)),
                             "tensors": len(weights)}
            root.update((f"{name}.{key}", ref) for key, ref in weights.items())
    except BaseException:
        for close in closers:
            close()
        raise
    if not root:
        raise TensorNotFoundError(f"no part of this {kind} folder holds weights", path=path)
    extras = {"components": listing, "index": index}
    return Contents(kind, path, {"state_dict": root, kind: extras}, closers)


FORMAT = Format(name="components", open=_open, claims_directory=_claims)
