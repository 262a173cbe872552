"""``torchgraft inspect`` without importing torch, for files whose metadata needs none.

``import torch`` is most of a command's start-up (1.5-2 s on a small machine). A safetensors
header, a GGUF header (:mod:`torchgraft.gguf_header`), a NumPy ``.npy``/``.npz`` header, the
pickle of a ``torch.save`` state dict (read by a restricted unpickler that knows only how torch
rebuilds plain tensors) and a DCP folder's ``.metadata`` (DCP's classes read as inert records)
say everything ``inspect`` shows.
Anything else, or anything at all unusual in those files (training checkpoints with extras,
quantized tensors, aliases, a header the full reader would reject), returns ``None``: the full
reader then runs, with its checks and its errors. The summary is the one
:func:`torchgraft.inspect` gives, field for field (the tests compare them).
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf_header import MAGIC as GGUF_MAGIC
from .gguf_header import plan as gguf_plan
from .inspect import BUFFER_NAMES, CheckpointInfo, DtypeTotals
from .pickle_walk import walk_opcodes
from .tiling import tiles
from .wrappers import detect_wrappers

__all__ = ["QuickMeta", "quick_inspect"]

#: Bytes per element of each dtype, by torch's name for it.
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
            "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
            "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
            "float8_e5m2": 1}
#: safetensors' dtype codes, by torch's names.
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                      "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
                      "BOOL": "bool", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
                      "F8_E5M2": "float8_e5m2"}
#: torch's typed storage classes, as a pickle names them, to their dtypes.
STORAGE_DTYPES = {"DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
                  "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                  "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
                  "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
                  "ComplexDoubleStorage": "complex128"}
#: Keys of safetensors metadata that only the full reader interprets.
_OWN_METADATA = ("torchgraft.",)
#: safetensors ``format`` markers of files another framework wrote, which its reader opens.
_OTHER_FRAMEWORKS = ("mlx",)
_MAX_HEADER = 100 * 1024 * 1024
_MAX_PICKLE = 64 * 1024 * 1024


class _NotQuick(Exception):
    """The file needs the full reader (torch)."""


@dataclass(frozen=True)
class QuickMeta:
    """A tensor's metadata as a header gives it: what :class:`~torchgraft.TensorMeta` shows.

    Attributes:
        shape: The shape.
        dtype: torch's name of the dtype (``"float32"``).
        device: Where it was saved.
    """

    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size of its data."""
        return self.numel * ITEMSIZE[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        """The metadata as JSON-ready data, as ``TensorMeta.to_dict`` gives it."""
        return {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes,
                "device": self.device}


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise _NotQuick
    return tuple(value)


def _safetensors(path: Path) -> tuple[dict[str, QuickMeta], dict[str, Any], str]:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _NotQuick
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise _NotQuick
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise _NotQuick
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or any(str(k).startswith(_OWN_METADATA) for k in metadata):
        raise _NotQuick
    if metadata.get("format") in _OTHER_FRAMEWORKS:
        raise _NotQuick  # read as that framework's format (torchgraft.io.mlx_format)
    entries = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise _NotQuick
        meta = QuickMeta(_shape(entry.get("shape")), SAFETENSORS_DTYPES[entry["dtype"]])
        offsets = entry.get("data_offsets")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= size - 8 - length
                or offsets[1] - offsets[0] != meta.nbytes):
            raise _NotQuick
        entries.append((offsets[0], name, meta))
    entries.sort(key=lambda e: e[0])
    metadata = {str(k): str(v) for k, v in metadata.items()}
    if metadata.get("format") == "pt":
        del metadata["format"]
    return {name: meta for _o, name, meta in entries}, (
        {"__metadata__": metadata} if metadata else {}), "safetensors"


def _npy_meta(stream: Any, size: int) -> QuickMeta:
    """An array's metadata from its header, its data checked to be all there (``size``)."""
    from numpy.lib import format as npy

    read = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(
        npy.read_magic(stream))
    if read is None:
        raise _NotQuick
    shape, _fortran, dtype = read(stream)
    if dtype.hasobject or dtype.name not in ITEMSIZE or dtype.byteorder == ">":
        raise _NotQuick
    meta = QuickMeta(_shape(shape), dtype.name)
    if stream.tell() + meta.nbytes != size:
        raise _NotQuick
    return meta


def _numpy(path: Path) -> tuple[dict[str, QuickMeta], dict[str, Any], str]:
    if path.name.endswith(".npy"):
        with path.open("rb") as f:
            return {path.stem: _npy_meta(f, path.stat().st_size)}, {}, "numpy"
    with zipfile.ZipFile(path) as archive:
        tensors = {}
        for member in archive.infolist():
            if not member.filename.endswith(".npy") or member.compress_type != zipfile.ZIP_STORED:
                raise _NotQuick
            with archive.open(member) as f:
                tensors[member.filename.removesuffix(".npy")] = _npy_meta(f, member.file_size)
    return tensors, {}, "numpy"


def _walked(data: bytes) -> io.BytesIO:
    """A pickle's bytes (at most the quick reader's limit) to unpickle, its opcodes walked.

    :mod:`~torchgraft.pickle_walk` refuses what the unpickler would allocate on the file's
    word (a memo index of 2**30 in a 10-byte file), as the full reader does.
    """
    if len(data) > _MAX_PICKLE:
        raise _NotQuick
    walk_opcodes(io.BytesIO(data), len(data))
    return io.BytesIO(data)


class _Storage:
    def __init__(self, dtype: str, key: str, location: str, numel: int) -> None:
        self.dtype, self.key, self.location, self.numel = dtype, key, location, numel


class _Unpickler(pickle.Unpickler):
    """Knows how torch pickles a state dict of plain tensors, and nothing else."""

    def __init__(self, file: Any, storages: dict[str, int]) -> None:
        super().__init__(file)
        self.storages = storages  # record name to its size in bytes

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        raise _NotQuick

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and pid[1] in ITEMSIZE and isinstance(pid[2], str) and isinstance(pid[3], str)
                and isinstance(pid[4], int)):
            raise _NotQuick
        storage = _Storage(pid[1], pid[2], pid[3], pid[4])
        if self.storages.get(storage.key, -1) < storage.numel * ITEMSIZE[storage.dtype]:
            raise _NotQuick
        return storage


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> QuickMeta:
    shape, strides = _shape(size), _shape(stride)
    if not isinstance(storage, _Storage) or not isinstance(offset, int) or len(strides) != len(
            shape):
        raise _NotQuick
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    if math.prod(shape) and last >= storage.numel:
        raise _NotQuick
    return QuickMeta(shape, storage.dtype, storage.location)


class _Record:
    """A stand-in for any class of DCP's metadata: its arguments and state, nothing run."""

    args: tuple[Any, ...]
    state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        record = object.__new__(cls)
        record.args, record.state = args, None
        return record

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def field(self, name: str) -> Any:
        """A field of the recorded state (a dataclass's ``__dict__``)."""
        if not isinstance(self.state, dict):
            raise _NotQuick
        return self.state.get(name)


@dataclass(frozen=True)
class _Marker:
    """A value of torch's that only names itself (a dtype, a layout)."""

    name: str


def _marker(*args: Any) -> _Marker:
    return _Marker(str(args[0]) if args else "")


class _DcpUnpickler(pickle.Unpickler):
    """Reads a DCP ``.metadata`` into records: DCP's own classes, torch's sizes and dtypes."""

    _RECORDS = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")

    def find_class(self, module: str, name: str) -> Any:
        if module in self._RECORDS:
            return type(name, (_Record,), {})
        if (module, name) == ("torch", "Size"):
            return lambda dims=(): _shape(list(dims))
        if module == "torch" and (name in ITEMSIZE or name in ("strided", "contiguous_format")):
            return _Marker(name)
        if (module, name) in (("torch.serialization", "_get_layout"),
                              ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")):
            return _marker
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise _NotQuick


def _dcp_storage(folder: Path, storage_data: Any) -> set[tuple[str, tuple[int, ...] | None]]:
    """Every stored item, checked to lie inside a plain data file of the folder."""
    if not isinstance(storage_data, dict):
        raise _NotQuick
    stored = set()
    sizes: dict[str, int] = {}  # each data file looked at once, however many items it holds
    for index, info in storage_data.items():
        if not isinstance(index, _Record) or not isinstance(info, _Record):
            raise _NotQuick
        relative, offset, length = (info.field(k) for k in ("relative_path", "offset", "length"))
        if info.field("transform_descriptors") or not isinstance(relative, str) or any(
                not isinstance(v, int) for v in (offset, length)):
            raise _NotQuick
        if relative not in sizes:
            file = folder / relative
            if "/" in relative or relative.startswith(".") or file.is_symlink() \
                    or not file.is_file():
                raise _NotQuick
            sizes[relative] = file.stat().st_size
        if not 0 <= offset <= offset + length <= sizes[relative]:
            raise _NotQuick
        where = index.field("offset")
        stored.add((str(index.field("fqn")), None if where is None else _shape(where)))
    return stored


def _covered(size: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """Whether the chunks lie inside the tensor and cover it exactly, none overlapping.

    Linear in the chunks (:func:`~torchgraft.tiling.tiles`), as the full reader checks them.
    """
    if any(len(o) != len(size) or len(n) != len(size)
           or any(a < 0 or b < 0 or a + b > d for a, b, d in zip(o, n, size, strict=True))
           for o, n in chunks):
        return False
    return sum(math.prod(n) for _o, n in chunks) == math.prod(size) and bool(tiles(size, chunks))


def _dcp(folder: Path) -> tuple[dict[str, QuickMeta], dict[str, Any], str]:
    metadata_path = folder / ".metadata"
    if metadata_path.is_symlink() or metadata_path.stat().st_size > _MAX_PICKLE:
        raise _NotQuick
    with metadata_path.open("rb") as f:
        metadata = _DcpUnpickler(_walked(f.read(_MAX_PICKLE + 1))).load()
    if not isinstance(metadata, _Record) or type(metadata).__name__ != "Metadata":
        raise _NotQuick
    stored = _dcp_storage(folder, metadata.field("storage_data"))
    entries, planner = metadata.field("state_dict_metadata"), metadata.field("planner_data")
    if not isinstance(entries, dict) or not isinstance(planner, dict):
        raise _NotQuick
    tensors = {}
    for fqn, entry in entries.items():
        if type(entry).__name__ != "TensorStorageMetadata" or planner.get(fqn) != (fqn,):
            raise _NotQuick  # objects beside the weights, nesting: the full reader's job
        properties, size = entry.field("properties"), _shape(entry.field("size"))
        state = properties.state if isinstance(properties, _Record) else None
        dtype = state[0] if isinstance(state, tuple) and state else None
        chunks = [(_shape(c.field("offsets")), _shape(c.field("sizes")))
                  for c in entry.field("chunks") or [] if isinstance(c, _Record)]
        if not isinstance(dtype, _Marker) or dtype.name not in ITEMSIZE or not _covered(
                size, chunks) or any((fqn, offsets) not in stored for offsets, _n in chunks):
            raise _NotQuick
        tensors[str(fqn)] = QuickMeta(size, dtype.name)
    return tensors, {}, "dcp"


def _torch_zip(path: Path) -> tuple[dict[str, QuickMeta], dict[str, Any], str]:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise _NotQuick
        base = pickles[0].removesuffix("data.pkl")
        info = archive.getinfo(pickles[0])
        if info.file_size > _MAX_PICKLE or f"{base}version" not in names:
            raise _NotQuick
        storages = {}
        for member in archive.infolist():
            if member.filename.startswith(f"{base}data/"):
                with archive.open(member):  # its local header checked, no data read
                    storages[member.filename.removeprefix(f"{base}data/")] = member.file_size
        with archive.open(info) as f:
            root = _Unpickler(_walked(f.read(_MAX_PICKLE + 1)), storages).load()
    if not isinstance(root, dict) or not root or not all(
            isinstance(k, str) and isinstance(v, QuickMeta) for k, v in root.items()):
        raise _NotQuick  # a training checkpoint, extras...: the full reader sorts them out
    return dict(root), {}, "torch-zip"


class _BoundedFile:
    """Positioned reads of a file, each range checked against its size (for the GGUF header)."""

    def __init__(self, path: Path, size: int, fd: int) -> None:
        self.name, self.size, self.fd = str(path), size, fd

    def check_range(self, offset: int, nbytes: int, *, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise _NotQuick

    def read(self, offset: int, nbytes: int, *, what: str = "data") -> bytes:
        self.check_range(offset, nbytes, what=what)
        data = os.pread(self.fd, nbytes, offset)
        if len(data) != nbytes:
            raise _NotQuick
        return data


def _gguf(path: Path) -> tuple[dict[str, QuickMeta], dict[str, Any], str]:
    with path.open("rb") as f:
        contents = gguf_plan(_BoundedFile(path, os.fstat(f.fileno()).st_size, f.fileno()))
    tensors = {name: QuickMeta(t.shape, t.dtype or "float32")
               for name, t in contents.tensors.items()}
    return tensors, {"__metadata__": contents.metadata}, "gguf"


_READERS: tuple[tuple[Callable[[bytes, str], bool],
                      Callable[[Path], tuple[dict[str, QuickMeta], dict[str, Any], str]]], ...] = (
    (lambda head, name: head[:4] == b"PK\x03\x04" and not name.endswith((".npz", ".pt2")),
     _torch_zip),
    (lambda head, name: head[:6] == b"\x93NUMPY" or (head[:4] == b"PK\x03\x04"
                                                    and name.endswith(".npz")), _numpy),
    (lambda head, name: len(head) >= 10 and head[8:9] == b"{", _safetensors),
    (lambda head, name: head[:4] == GGUF_MAGIC, _gguf),
)


def quick_inspect(path: Path) -> CheckpointInfo | None:
    """Summarise a checkpoint file without importing torch, when its metadata needs none.

    Args:
        path: A file, or a torch.distributed.checkpoint folder (other folders, repository ids
            and everything unusual go to the full reader).

    Returns:
        The summary :func:`torchgraft.inspect` would give, or ``None`` when the full reader
        (which imports torch) must run.
    """
    try:
        if path.is_dir() and (path / ".metadata").is_file():
            tensors, extras, fmt = _dcp(path)
            return _summary(path, tensors, extras, fmt)
        if not path.is_file():
            return None
        with path.open("rb") as f:
            head = f.read(16)
        reader = next((read for sniff, read in _READERS if sniff(head, path.name.lower())), None)
        if reader is None:
            return None
        tensors, extras, fmt = reader(path)
    except Exception:
        return None
    return _summary(path, tensors, extras, fmt)


def _summary(path: Path, tensors: dict[str, QuickMeta], extras: dict[str, Any],
             fmt: str) -> CheckpointInfo:
    """The summary of what a quick reader found, as :func:`torchgraft.inspect` builds it."""
    info = CheckpointInfo(
        path=str(path), format=fmt, tensors=list(tensors.items()),  # type: ignore[arg-type]
        saved_devices=sorted({m.device for m in tensors.values()}),
        wrappers=detect_wrappers(tensors, saved=[*tensors, *extras]), weights_key="",
        model_class=None, weight_sets={"": len(tensors)}, extras=extras)
    for name, meta in tensors.items():
        info.totals.add(meta)  # type: ignore[arg-type]
        if BUFFER_NAMES.search(name):
            info.buffers.add(meta)  # type: ignore[arg-type]
        info.by_dtype.setdefault(meta.dtype, DtypeTotals()).add(meta)  # type: ignore[arg-type]
    return info
