"""Orbax checkpoint folders (orbax-checkpoint, JAX's checkpointer), read with tensorstore.

Orbax's PyTree and Standard checkpointers write a folder: ``_METADATA`` (JSON: each leaf's
key path and value type), ``_CHECKPOINT_METADATA``, and the arrays as zarr arrays named by
their joined key path (``params.Dense_0.kernel``). By default they lie in an OCDBT key-value
store (``manifest.ocdbt``, data files under ``d/``), in zarr v2 or, with ``use_zarr3``, v3
chunks; with ``use_ocdbt=False`` each array is a zarr v2 folder of its own. A
``CheckpointManager`` step folder (``7/``) holds one such folder per item (``7/state/``).

Only ``tensorstore`` (the optional extra ``[orbax]``) reads these; never JAX or Orbax. The
metadata is checked first: its size, its nesting and shape (a mapping of leaves, each a short
key path), every array's shape and dtype against the bytes the folder holds, and every file in
the folder must lie inside it and be a regular file (a FIFO or device, which tensorstore would
open and wait on, is refused before it is given the folder). Arrays are opened lazily: a
tensor's chunks are read when it is read, a block of it when only that block is wanted.

The arrays are a Flax model's: names and layouts become PyTorch's as for Flax ``msgpack``
files (:func:`~torchgraft.io.flax_format.flax_tree`), Flax NNX's ``value`` leaves included.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..bounds import parse_json
from ..errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
    brief,
)
from ..meta import TensorMeta, TensorRef
from .base import Contents, Format, ReadOptions
from .contain import check_regular, contained, open_regular, read_contained
from .flax_format import flax_key, flax_tree
from .framework import import_optional

__all__ = ["FORMAT"]

_METADATA = "_METADATA"
_CHECKPOINT = "_CHECKPOINT_METADATA"
_MANIFEST = "manifest.ocdbt"
_OCDBT_MAGIC = bytes.fromhex("0cdb3a2a")
_MAX_METADATA = 64 << 20
_MAX_LEAVES = 1_000_000
_MAX_KEYS = 64
_MAX_NDIM = 32
#: Files a checkpoint folder may hold, and how deep they may lie.
_MAX_FILES = 1_000_000
_MAX_DEPTH = 8
#: Entries looked at when telling whether a folder is a checkpoint manager's.
_MAX_SNIFF = 1_000
#: How much larger than the bytes a folder holds its arrays may be (zstd's best ratio).
_MAX_RATIO = 1 << 15
#: Value types Orbax stores as arrays.
_ARRAYS = ("jax.Array", "np.ndarray", "scalar")
#: tensorstore's dtype names: torch's dtype, and the numpy dtype to view the data as first
#: (``None``: numpy's own matches torch's).
_DTYPES: dict[str, tuple[torch.dtype, Any]] = {
    "bool": (torch.bool, None), "uint8": (torch.uint8, None), "int8": (torch.int8, None),
    "uint16": (torch.uint16, None), "int16": (torch.int16, None),
    "uint32": (torch.uint32, None), "int32": (torch.int32, None),
    "uint64": (torch.uint64, None), "int64": (torch.int64, None),
    "float16": (torch.float16, None), "float32": (torch.float32, None),
    "float64": (torch.float64, None), "complex64": (torch.complex64, None),
    "complex128": (torch.complex128, None), "bfloat16": (torch.bfloat16, np.uint16),
    "float8_e4m3fn": (torch.float8_e4m3fn, np.uint8), "float8_e5m2": (torch.float8_e5m2, np.uint8),
}


def _tensorstore() -> Any:
    return import_optional("tensorstore", extra="orbax", feature="Reading Orbax checkpoints")


def _head(path: Path, size: int) -> bytes:
    if not path.is_file():
        return b""
    with open(open_regular(path), "rb") as f:
        return f.read(size)


def _is_item(folder: Path) -> bool:
    return b'"tree_metadata"' in _head(folder / _METADATA, 64)


def _claims(folder: Path) -> bool:
    """An Orbax item folder, step folder (``_CHECKPOINT_METADATA``) or manager's folder."""
    try:
        if _is_item(folder) or (folder / _CHECKPOINT).is_file():
            return True
        for count, entry in enumerate(folder.iterdir()):
            if count >= _MAX_SNIFF:
                return False
            if entry.name.isdigit() and (entry / _CHECKPOINT).is_file():
                return True
    except OSError:
        return False
    return False


def _item(folder: Path, options: ReadOptions) -> Path:
    """The item folder to read: ``folder`` itself, or a step folder's only item."""
    if _is_item(folder):
        return folder
    entries = sorted(p for p in folder.iterdir() if p.is_dir())[:_MAX_SNIFF]
    items = [p for p in entries if _is_item(p)]
    if len(items) == 1:
        return contained(folder, items[0].name, named_by=folder, what="Orbax item",
                         follow_links=options.follow_links)
    if items:
        names = ", ".join(p.name for p in items)
        raise CheckpointNotFoundError(f"the Orbax step folder holds several items ({names}): "
                                      f"pass the one to open, e.g. {items[0]}", path=folder)
    steps = sorted((p.name for p in entries if p.name.isdigit() and (p / _CHECKPOINT).is_file()),
                   key=int)
    if steps:
        raise CheckpointNotFoundError(
            f"an Orbax checkpoint manager's folder, with steps {', '.join(steps)}: pass the step "
            f"to open, e.g. {folder / steps[-1]}", path=folder)
    raise CheckpointNotFoundError("an Orbax folder without _METADATA (no pytree item was "
                                  "saved here, or the save did not finish)", path=folder)


def _stored_bytes(item: Path, options: ReadOptions) -> int:
    """The bytes the item's files hold, every file checked to lie inside the folder."""
    total, files = 0, 0
    for top, dirs, names in os.walk(item):
        depth = len(Path(top).relative_to(item).parts)
        if depth >= _MAX_DEPTH:
            raise CorruptCheckpointError(f"the folder nests deeper than {_MAX_DEPTH} levels",
                                         path=item)
        for name in [*names, *dirs]:
            files += 1
            if files > _MAX_FILES:
                raise CorruptCheckpointError(f"the folder holds more than {_MAX_FILES} files",
                                             path=item)
            part = Path(top, name)
            if part.is_symlink():  # what os.walk lists lies inside, unless it links out
                contained(item, str(part.relative_to(item)), named_by=item, what="file",
                          follow_links=options.follow_links)
            check_regular(part, what="file", folder_ok=True)
            if name in names:
                total += part.stat().st_size
    return total


def _leaves(item: Path, options: ReadOptions) -> tuple[dict[tuple[str, ...], str],
                                                     dict[str, Any]]:
    """Each array leaf's key path and its stored name, from ``_METADATA``; and the flags."""
    document = parse_json(read_contained(item, _METADATA, named_by=item, what=_METADATA,
                                         limit=_MAX_METADATA,
                                         follow_links=options.follow_links),
                          what=_METADATA, path=item / _METADATA)
    tree = document.get("tree_metadata") if isinstance(document, dict) else None
    if not isinstance(tree, dict) or len(tree) > _MAX_LEAVES:
        raise CorruptCheckpointError("_METADATA has no tree_metadata mapping of leaves",
                                     path=item)
    leaves: dict[tuple[str, ...], str] = {}
    for where, leaf in tree.items():
        keys = leaf.get("key_metadata") if isinstance(leaf, dict) else None
        value = leaf.get("value_metadata") if isinstance(leaf, dict) else None
        if (not isinstance(keys, list) or not 0 < len(keys) <= _MAX_KEYS
                or not isinstance(value, dict)
                or not all(isinstance(k, dict) and isinstance(k.get("key"), (str, int))
                           for k in keys)):
            raise CorruptCheckpointError(f"_METADATA's leaf {where!r} lacks its key path or "
                                         "value type", path=item)
        if value.get("value_type") in _ARRAYS and value.get("skip_deserialize") is not True:
            key = tuple(str(k["key"]) for k in keys)
            leaves[key] = ".".join(key)
    flags = {name: document.get(name) is True for name in ("use_ocdbt", "use_zarr3")}
    if "use_ocdbt" not in document:  # written before Orbax recorded it
        flags["use_ocdbt"] = (item / _MANIFEST).is_file()
    return leaves, flags


def _stores(item: Path, flags: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The key-value store of the item's arrays (tensorstore spec), and the zarr driver."""
    files = {"driver": "file", "path": f"{item.resolve()}/"}
    store = {"driver": "ocdbt", "base": files} if flags["use_ocdbt"] else files
    return store, "zarr3" if flags["use_zarr3"] else "zarr"


def _check_manifest(item: Path, options: ReadOptions) -> None:
    """An OCDBT manifest's magic number, and the length its header states against the file's."""
    manifest = contained(item, _MANIFEST, named_by=item, what="OCDBT manifest",
                         follow_links=options.follow_links)
    head = _head(manifest, 12)
    size = manifest.stat().st_size if manifest.is_file() else 0
    if len(head) < 12 or not head.startswith(_OCDBT_MAGIC):
        raise CorruptCheckpointError(f"{_MANIFEST} is missing or is not an OCDBT manifest",
                                     path=item)
    stated = int.from_bytes(head[4:12], "little")
    if stated != size:
        raise CorruptCheckpointError(f"{_MANIFEST} states {stated} bytes but holds {size} "
                                     "(truncated or overwritten)", path=item)


def _check_listed(ts: Any, kvstore: dict[str, Any], context: Any, leaves: dict[Any, str],
                  item: Path) -> None:
    """Every array ``_METADATA`` names has its zarr metadata in the store (one listing)."""
    try:
        keys = set(ts.KvStore.open(kvstore, context=context).result().list().result())
    except ValueError as exc:
        raise CorruptCheckpointError(f"its array store cannot be read: {brief(exc)}",
                                     path=item) from None
    for name in leaves.values():
        if not {f"{name}/.zarray".encode(), f"{name}/zarr.json".encode()} & keys:
            raise CorruptCheckpointError(f"array '{name}', which _METADATA lists, is not in "
                                         "the checkpoint (a save that did not finish?)",
                                         path=item)


def _as_torch(array: Any, dtype: torch.dtype, view: Any) -> torch.Tensor:
    data = np.ascontiguousarray(array)
    tensor = torch.from_numpy(data.view(view) if view is not None else data)
    return tensor.view(dtype) if view is not None else tensor


def _array_ref(store: Any, name: str, item: Path, held: set[tuple[int, str]]) -> TensorRef:
    dtype_name = store.dtype.name
    if dtype_name not in _DTYPES:
        raise UnsupportedCheckpointError(f"'{name}' has dtype {dtype_name}, which torch lacks",
                                         path=item)
    dtype, view = _DTYPES[dtype_name]
    shape = tuple(int(d) for d in store.shape)
    if len(shape) > _MAX_NDIM:
        raise CorruptCheckpointError(f"'{name}' has {len(shape)} dimensions", path=item)
    meta = TensorMeta.of(shape, dtype)

    def fetch(region: Any, what: str) -> torch.Tensor:
        try:
            return _as_torch(region.read().result(), dtype, view)
        except ValueError as exc:
            failed = brief(exc)
        _released(item, held)  # the failed read's files, closed on tensorstore's threads
        raise CorruptCheckpointError(f"{what} cannot be read: {failed}", path=item)

    def read() -> torch.Tensor:
        return fetch(store, f"'{name}'")

    def read_box(start: tuple[int, ...], out: torch.Tensor) -> None:
        box = tuple(slice(s, s + n) for s, n in zip(start, out.shape, strict=True))
        out.copy_(fetch(store[box], f"a block of '{name}'"))

    return TensorRef(meta, read, read_box=read_box)


def _descriptors(folder: Path) -> set[tuple[int, str]]:
    """This process's open descriptors of files under ``folder``, with their targets.

    From Linux's ``/proc/self/fd``; empty where the system has none.
    """
    prefix = f"{folder.resolve()}{os.sep}"
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return set()
    found = set()
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile, or the listing's own
            continue
        if target.startswith(prefix):
            found.add((int(name), target))
    return found


#: How long to wait for tensorstore's threads to close the files of a finished read.
_CLOSING_SECONDS = 1.0


def _released(folder: Path, held: set[tuple[int, str]]) -> None:
    """Wait until no descriptor of ``folder``'s files is open but those ``held`` before.

    tensorstore reads on threads of its own and closes a file there just after it delivers
    (or fails) the read: a caller that counts its descriptors right after an error, or after
    closing the checkpoint, would see one still open for a moment. Bounded by
    :data:`_CLOSING_SECONDS`.
    """
    deadline = time.monotonic() + _CLOSING_SECONDS
    while _descriptors(folder) - held and time.monotonic() < deadline:
        time.sleep(0.001)


def _open(folder: Path, options: ReadOptions) -> Contents:
    ts = _tensorstore()
    item = _item(folder, options)
    leaves, flags = _leaves(item, options)
    stored_bytes = _stored_bytes(item, options)
    held = _descriptors(item)
    try:
        root, closers = _arrays(ts, item, leaves, flags, stored_bytes, options, held)
    except BaseException as exc:
        # What tensorstore opened is held by the frames the error passed through: let go of
        # it, then wait for its threads to close the files.
        traceback.clear_frames(exc.__traceback__)
        _released(item, held)
        raise
    return Contents("orbax", item, root, [*closers, lambda: _released(item, held)])


def _arrays(ts: Any, item: Path, leaves: dict[tuple[str, ...], str], flags: dict[str, Any],
            stored_bytes: int, options: ReadOptions, held: set[tuple[int, str]],
            ) -> tuple[dict[str, Any], list[Any]]:
    """The item's arrays opened with tensorstore, as the Flax tree of lazy tensors."""
    context = ts.Context({"cache_pool": {"total_bytes_limit": 0},
                          "data_copy_concurrency": {"limit": 2},
                          "file_io_concurrency": {"limit": 2}})
    if flags["use_ocdbt"]:
        _check_manifest(item, options)
    kvstore, driver = _stores(item, flags)
    _check_listed(ts, kvstore, context, leaves, item)
    opening = {key: ts.open({"driver": driver, "kvstore": kvstore, "path": name, "open": True},
                            context=context)
               for key, name in leaves.items()}
    stores: dict[tuple[str, ...], Any] = {}
    for key, future in opening.items():
        try:
            stores[key] = future.result()
        except ValueError as exc:
            raise CorruptCheckpointError(f"array '{leaves[key]}' cannot be opened: {brief(exc)}",
                                         path=item) from None
    refs = {key: _array_ref(store, leaves[key], item, held) for key, store in stores.items()}
    claimed = sum(ref.meta.nbytes for ref in refs.values())
    if claimed > stored_bytes * _MAX_RATIO:
        raise CorruptCheckpointError(
            f"its arrays claim {claimed} bytes, more than the {stored_bytes} bytes in the "
            "folder can hold", path=item)
    by_flax: dict[tuple[str, ...], TensorRef] = {}
    store_of: dict[tuple[str, ...], Any] = {}
    for key, ref in refs.items():
        trimmed = flax_key(key)
        if trimmed in by_flax:
            raise CorruptCheckpointError(f"'{leaves[key]}' collides with another collection's "
                                         "leaf", path=item)
        by_flax[trimmed], store_of[trimmed] = ref, stores[key]

    def layer(key: tuple[str, ...], index: int) -> TensorRef:
        return _array_ref(store_of[key][index], f"{'.'.join(key)}[{index}]", item, held)

    root = flax_tree(by_flax, layer, item, framework="orbax")
    root["__metadata__"]["storage"] = (("OCDBT, " if flags["use_ocdbt"] else "")
                                       + ("zarr v3" if flags["use_zarr3"] else "zarr v2"))
    return root, [stores.clear, refs.clear]


FORMAT = Format(name="orbax", open=_open, claims_directory=_claims)
