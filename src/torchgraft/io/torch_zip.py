"""torch.save's zip format (PyTorch >= 1.6): ``data.pkl`` plus one stored entry per storage.

The pickle is read with the safe unpickler; each storage entry is memory-mapped in place (torch
writes entries uncompressed and 64-byte aligned), so opening reads only the zip directory and
``data.pkl``, and a tensor's bytes are touched when it is read.
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import CorruptCheckpointError, UnknownFormatError, UnsupportedCheckpointError
from ..safe_pickle import safe_load
from .base import Contents, Format, ReadOptions, WriteJob, closed_on_error
from .source import ByteSource, FileSource, MemorySource
from .torch_storage import Storage, StorageTensors

__all__ = ["FORMAT", "MAX_PICKLE_BYTES", "first_zip_entry", "read_archive", "read_blob",
           "read_member", "write", "zip_data_offset"]

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


class _ArchiveTensors(StorageTensors):
    """Storages are archive entries named ``<prefix>data/<key>``."""

    def __init__(self, source: ByteSource, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(source)
        self.archive = archive
        self.prefix = prefix
        self.entries = {i.filename: i for i in archive.infolist()}

    def persistent_load(self, pid: Any) -> Storage:
        return Storage.parse(pid, fields=5)

    def _entry(self, storage: Storage) -> zipfile.ZipInfo:
        info = self.entries.get(f"{self.prefix}data/{storage.key}")
        if info is None:
            raise CorruptCheckpointError(
                f"storage '{storage.key}' named in data.pkl is missing from the archive",
                path=self.source.name)
        nbytes = storage.numel * storage.dtype.itemsize
        if info.file_size < nbytes:
            raise CorruptCheckpointError(
                f"storage '{storage.key}' should hold {nbytes} bytes, its entry has "
                f"{info.file_size}", path=self.source.name)
        return info

    def stored_plainly(self, storage: Storage) -> bool:
        info = self.entries.get(f"{self.prefix}data/{storage.key}")
        return info is not None and info.compress_type == zipfile.ZIP_STORED

    def locate(self, storage: Storage) -> int:
        return zip_data_offset(self.source, self._entry(storage))

    def read_flat(self, storage: Storage, dtype: torch.dtype) -> torch.Tensor:
        info = self._entry(storage)
        if info.compress_type == zipfile.ZIP_STORED:
            return super().read_flat(storage, dtype)
        nbytes = storage.numel * storage.dtype.itemsize
        data = read_member(self.archive, info, nbytes, what=f"storage '{storage.key}'",
                           path=self.source.name)
        return MemorySource(data, self.source.name).array(0, nbytes, dtype)


#: Deflate expands at most about 1032 times; a member claiming more is a bomb.
_MAX_RATIO = 1032
#: A data.pkl holds names, shapes and small extras; it may expand this much before it is refused.
MAX_PICKLE_BYTES = 256 * 1024 * 1024


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, nbytes: int, *, what: str,
                path: str) -> bytes:
    """Read the first ``nbytes`` of a zip member, refusing sizes its compressed data cannot hold.

    Nothing beyond ``nbytes`` is decompressed, so a zip bomb costs at most what the caller
    needs, and that is checked against the member's compressed size first.

    Args:
        archive: The open archive.
        info: The member.
        nbytes: How many bytes the caller needs (a tensor's size, a pickle's limit).
        what: The member, for errors.
        path: The archive's file, for errors.

    Returns:
        The bytes (fewer if the member is shorter).

    Raises:
        CorruptCheckpointError: If the member cannot hold that many bytes.
    """
    if info.compress_type != zipfile.ZIP_STORED and \
            min(nbytes, info.file_size) > _MAX_RATIO * max(info.compress_size, 1):
        raise CorruptCheckpointError(
            f"{what} claims {info.file_size} bytes from {info.compress_size} compressed: a zip "
            "bomb, refused", path=path)
    with archive.open(info) as member:
        return member.read(nbytes)


def zip_data_offset(source: ByteSource, info: zipfile.ZipInfo) -> int:
    """Return where a zip entry's data begins, from its local header, checked against the file.

    The local header must name the entry the central directory names, its extra field must
    be whole records, and the data it places must end inside the file where the next record
    begins (a local header, the central directory, or this entry's data descriptor): a header
    whose lengths lie would otherwise place the data elsewhere (other bytes read as this
    entry's), or past the file's end.

    Args:
        source: The zip file's bytes.
        info: The entry, from the central directory.

    Returns:
        The byte offset of the entry's data.

    Raises:
        CorruptCheckpointError: If the local header is damaged or disagrees with the data.
    """
    header = source.read(info.header_offset, _LOCAL_HEADER.size, what="a zip record header")
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(header)
    if signature != _ZIP_MAGIC:
        raise CorruptCheckpointError(f"zip record '{info.filename}' has a corrupt header",
                                     path=source.name)
    start = info.header_offset + _LOCAL_HEADER.size
    offset = start + name_len + extra_len
    if offset + info.compress_size > source.size:
        raise CorruptCheckpointError(
            f"zip record '{info.filename}': its local header's lengths (name {name_len}, extra "
            f"{extra_len}) place its {info.compress_size} bytes at {offset}..."
            f"{offset + info.compress_size}, past the file's end ({source.size}): the header "
            "and the data disagree", path=source.name)
    named = source.read(start, name_len, what="a zip record's name")
    extra = source.read(start + name_len, extra_len, what="a zip record's extra field")
    end = offset + info.compress_size
    following = source.read(end, min(24, source.size - end), what="a zip record")
    if named != _encoded_name(info) or not _whole_records(extra) or not _next_record(
            following, described=bool(info.flag_bits & 0x08)):
        raise CorruptCheckpointError(
            f"zip record '{info.filename}': its local header (name length {name_len}, extra "
            f"length {extra_len}) disagrees with the central directory and the data: the "
            "header and the data disagree", path=source.name)
    return int(offset)


#: What follows a zip entry's data: the next local header or the central directory.
_NEXT_RECORDS = (_ZIP_MAGIC, b"PK\x01\x02")


def _next_record(following: bytes, *, described: bool) -> bool:
    """Whether the bytes after an entry's data begin the next record.

    Where the entry has a data descriptor (flag bit 3), that comes first: signed
    (``PK 07 08``), or unsigned, 12 bytes (20 in zip64) before the next record.
    """
    if following[:4] in _NEXT_RECORDS:
        return True
    return described and (following[:4] == b"PK\x07\x08" or following[12:16] in _NEXT_RECORDS
                          or following[20:24] in _NEXT_RECORDS)


def _encoded_name(info: zipfile.ZipInfo) -> bytes:
    """An entry's name as its headers store it (UTF-8 when flagged, else code page 437)."""
    return info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437",
                                     "surrogateescape")


def _whole_records(extra: bytes) -> bool:
    """Whether a zip extra field is a run of whole ``(id, length, data)`` records."""
    at = 0
    while at + 4 <= len(extra):
        at += 4 + int.from_bytes(extra[at + 2:at + 4], "little")
    return at == len(extra)


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
    info = archive.getinfo(pickles[0])
    if info.file_size > MAX_PICKLE_BYTES:
        archive.close()
        raise CorruptCheckpointError(f"data.pkl claims {info.file_size} bytes: more than any "
                                     f"checkpoint's metadata ({MAX_PICKLE_BYTES})",
                                     path=source.name)
    data = read_member(archive, info, MAX_PICKLE_BYTES, what="data.pkl", path=source.name)
    root = safe_load(data, path=source.name, unsafe=unsafe, factory=factory)
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


def write(job: WriteJob, path: Path) -> None:
    """Write a torch.save file (the pre-1.6 layout when ``job.legacy``).

    torch.save needs every tensor at once, so the weights are in memory while it writes; tied
    names share one tensor, which torch writes once.

    Args:
        job: What to write; extras go beside the weights (under ``job.weights_key`` if set).
        path: Where.
    """
    tensors = job.read_all()
    obj: dict[str, Any] = tensors
    if job.extras:
        obj = {**job.extras, job.weights_key: tensors} if job.weights_key else \
            {**tensors, **job.extras}
    torch.save(obj, path, _use_new_zipfile_serialization=not job.legacy)
    job.done(len(tensors))


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    with closed_on_error(source.close):
        stream = source.stream()
        with closed_on_error(stream.close):
            root, archive = read_archive(source, stream, unsafe=options.unsafe)
    return Contents("torch-zip", path, root, [archive.close, stream.close, source.close])


FORMAT = Format(
    name="torch-zip",
    open=_open,
    suffixes=(".pt", ".pth", ".bin", ".ckpt", ".tar", ".pth.tar"),
    magic=_magic,
    writes="torch",
    write=write,
)
