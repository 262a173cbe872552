"""safetensors: an 8-byte header length, a JSON header, then the tensors' bytes.

The header is parsed and checked here (every tensor's offsets against its shape and dtype, and
against the file size), so a header that lies raises an error naming the tensor; data is
memory-mapped.
"""

from __future__ import annotations

import json
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ..bounds import parse_json
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..meta import TensorMeta
from .base import Contents, Format, ReadOptions, WriteJob, closed_on_error, unwritable
from .copy import FileCopier
from .source import ByteSource, FileSource, FileTensor

__all__ = ["ALIASES_KEY", "DTYPES", "EXTRAS_KEY", "FORMAT", "WEIGHTS_KEY", "read_header",
           "write"]

#: Metadata keys torchgraft writes: tied names written once ({alias: written name}), the
#: checkpoint's extras (JSON), and the key the weights were under in a training checkpoint.
ALIASES_KEY = "torchgraft.aliases"
EXTRAS_KEY = "torchgraft.extras"
WEIGHTS_KEY = "torchgraft.weights_key"

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_MAX_HEADER = 100 * 1024 * 1024
#: A shape's dimensions are all of these types (``bool`` is not an ``int`` here).
_INTS = frozenset({int})


def _magic(head: bytes) -> bool:
    if len(head) < 10:
        return False
    (length,) = struct.unpack_from("<Q", head)
    return 2 <= length <= _MAX_HEADER and head[8:9] == b"{"


def read_header(source: ByteSource) -> tuple[dict[str, Any], dict[str, str], int]:
    """Read and check a safetensors header.

    Args:
        source: The file.

    Returns:
        The tensor entries (name to header entry, in data order), the ``__metadata__``
        strings, and the offset where the data begins.

    Raises:
        CorruptCheckpointError: If the header is malformed or disagrees with the file.
    """
    (length,) = struct.unpack("<Q", source.read(0, 8, what="the header length"))
    if length > _MAX_HEADER:
        raise CorruptCheckpointError(f"header length {length} is implausible", path=source.name)
    raw = source.read(8, length, what="the JSON header")
    header = parse_json(raw, what="the JSON header", path=source.name)
    if not isinstance(header, dict):
        raise CorruptCheckpointError("the header is not a JSON object", path=source.name)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CorruptCheckpointError("__metadata__ is not an object", path=source.name)
    start = 8 + length
    entries = {name: _checked(name, entry, source, start) for name, entry in header.items()}
    ordered = dict(sorted(entries.items(), key=lambda item: item[1]["data_offsets"][0]))
    previous_end, previous = 0, None
    for name, entry in ordered.items():
        begin, end = entry["data_offsets"]
        if begin < previous_end:
            raise CorruptCheckpointError(
                f"tensors '{previous}' and '{name}' overlap in the data", path=source.name)
        if end > begin:
            previous_end, previous = end, name
    return ordered, {str(k): str(v) for k, v in metadata.items()}, start


def _bad(name: str, why: str, source: ByteSource) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"header entry for '{name}' {why}", path=source.name)


def _checked(name: str, entry: Any, source: ByteSource, start: int) -> dict[str, Any]:
    """A header entry, checked: its dtype, shape and offsets agree, inside the file."""
    if type(entry) is not dict:
        raise _bad(name, "is not an object", source)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:  # a list would not even hash
        if isinstance(dtype, str) and dtype.isupper():
            raise UnsupportedCheckpointError(f"tensor '{name}' has dtype {dtype}, not read yet",
                                             path=source.name)
        raise _bad(name, f"has unknown dtype {dtype!r}", source)
    if type(shape) is not list or not {*map(type, shape)} <= _INTS or min(shape, default=0) < 0:
        raise _bad(name, f"has a malformed shape {shape!r}", source)
    if (type(offsets) is not list or len(offsets) != 2 or type(offsets[0]) is not int
            or type(offsets[1]) is not int or not 0 <= offsets[0] <= offsets[1]):
        raise _bad(name, f"has malformed data_offsets {offsets!r}", source)
    nbytes = math.prod(shape) * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise _bad(name, f"says {dtype} {tuple(shape)} ({nbytes} bytes) but its data_offsets "
                   f"span {offsets[1] - offsets[0]} bytes", source)
    if start + offsets[1] > source.size:
        source.check_range(start + offsets[0], nbytes, what=f"tensor '{name}'")
    return entry


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    with closed_on_error(source.close):
        root = _root(source, path)
    return Contents("safetensors", path, root, [source.close])


def _root(source: FileSource, path: Path) -> dict[str, Any]:
    entries, metadata, start = read_header(source)
    root: dict[str, Any] = {}
    for name, entry in entries.items():
        begin, end = entry["data_offsets"]  # checked: whole numbers of elements
        meta = TensorMeta(tuple(entry["shape"]), DTYPES[entry["dtype"]], end - begin)
        root[name] = FileTensor(source, start + begin, meta, what=f"tensor '{name}'")
    aliases = _json_entry(metadata, ALIASES_KEY, path)
    for alias, written in aliases.items():
        if written not in root:
            raise CorruptCheckpointError(f"alias '{alias}' names '{written}', which is not "
                                         "in the file", path=path)
        root[alias] = root[written]
    extras = _json_entry(metadata, EXTRAS_KEY, path)
    weights_key = metadata.pop(WEIGHTS_KEY, "")
    if metadata.get("format") == "pt":
        del metadata["format"]  # a file marker (written back by every writer), not user data
    if weights_key:
        root = {weights_key: root}
    root.update(extras)
    if metadata:
        root["__metadata__"] = metadata
    return root


def _json_entry(metadata: dict[str, str], key: str, path: Path) -> dict[str, Any]:
    if key not in metadata:
        return {}
    value = parse_json(metadata.pop(key), what=f"metadata '{key}'", path=path)
    if not isinstance(value, dict):
        raise CorruptCheckpointError(f"metadata '{key}' is not a JSON object", path=path)
    return value


_NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: Where the data section of a written file starts: a multiple of this (a page).
_DATA_ALIGNMENT = 4096


def write(job: WriteJob, path: Path) -> None:
    """Write a safetensors file, one tensor in memory at a time.

    Tied tensors (the same data under several names) are written once; the other names are
    recorded in the metadata and restored by the reader. Extras are kept as JSON in the
    metadata.

    Args:
        job: What to write.
        path: Where.

    Raises:
        UnsupportedCheckpointError: For a dtype safetensors has no name for.
    """
    written: dict[Any, str] = {}
    aliases: dict[str, str] = {}
    header: dict[str, Any] = {}
    offset = 0
    for name, ref in job.tensors.items():
        if ref.alias_key in written:
            aliases[name] = written[ref.alias_key]
            continue
        written[ref.alias_key] = name
        dtype = job.out_dtype(ref)
        if dtype not in _NAMES:
            raise UnsupportedCheckpointError(unwritable(name, dtype, "safetensors"), path=path)
        nbytes = math.prod(ref.meta.shape) * dtype.itemsize
        header[name] = {"dtype": _NAMES[dtype], "shape": list(ref.meta.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    metadata = {"format": "pt", **job.metadata}  # transformers and huggingface_hub require it
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(aliases)
    if job.extras:
        metadata[EXTRAS_KEY] = json.dumps(job.extras)
        if job.weights_key:
            metadata[WEIGHTS_KEY] = job.weights_key
    header = {"__metadata__": metadata, **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    # Spaces end the header so that the data starts on a page boundary (safetensors pads to 8
    # the same way): tensors copied in the kernel then land page-aligned, which copies
    # nearly twice as fast as a misaligned copy.
    text += b" " * (-(8 + len(text)) % _DATA_ALIGNMENT)
    start = 8 + len(text)
    with path.open("wb", buffering=0) as f, FileCopier(f.fileno()) as copier:
        copier.write(struct.pack("<Q", len(text)) + text)
        spans: list[tuple[str, str, int, int]] = []  # name, source, offset there, offset here
        for count, name in enumerate(job.tensors, start=1):
            if name in header:
                ref = job.tensors[name]
                at = start + header[name]["data_offsets"][0]
                if ref.span is not None and job.out_dtype(ref) == ref.meta.dtype and \
                        copier.supported:
                    spans.append((name, *ref.span(), at))
                    continue
                copier.write(job.read(name).reshape(-1).view(torch.uint8).numpy().data, at=at)
            job.done(count - len(spans))
        for name in _copy_spans(copier, spans, job):  # the system could not copy these
            at = start + header[name]["data_offsets"][0]
            copier.write(job.read(name).reshape(-1).view(torch.uint8).numpy().data, at=at)
        job.done(len(job.tensors))


#: Threads copying tensors file to file at once.
_COPIERS = min(2, os.cpu_count() or 1)


def _copy_spans(copier: FileCopier, spans: list[tuple[str, str, int, int]],
                job: WriteJob) -> list[str]:
    """Copy stored tensors file to file in the kernel, in a few threads.

    Each thread copies its share of the tensors to their own offsets of the destination.

    Returns:
        The tensors the system could not copy (another filesystem, an old kernel).
    """
    for _name, source, _offset, _at in spans:
        copier.open(source)
    share = -(-len(spans) // _COPIERS) if spans else 1
    batches = [spans[k:k + share] for k in range(0, len(spans), share)]

    def run(batch: list[tuple[str, str, int, int]]) -> list[str]:
        return [name for name, source, offset, at in batch if not copier.copy(
            source, offset, job.tensors[name].meta.nbytes, what=f"'{name}'", at=at)]

    with ThreadPoolExecutor(max(1, len(batches))) as pool:
        return [name for failed in pool.map(run, batches) for name in failed]


FORMAT = Format(name="safetensors", open=_open, suffixes=(".safetensors",), magic=_magic,
                writes="safetensors", write=write)
