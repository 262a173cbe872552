"""torch.save's zip format (PyTorch >= 1.6): ``data.pkl`` plus one stored entry per storage.

The pickle is read with the safe unpickler; each storage entry is memory-mapped in place (torch
writes entries uncompressed and 64-byte aligned), so opening reads only the zip directory and
``data.pkl``, and a tensor's bytes are touched when it is read.
"""

from __future__ import annotations

import io
import struct
import weakref
import zipfile
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import CorruptCheckpointError, UnknownFormatError, UnsupportedCheckpointError
from ..meta import TensorMeta, TensorRef
from ..safe_pickle import StorageType, safe_load
from .base import Contents, Format, ReadOptions
from .source import ByteSource, FileSource, MemorySource, strided

__all__ = ["FORMAT", "first_zip_entry", "read_archive", "read_blob", "zip_data_offset"]

_LOCAL_HEADER = struct.Struct("<4s22xHH")
_ZIP_MAGIC = b"PK\x03\x04"


def first_zip_entry(head: bytes) -> str | None:
    """Return the name of a zip file's first entry from its first bytes, or ``None``.

    Args:
        head: The file's first bytes.

    Returns:
        The entry name, or ``None`` if ``head`` does not start a zip file.
    """
    if len(head) < _LOCAL_HEADER.size or not head.startswith(_ZIP_MAGIC):
        return None
    _sig, name_len, _extra = _LOCAL_HEADER.unpack_from(head)
    return head[30:30 + name_len].decode("utf-8", "replace")


def _magic(head: bytes) -> bool:
    name = first_zip_entry(head)
    return name is not None and not name.endswith(".npy")


class _Storage:
    def __init__(self, key: str, dtype: torch.dtype, location: str, numel: int) -> None:
        self.key, self.dtype, self.location, self.numel = key, dtype, location, numel


class _ArchiveTensors:
    """Turns the storage records of ``data.pkl`` into lazy tensors over the archive entries."""

    def __init__(self, source: ByteSource, archive: zipfile.ZipFile, prefix: str) -> None:
        self.source = source
        self.archive = archive
        self.prefix = prefix
        self.entries = {i.filename: i for i in archive.infolist()}
        self._flat: weakref.WeakValueDictionary[tuple[str, torch.dtype], torch.Tensor] = (
            weakref.WeakValueDictionary())

    def persistent_load(self, pid: Any) -> _Storage:
        if not isinstance(pid, tuple) or len(pid) != 5 or _text(pid[0]) != "storage":
            raise CorruptCheckpointError(f"unknown storage record {pid!r:.80} in data.pkl")
        _tag, storage_type, key, location, numel = pid
        if not isinstance(storage_type, StorageType) or not isinstance(numel, int):
            raise CorruptCheckpointError(f"malformed storage record {pid!r:.80} in data.pkl")
        return _Storage(_text(key), storage_type.dtype, _text(location), numel)

    def tensor(self, storage: Any, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
               dtype: torch.dtype | None) -> TensorRef:
        if not isinstance(storage, _Storage):
            raise CorruptCheckpointError("a tensor record without a storage in data.pkl")
        view_dtype = dtype or storage.dtype

        def read() -> torch.Tensor:
            flat = self.flat(storage, view_dtype)
            return strided(flat, size, stride, offset, what=f"storage {storage.key}",
                           source=self.source.name)

        return TensorRef(TensorMeta.of(size, view_dtype, storage.location), read)

    def flat(self, storage: _Storage, dtype: torch.dtype) -> torch.Tensor:
        """Return a whole storage as a flat tensor of ``dtype``, shared between its views."""
        cache_key = (storage.key, dtype)
        cached = self._flat.get(cache_key)
        if cached is not None:
            return cached
        name = f"{self.prefix}data/{storage.key}"
        info = self.entries.get(name)
        if info is None:
            raise CorruptCheckpointError(
                f"storage '{storage.key}' named in data.pkl is missing from the archive",
                path=self.source.name)
        nbytes = storage.numel * storage.dtype.itemsize
        if info.file_size < nbytes:
            raise CorruptCheckpointError(
                f"storage '{storage.key}' should hold {nbytes} bytes, its entry has "
                f"{info.file_size}", path=self.source.name)
        if info.compress_type == zipfile.ZIP_STORED:
            flat = self.source.array(zip_data_offset(self.source, info), nbytes, dtype,
                                     what=f"storage '{storage.key}'")
        else:
            data = self.archive.read(name)[:nbytes]
            flat = MemorySource(data, self.source.name).array(0, nbytes, dtype)
        self._flat[cache_key] = flat
        return flat


def _text(value: Any) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def zip_data_offset(source: ByteSource, info: zipfile.ZipInfo) -> int:
    """Return where a zip entry's data begins, from its local header.

    Args:
        source: The zip file's bytes.
        info: The entry, from the central directory.

    Returns:
        The byte offset of the entry's data.

    Raises:
        CorruptCheckpointError: If the local header is damaged.
    """
    header = source.read(info.header_offset, _LOCAL_HEADER.size, what="a zip record header")
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(header)
    if signature != _ZIP_MAGIC:
        raise CorruptCheckpointError(f"zip record '{info.filename}' has a corrupt header",
                                     path=source.name)
    return int(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)


def read_archive(source: ByteSource, stream: IO[bytes], *, unsafe: bool) -> tuple[Any, Any]:
    """Read a torch.save zip archive.

    Args:
        source: The archive's bytes, for tensor data.
        stream: The same bytes as a seekable stream, for the zip directory.
        unsafe: Passed to the unpickler.

    Returns:
        The saved object with lazy tensors, and the open ``ZipFile`` (close it when done).

    Raises:
        UnknownFormatError: If the zip archive is not a torch.save file.
        UnsupportedCheckpointError: If the archive is big-endian.
        CorruptCheckpointError: If the archive is damaged.
    """
    archive = zipfile.ZipFile(stream)
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        archive.close()
        raise UnknownFormatError(
            "a zip archive without a single '<name>/data.pkl': not a torch.save file",
            path=source.name)
    prefix = pickles[0].removesuffix("data.pkl")
    if prefix + "byteorder" in archive.namelist() and \
            archive.read(prefix + "byteorder").strip() == b"big":
        archive.close()
        raise UnsupportedCheckpointError("big-endian torch checkpoints are not read yet",
                                         path=source.name)
    factory = _ArchiveTensors(source, archive, prefix)
    root = safe_load(archive.read(pickles[0]), path=source.name, unsafe=unsafe, factory=factory)
    return root, archive


def read_blob(data: bytes, *, name: str, unsafe: bool) -> Any:
    """Read a torch.save archive held in memory (a chunk inside a larger file).

    Args:
        data: The archive's bytes.
        name: What to call it in errors.
        unsafe: Passed to the unpickler.

    Returns:
        The saved object with lazy tensors.
    """
    root, archive = read_archive(MemorySource(data, name), io.BytesIO(data), unsafe=unsafe)
    archive.close()
    return root


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    stream = path.open("rb")
    try:
        root, archive = read_archive(source, stream, unsafe=options.unsafe)
    except BaseException:
        stream.close()
        raise
    return Contents("torch-zip", path, root, [archive.close, stream.close, source.close])


FORMAT = Format(
    name="torch-zip",
    open=_open,
    suffixes=(".pt", ".pth", ".bin", ".ckpt", ".tar", ".pth.tar"),
    magic=_magic,
)
