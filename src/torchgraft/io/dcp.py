"""torch.distributed.checkpoint (DCP) directories: a ``.metadata`` pickle and ``*.distcp`` files.

``.metadata`` (read with the safe unpickler) gives every tensor's global shape, dtype and
chunks, and where each chunk is stored: a byte range of a ``.distcp`` file holding a
``torch.save`` archive of that chunk. Opening reads only ``.metadata`` and the small non-tensor
entries; reading a tensor assembles it from its chunks, whichever rank wrote them.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import torch

from ..bounds import check_fits, check_length, check_shape
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError, shown
from ..meta import TensorMeta, TensorRef
from ..safe_pickle import PickledObject, safe_load
from ..tiling import MAX_CORNERS, tiles
from .base import Contents, Format, ReadOptions, WriteJob, closed_on_error
from .contain import contained
from .source import FileSource
from .torch_zip import read_archive, read_blob
from .window import Window, WindowStream

__all__ = ["FORMAT", "write"]

_METADATA = ".metadata"


def _claims(path: Path) -> bool:
    return (path / _METADATA).is_file()


def _field(attrs: dict[str, Any], name: str, kind: type, path: Path) -> Any:
    value = attrs.get(name)
    if not isinstance(value, kind):
        raise CorruptCheckpointError(f"a record's '{name}' is {shown(value, 60)}, not a "
                                     f"{kind.__name__}", path=path)
    return value


def _attrs(obj: Any, kind: str, path: Path) -> dict[str, Any]:
    if not isinstance(obj, PickledObject) or not obj.global_name.endswith(kind):
        raise CorruptCheckpointError(f"expected a {kind} record, found {shown(obj, 80)}", path=path)
    return obj.attributes()


class _Storage:
    """Where each item's bytes are: (fqn, chunk offset) to (file, offset, length)."""

    def __init__(self, directory: Path, metadata_path: Path, *, follow_links: bool) -> None:
        self.directory = directory
        self.metadata_path = metadata_path
        self.follow_links = follow_links
        self.sources: dict[str, FileSource] = {}
        self.items: dict[tuple[str, tuple[int, ...] | None], tuple[FileSource, int, int]] = {}

    def close(self) -> None:
        """Close every data file."""
        sources, self.sources = self.sources, {}
        for source in sources.values():
            source.close()

    def add(self, storage_data: Any) -> None:
        """Record where every item named by ``storage_data`` is (opening its data files)."""
        metadata_path = self.metadata_path
        if not isinstance(storage_data, dict):
            raise CorruptCheckpointError("storage_data is not a mapping", path=metadata_path)
        for index, info in storage_data.items():
            where = _attrs(index, "MetadataIndex", metadata_path)
            item = _attrs(info, "_StorageInfo", metadata_path)
            fqn = _field(where, "fqn", str, metadata_path)
            if item.get("transform_descriptors"):
                raise UnsupportedCheckpointError(
                    f"'{fqn}' is stored with transforms {shown(item['transform_descriptors'], 80)}",
                    path=metadata_path)
            offset = where.get("offset")
            key = (fqn, None if offset is None else check_shape(
                offset, what=f"a chunk offset of '{fqn}'", path=metadata_path))
            source = self._source(_field(item, "relative_path", str, metadata_path),
                                  metadata_path)
            start = check_length(item.get("offset"), available=source.size,
                                 what=f"the offset of '{fqn}'", path=metadata_path)
            length = check_length(item.get("length"), available=source.size - start,
                                  what=f"the length of '{fqn}'", path=metadata_path)
            self.items[key] = (source, start, length)

    def _source(self, relative: str, metadata_path: Path) -> FileSource:
        if relative not in self.sources:
            file = contained(self.directory, relative, named_by=metadata_path, what="data file",
                             follow_links=self.follow_links)
            if not file.is_file():
                raise CorruptCheckpointError(
                    f"data file '{relative}' named by .metadata is missing", path=metadata_path)
            self.sources[relative] = FileSource(file)
        return self.sources[relative]

    def window(self, fqn: str, offset: tuple[int, ...]) -> Window:
        """The byte range holding one chunk's archive, as a file of its own."""
        where = self.items.get((fqn, offset))
        if where is None:
            raise CorruptCheckpointError(f"no stored data for '{fqn}' at offset {offset}",
                                         path=self.directory / _METADATA)
        return Window(*where)

    def blob(self, fqn: str, offset: tuple[int, ...] | None) -> tuple[bytes, str]:
        """Return the stored bytes of one item, and a name for it in errors."""
        where = self.items.get((fqn, offset))
        if where is None:
            raise CorruptCheckpointError(f"no stored data for '{fqn}' at offset {offset}",
                                         path=self.directory / _METADATA)
        source, start, length = where
        return source.read(start, length, what=f"'{fqn}'"), f"{source.name}[{start}:+{length}]"


def _tensor(fqn: str, entry: dict[str, Any], storage: _Storage, unsafe: bool,
            metadata_path: Path) -> TensorRef:
    properties = entry.get("properties")
    if not isinstance(properties, PickledObject):
        raise CorruptCheckpointError(f"'{fqn}' has no tensor properties", path=metadata_path)
    state = properties.state
    dtype = state[0] if isinstance(state, tuple) and state else \
        properties.attributes().get("dtype")
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpointError(f"'{fqn}' has no dtype", path=metadata_path)
    size = check_shape(entry.get("size"), what=f"'{fqn}'", path=metadata_path)
    chunks = []
    listed = entry.get("chunks")
    if not isinstance(listed, list):
        raise CorruptCheckpointError(f"'{fqn}' has no list of chunks", path=metadata_path)
    for chunk in listed:
        c = _attrs(chunk, "ChunkStorageMetadata", metadata_path)
        offsets = check_shape(c.get("offsets"), what=f"a chunk of '{fqn}'", path=metadata_path)
        sizes = check_shape(c.get("sizes"), what=f"a chunk of '{fqn}'", path=metadata_path)
        chunks.append((offsets, sizes))
        stored = storage.items.get((fqn, offsets))
        if stored is None:
            raise CorruptCheckpointError(f"chunk {offsets} of '{fqn}' has no stored data",
                                         path=metadata_path)
        check_fits(sizes, dtype.itemsize, available=stored[2], what=f"chunk {offsets} of '{fqn}'",
                   path=metadata_path)
    _check_cover(fqn, size, chunks, metadata_path)

    def read_box(start: tuple[int, ...], out: torch.Tensor) -> None:
        # Only the chunks the block overlaps are read: a rank of another world size reads
        # the chunks its shard spans, whichever rank wrote them.
        for offsets, sizes in chunks:
            low = [max(a, b) for a, b in zip(offsets, start, strict=True)]
            high = [min(a + n, b + m) for a, n, b, m in zip(offsets, sizes, start, out.shape,
                                                             strict=True)]
            if any(h <= lo for lo, h in zip(low, high, strict=True)):
                continue
            window = storage.window(fqn, offsets)
            stream = io.BufferedReader(WindowStream(window), buffer_size=1 << 16)
            part, archive = read_archive(window, stream, unsafe=unsafe)
            archive.close()
            if not isinstance(part, TensorRef) or part.meta.shape != sizes:
                raise CorruptCheckpointError(f"chunk {offsets} of '{fqn}' is not a {sizes} tensor",
                                             path=window.name)
            target = out
            for dim, (lo, hi) in enumerate(zip(low, high, strict=True)):
                target = target.narrow(dim, lo - start[dim], hi - lo)
            # the overlap's bytes only, where the chunk's storage is stored plainly
            part.read_box(tuple(lo - o for lo, o in zip(low, offsets, strict=True)), target)

    def read() -> torch.Tensor:
        out = torch.empty(size, dtype=dtype)
        read_box((0,) * len(size), out)
        return out

    return TensorRef(TensorMeta.of(size, dtype), read, read_box=read_box)


def _check_cover(fqn: str, size: tuple[int, ...],
                 chunks: list[tuple[tuple[int, ...], tuple[int, ...]]], path: Path) -> None:
    """Chunks must lie inside their tensor and cover it exactly: no element left unwritten."""
    for offsets, sizes in chunks:
        if len(offsets) != len(size) or len(sizes) != len(size) or any(
                o < 0 or n < 0 or o + n > d for o, n, d in zip(offsets, sizes, size, strict=True)):
            raise CorruptCheckpointError(f"chunk {offsets} {sizes} of '{fqn}' lies outside its "
                                         f"{size} tensor", path=path)
    covered = sum(math.prod(sizes) for _, sizes in chunks)
    tiled = tiles(size, chunks) if covered == math.prod(size) else False
    if tiled is None:
        raise UnsupportedCheckpointError(
            f"'{fqn}' is stored as {len(chunks)} chunks splitting so many of its dimensions "
            f"that checking their cover would count more than {MAX_CORNERS} corners", path=path)
    if not tiled:
        raise CorruptCheckpointError(
            f"the chunks of '{fqn}' cover {covered} of its {math.prod(size)} elements"
            + (" and overlap" if covered == math.prod(size) else "")
            + ": the rest would be uninitialised memory", path=path)


def _nest(flat: dict[str, Any], planner_data: Any) -> dict[str, Any]:
    """Undo DCP's flattening of nested state dicts, using the saved key paths."""
    if not isinstance(planner_data, dict):
        return flat
    root: dict[str, Any] = {}
    for fqn, value in flat.items():
        path = planner_data.get(fqn)
        if not isinstance(path, tuple) or not path or not all(isinstance(p, str) for p in path):
            root[fqn] = value
            continue
        node = root
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                node = {}
                break
            node = child
        node[path[-1]] = value
    return root


def _open(path: Path, options: ReadOptions) -> Contents:
    metadata_path = contained(path, _METADATA, named_by=path, what="metadata file",
                              follow_links=options.follow_links)
    with FileSource(metadata_path) as source, source.stream() as f:
        metadata = _attrs(safe_load(f, path=str(metadata_path)), "Metadata", metadata_path)
    storage = _Storage(path, metadata_path, follow_links=options.follow_links)
    with closed_on_error(storage.close):
        storage.add(metadata.get("storage_data"))
        root = _root(metadata, storage, options, metadata_path)
    return Contents("dcp", path, root, [storage.close])


def _root(metadata: dict[str, Any], storage: _Storage, options: ReadOptions,
          metadata_path: Path) -> dict[str, Any]:
    entries = metadata.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise CorruptCheckpointError("state_dict_metadata is not a mapping", path=metadata_path)
    flat: dict[str, Any] = {}
    for fqn, item in entries.items():
        if isinstance(item, PickledObject) and item.global_name.endswith("BytesStorageMetadata"):
            data, name = storage.blob(fqn, None)
            flat[fqn] = read_blob(data, name=name, unsafe=options.unsafe)
        else:
            entry = _attrs(item, "TensorStorageMetadata", metadata_path)
            flat[fqn] = _tensor(fqn, entry, storage, options.unsafe, metadata_path)
    return _nest(flat, metadata.get("planner_data"))


def write(job: WriteJob, path: Path) -> None:
    """Write a torch.distributed.checkpoint directory from one process.

    With ``job.ranks`` above 1, the directory is laid out as that many ranks of an FSDP2
    model save it (:func:`_write_ranks`); else as one rank saves it.

    Args:
        job: What to write; extras are saved beside the weights, as DCP saves objects.
        path: The directory (it must not exist yet).
    """
    import warnings

    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    if job.ranks > 1:
        _write_ranks(job, path)
        return
    tensors = job.read_all()
    state: dict[str, Any] = {job.weights_key: tensors} if job.weights_key else dict(tensors)
    state.update(job.extras)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(state, storage_writer=FileSystemWriter(str(path)), no_dist=True)
    job.done(len(tensors))


class _Chunks:
    """The save planner's one duty towards the writer: each item's data, read when asked."""

    def __init__(self, job: WriteJob, flat: dict[str, Any]) -> None:
        self.job = job
        self.flat = flat

    def resolve_data(self, item: Any) -> Any:
        value = self.flat[item.index.fqn]
        if not isinstance(value, TensorRef):
            data = io.BytesIO()
            torch.save(value, data)
            data.seek(0)
            return data
        chunk = item.tensor_data.chunk
        out = torch.empty(tuple(chunk.sizes), dtype=value.meta.dtype)
        value.read_box(tuple(chunk.offsets), out)  # this rank's rows: their bytes only
        return out.to(self.job.out_dtype(value))


def _write_ranks(job: WriteJob, path: Path) -> None:
    """Write DCP as ``job.ranks`` ranks of FSDP2 save it: rows split as ``torch.chunk`` does.

    Each rank's file ``__{rank}_0.distcp`` holds that rank's rows of every tensor (scalars
    and extras in rank 0's), so a model sharded over that many ranks reads one file per rank;
    any other number of ranks reads the chunks its shards span. torch's own
    ``FileSystemWriter`` writes the files and the ``.metadata``.
    """
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    state: dict[str, Any] = {job.weights_key: dict(job.tensors)} if job.weights_key \
        else dict(job.tensors)
    state.update(job.extras)
    flat, mapping = flatten_state_dict(state)
    items: list[list[WriteItem]] = [[] for _ in range(job.ranks)]
    entries: dict[str, Any] = {}
    for fqn, value in flat.items():
        if not isinstance(value, TensorRef):
            entries[fqn] = BytesStorageMetadata()
            items[0].append(WriteItem(MetadataIndex(fqn), WriteItemType.BYTE_IO))
            continue
        shape = value.meta.shape
        properties = TensorProperties(dtype=job.out_dtype(value))
        rows = shape[0] if shape else 1
        step = -(-rows // job.ranks)  # torch.chunk: ceil(rows / ranks) each, the last short
        chunks = []
        for rank, first in enumerate(range(0, rows, max(step, 1)) or [0]):  # empty: rank 0
            offsets = torch.Size((first, *[0] * (len(shape) - 1)) if shape else ())
            sizes = torch.Size((min(step, rows - first), *shape[1:]) if shape else ())
            chunk = ChunkStorageMetadata(offsets=offsets, sizes=sizes)
            chunks.append(chunk)
            items[rank].append(WriteItem(MetadataIndex(fqn, offsets), WriteItemType.SHARD,
                                         tensor_data=TensorWriteData(chunk, properties,
                                                                     torch.Size(shape))))
        entries[fqn] = TensorStorageMetadata(properties, torch.Size(shape), chunks)
    writer = FileSystemWriter(str(path))
    writer.set_up_storage_writer(True)
    plans = writer.prepare_global_plan([writer.prepare_local_plan(SavePlan(i)) for i in items])
    planner = _Chunks(job, flat)
    results = [writer.write_data(plan, planner).wait() for plan in plans]  # type: ignore[arg-type]
    writer.finish(Metadata(entries, planner_data=mapping), results)
    job.done(len(job.tensors))


FORMAT = Format(name="dcp", open=_open, claims_directory=_claims, writes="dcp", write=write)
