"""torch.save's legacy format (PyTorch < 1.6, or ``_use_new_zipfile_serialization=False``).

Layout: five pickles (magic number, protocol version, system info, the object, the list of
storage keys), then each storage as an 8-byte little-endian element count and its raw bytes.
Opening unpickles the object and walks the storage headers to learn where each storage's
bytes are; it reads no tensor data.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..safe_pickle import safe_load
from .base import Contents, Format, ReadOptions, closed_on_error
from .source import FileSource
from .torch_storage import Storage, StorageTensors, text

__all__ = ["FORMAT", "LEGACY_MAGIC"]

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
# A protocol-2+ pickle of MAGIC_NUMBER: PROTO n, LONG1 10 bytes, little-endian magic.
LEGACY_MAGIC = b"\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")


def _magic(head: bytes) -> bool:
    if len(head) < 14 or head[0] != 0x80:
        return False
    body = head[2:]
    if body[:1] == b"\x95":  # protocol 4+: a FRAME opcode with an 8-byte length comes first
        body = body[9:]
    return body.startswith(LEGACY_MAGIC)


class _LegacyTensors(StorageTensors):
    """Storages lie after the pickles, at offsets found by :meth:`find_offsets`."""

    def __init__(self, source: FileSource) -> None:
        super().__init__(source)
        self.roots: dict[str, Storage] = {}
        self.offsets: dict[str, int] = {}

    def persistent_load(self, pid: Any) -> Storage:
        root = Storage.parse(pid, fields=6)
        root = self.roots.setdefault(root.key, root)
        view = pid[5]
        if view is None:
            return root
        _view_key, view_offset, view_numel = view
        return replace(root, numel=int(view_numel), view_offset=int(view_offset))

    def locate(self, storage: Storage) -> int:
        return self.offsets[storage.key] + storage.view_offset * storage.dtype.itemsize

    def find_offsets(self, keys: Any, start: int) -> None:
        """Walk the storage headers after the pickles, recording where each storage's data is.

        Args:
            keys: The unpickled list of storage keys, in file order.
            start: The file offset where the first storage header begins.

        Raises:
            CorruptCheckpointError: If a header is missing or a storage runs past the end.
        """
        if not isinstance(keys, list):
            raise CorruptCheckpointError("the storage key list is malformed")
        position = start
        for key in map(text, keys):
            storage = self.roots.get(key)
            if storage is None:
                raise CorruptCheckpointError(f"storage '{key}' is listed but never used")
            (count,) = struct.unpack("<q", self.source.read(position, 8,
                                                            what=f"storage '{key}' header"))
            nbytes = count * storage.dtype.itemsize
            self.source.check_range(position + 8, nbytes, what=f"storage '{key}'")
            self.offsets[key] = position + 8
            position += 8 + nbytes
        missing = set(self.roots) - set(self.offsets)
        if missing:
            raise CorruptCheckpointError(f"storages {sorted(missing)} have no data in the file")


def _read_header(stream: IO[bytes], path: str) -> None:
    if safe_load(stream, path=path) != MAGIC_NUMBER:
        raise CorruptCheckpointError("invalid magic number", path=path)
    version = safe_load(stream, path=path)
    if version != PROTOCOL_VERSION:
        raise UnsupportedCheckpointError(f"legacy protocol version {version!r}", path=path)
    sys_info = safe_load(stream, path=path)
    if isinstance(sys_info, dict) and sys_info.get("little_endian") is False:
        raise UnsupportedCheckpointError("big-endian torch checkpoints are not read yet",
                                         path=path)


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    factory = _LegacyTensors(source)
    with closed_on_error(source.close), source.stream() as stream:
        _read_header(stream, str(path))
        root = safe_load(stream, path=str(path), unsafe=options.unsafe, factory=factory)
        keys = safe_load(stream, path=str(path))
        factory.find_offsets(keys, stream.tell())
    return Contents("torch-legacy", path, root, [source.close])


FORMAT = Format(name="torch-legacy", open=_open, magic=_magic)
