"""``torch.export.save`` archives (``.pt2``): the exported program's weights and constants.

A ``.pt2`` is a zip archive. Its ``data/weights/model_weights_config.json`` maps each state-dict
name to a raw byte entry (``data/weights/weight_0``...) with the tensor's dtype, sizes,
strides and storage offset; several names may view one entry (tied weights). Constants
(non-persistent buffers, lifted tensors) are described the same way under ``data/constants/``.
Entries are stored uncompressed and aligned, so tensors are memory-mapped in place; the program
itself (``models/*.json``) is never read. Opening gives ``{"state_dict": ..., "constants":
...}``: the weights are the state dict, the constants another weight set.

Archives written before the raw layout (``torch.export.save`` of torch 2.5 and older, or a
``data/weights/<model>.pt`` inside a newer one) keep the weights as a ``torch.save`` file inside
the archive: that file is read with the safe unpickler.

The configuration JSON is parsed here, not by ``torch.export``: torch's loader deserialises
and builds the whole program (and runs ``torch.load(weights_only=False)`` on pickled tensor
subclasses), while reading the weights only needs the tensor layout, checked against the
archive before anything is mapped.
"""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..bounds import parse_json
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError, shown
from ..meta import TensorMeta, TensorRef
from .base import Contents, Format, ReadOptions, closed_on_error
from .source import FileSource, check_view, contiguous_strides, strided
from .torch_zip import MAX_PICKLE_BYTES, first_zip_entry, read_blob, read_member, zip_data_offset

__all__ = ["FORMAT"]

#: ``torch._export.serde.schema.ScalarType`` codes, as the archive stores dtypes.
SCALAR_TYPES: dict[int, torch.dtype] = {
    1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64,
    6: torch.float16, 7: torch.float32, 8: torch.float64, 9: torch.complex32,
    10: torch.complex64, 11: torch.complex128, 12: torch.bool, 13: torch.bfloat16,
    28: torch.uint16, 29: torch.float8_e4m3fn, 30: torch.float8_e5m2,
    31: torch.float8_e4m3fnuz, 32: torch.float8_e5m2fnuz, 34: torch.uint32, 35: torch.uint64,
}
_STRIDED_LAYOUT = 7

#: Where the parts are, relative to the archive's root folder.
_WEIGHTS = "data/weights/"
_CONSTANTS = "data/constants/"
_CONFIG = re.compile(r"^data/(weights|constants)/(.+)_(weights|constants)_config\.json$")
_LEGACY_WEIGHTS = ("serialized_state_dict.pt", "serialized_constants.pt")
_FIRST_ENTRY = re.compile(r"^[^/]+/(data/(weights|constants|sample_inputs)/|models/|"
                          r"archive_format$|archive_version$|\.data/|extra/|byteorder$)"
                          r"|^serialized_exported_program\.json$|^version$")
#: A configuration lists names and layouts; one larger than this is not an export's.
MAX_CONFIG_BYTES = 64 * 1024 * 1024


def _magic(head: bytes) -> bool:
    name = first_zip_entry(head)
    return name is not None and _FIRST_ENTRY.match(name) is not None


def _ints(values: Any, what: str, path: str) -> tuple[int, ...]:
    if not isinstance(values, list) or len(values) > 64:
        raise CorruptCheckpointError(f"{what} is malformed", path=path)
    out = []
    for value in values:
        number = value.get("as_int") if isinstance(value, dict) else None
        if isinstance(number, bool) or not isinstance(number, int):
            raise UnsupportedCheckpointError(
                f"{what} is symbolic ({str(value)[:60]}): export with static shapes", path=path)
        out.append(number)
    return tuple(out)


class _Archive:
    """The archive's entries, and tensors viewing them."""

    def __init__(self, path: Path, source: FileSource, stream: Any) -> None:
        self.path = str(path)
        self.source = source
        self.zip = zipfile.ZipFile(stream)
        self.entries = {i.filename: i for i in self.zip.infolist()}
        roots = {n.rpartition("archive_format")[0] for n in self.entries
                 if n.endswith("/archive_format") and n.count("/") == 1}
        if len(roots) > 1:
            raise CorruptCheckpointError("the archive holds several pt2 roots", path=self.path)
        self.root = roots.pop() if roots else ""

    def member(self, name: str, limit: int) -> bytes:
        info = self.entries[self.root + name]
        if info.file_size > limit:
            raise CorruptCheckpointError(f"'{name}' claims {info.file_size} bytes, more than "
                                         f"any export's ({limit})", path=self.path)
        return read_member(self.zip, info, limit, what=f"'{name}'", path=self.path)

    def names(self) -> list[str]:
        return [n.removeprefix(self.root) for n in self.entries if n.startswith(self.root)]

    def tensors(self, folder: str, config_name: str) -> dict[str, TensorRef]:
        document = parse_json(self.member(config_name, MAX_CONFIG_BYTES),
                              what=f"'{config_name}'", path=self.path)
        config = document.get("config") if isinstance(document, dict) else None
        if not isinstance(config, dict):
            raise CorruptCheckpointError(f"'{config_name}' is malformed", path=self.path)
        return {str(name): self._tensor(folder, str(name), payload)
                for name, payload in config.items()}

    def _tensor(self, folder: str, name: str, payload: Any) -> TensorRef:
        meta = payload.get("tensor_meta") if isinstance(payload, dict) else None
        if not isinstance(meta, dict) or not isinstance(payload.get("path_name"), str):
            raise CorruptCheckpointError(f"tensor '{name}' has no layout", path=self.path)
        if payload.get("use_pickle"):
            raise UnsupportedCheckpointError(
                f"tensor '{name}' is a pickled tensor subclass, which would run code to "
                "rebuild; export it as a plain tensor", path=self.path)
        dtype = SCALAR_TYPES.get(meta.get("dtype"))  # type: ignore[arg-type]
        if dtype is None or meta.get("layout", _STRIDED_LAYOUT) != _STRIDED_LAYOUT:
            raise UnsupportedCheckpointError(
                f"tensor '{name}' has dtype code {shown(meta.get('dtype'), 20)} or layout "
                f"{shown(meta.get('layout'), 20)}, which torchgraft does not read", path=self.path)
        shape = _ints(meta.get("sizes"), f"tensor '{name}' sizes", self.path)
        stride = _ints(meta.get("strides"), f"tensor '{name}' strides", self.path)
        (offset,) = _ints([meta.get("storage_offset", {"as_int": 0})],
                          f"tensor '{name}' offset", self.path)
        info = self.entries.get(self.root + folder + payload["path_name"])
        if info is None:
            raise CorruptCheckpointError(f"tensor '{name}' names a missing entry "
                                         f"'{payload['path_name']}'", path=self.path)
        if info.compress_type != zipfile.ZIP_STORED:
            raise UnsupportedCheckpointError(f"tensor '{name}' is compressed in the archive",
                                             path=self.path)
        numel = info.file_size // dtype.itemsize
        check_view(shape, stride, offset, numel, what=name, source=self.path)
        device = meta.get("device") or {}
        where = str(device.get("type", "cpu")) if isinstance(device, dict) else "cpu"
        if isinstance(device, dict) and isinstance(device.get("index"), int):
            where += f":{device['index']}"

        def flat() -> torch.Tensor:
            start = zip_data_offset(self.source, info)
            return self.source.array(start, numel * dtype.itemsize, dtype, what=f"'{name}'")

        def read() -> torch.Tensor:
            return strided(flat(), shape, stride, offset, what=name, source=self.path)

        def read_into(out: torch.Tensor) -> None:
            start = zip_data_offset(self.source, info) + offset * dtype.itemsize
            self.source.read_into(start, out, what=f"'{name}'")

        direct = stride == contiguous_strides(shape) or math.prod(shape) == 0
        return TensorRef(TensorMeta.of(shape, dtype, where), read, read_into if direct else None,
                         alias_key=(id(self), info.filename, offset, shape, stride, dtype))

    def blob(self, name: str, *, unsafe: bool) -> Any:
        data = self.member(name, MAX_PICKLE_BYTES * 64)
        return read_blob(data, name=f"{self.path}:{name}", unsafe=unsafe)

    def close(self) -> None:
        self.zip.close()
        self.source.close()


def _read(archive: _Archive, options: ReadOptions) -> dict[str, Any]:
    names = archive.names()
    if any(n in names for n in _LEGACY_WEIGHTS):
        return {key.removeprefix("serialized_").removesuffix(".pt"):
                archive.blob(key, unsafe=options.unsafe) for key in _LEGACY_WEIGHTS
                if key in names}
    models: dict[str, dict[str, Any]] = {}
    for name in names:
        match = _CONFIG.match(name)
        if match is not None:
            part = "state_dict" if match[1] == "weights" else "constants"
            folder = _WEIGHTS if part == "state_dict" else _CONSTANTS
            models.setdefault(match[2], {})[part] = archive.tensors(folder, name)
        elif name.startswith(_WEIGHTS) and name.endswith(".pt") and "/" not in \
                name.removeprefix(_WEIGHTS):
            model = name.removeprefix(_WEIGHTS).removesuffix(".pt")
            models.setdefault(model, {})["state_dict"] = archive.blob(name, unsafe=options.unsafe)
    if not models:
        raise CorruptCheckpointError("a pt2 archive without weights or constants configuration",
                                     path=archive.path)
    return next(iter(models.values())) if len(models) == 1 else models


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    with closed_on_error(source.close):
        stream = source.stream()
        with closed_on_error(stream.close):
            archive = _Archive(path, source, stream)
            with closed_on_error(archive.close):
                root = _read(archive, options)
    return Contents("torch-export", path, root, [archive.close, stream.close])


FORMAT = Format(name="torch-export", open=_open, suffixes=(".pt2",), magic=_magic)
