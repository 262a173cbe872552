"""NumPy ``.npy`` and ``.npz`` files, read without ``allow_pickle``.

An ``.npy`` header gives shape and dtype; the data follows it and is memory-mapped. An ``.npz``
is a zip of ``.npy`` members; stored members are memory-mapped in place, compressed ones are
decompressed when read.
"""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path
from tokenize import TokenError
from typing import IO, Any, Literal, cast

import numpy as np
import torch

from ..bounds import check_shape
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError, brief
from ..meta import TensorMeta, TensorRef, torch_dtype_of_numpy
from .base import Contents, Format, ReadOptions, WriteJob, closed_on_error
from .source import ByteSource, FileSource, MemorySource, strided
from .torch_zip import first_zip_entry, read_member, zip_data_offset

__all__ = ["NPY_FORMAT", "NPZ_FORMAT"]

_NPY_MAGIC = b"\x93NUMPY"


#: The longest header numpy reads by default (``max_header_size``): a longer one is refused
#: before its bytes are read, as numpy reads a header's stated length before checking it.
_MAX_HEADER = 10_000


def _header(stream: IO[bytes], name: str,
            source: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    try:
        version = np.lib.format.read_magic(stream)
        width = 2 if version == (1, 0) else 4  # the header length's bytes
        stated = stream.read(width)
        length = int.from_bytes(stated, "little")
        if len(stated) < width or length > _MAX_HEADER:
            raise ValueError(f"its header length {length} is truncated or over {_MAX_HEADER}")
        header = io.BytesIO(stated + stream.read(length))
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(header)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(header)
    except (ValueError, SyntaxError, TokenError) as exc:  # the header is a Python literal
        raise CorruptCheckpointError(f"array '{name}' has a malformed header: {brief(exc)}",
                                     path=source) from None
    if dtype.hasobject:
        raise UnsupportedCheckpointError(
            f"array '{name}' holds Python objects, which can only be read by unpickling; "
            "torchgraft reads numeric arrays only", path=source)
    return check_shape(shape, what=f"array '{name}'", path=source), bool(fortran), dtype


def _array_ref(source: ByteSource, offset: int, shape: tuple[int, ...], fortran: bool,
               dtype: np.dtype[Any], name: str) -> TensorRef:
    """A lazy tensor over an array's raw bytes at ``offset`` in ``source``."""
    torch_dtype = torch_dtype_of_numpy(dtype)
    if torch_dtype is None:
        raise UnsupportedCheckpointError(f"array '{name}' has dtype {dtype}, which torch lacks",
                                         path=source.name)
    nbytes = math.prod(shape) * dtype.itemsize
    source.check_range(offset, nbytes, what=f"array '{name}'")
    order: Literal["C", "F"] = "F" if fortran else "C"
    strides = _element_strides(shape, fortran)

    def read_into(out: torch.Tensor) -> None:
        cast(FileSource, source).read_into(offset, out, what=f"array '{name}'")

    direct = isinstance(source, FileSource) and dtype.isnative and not fortran

    def read() -> torch.Tensor:
        if dtype.isnative:
            flat = source.array(offset, nbytes, torch_dtype, what=f"array '{name}'")
            return strided(flat, shape, strides, 0, what=name, source=source.name)
        raw = np.frombuffer(source.read(offset, nbytes), dtype=dtype).reshape(shape, order=order)
        return torch.from_numpy(raw.astype(dtype.newbyteorder("=")))

    return TensorRef(TensorMeta.of(shape, torch_dtype), read, read_into if direct else None)


def _check_size(name: str, stored: int, shape: tuple[int, ...], dtype: np.dtype[Any],
                source: str) -> None:
    """Numpy writes exactly the array's bytes after its header: anything else is damage.

    The header's shape is not covered by any checksum that is read, so a damaged shape is
    caught here rather than loaded as another tensor.
    """
    needed = math.prod(shape) * dtype.itemsize
    if stored != needed:
        raise CorruptCheckpointError(f"array '{name}' holds {stored} bytes after its header, its "
                                     f"shape {shape} and dtype {dtype} need {needed}", path=source)


def _element_strides(shape: tuple[int, ...], fortran: bool) -> tuple[int, ...]:
    strides = [0] * len(shape)
    step = 1
    for dim in (range(len(shape)) if fortran else reversed(range(len(shape)))):
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


def _open_npy(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    with closed_on_error(source.close):
        with source.stream() as f:
            shape, fortran, dtype = _header(f, path.stem, str(path))
            offset = f.tell()
        _check_size(path.stem, source.size - offset, shape, dtype, str(path))
        root = {path.stem: _array_ref(source, offset, shape, fortran, dtype, path.stem)}
    return Contents("numpy", path, root, [source.close])


def _open_npz(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    with closed_on_error(source.close), source.stream() as stream:
        root = _npz_root(source, stream, path)
    return Contents("numpy", path, root, [source.close])


def _npz_root(source: FileSource, stream: IO[bytes], path: Path) -> dict[str, Any]:
    root: dict[str, Any] = {}
    with zipfile.ZipFile(stream) as archive:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            with archive.open(info) as member:
                shape, fortran, dtype = _header(member, name, str(path))
                header_size = member.tell()
            _check_size(name, info.file_size - header_size, shape, dtype, str(path))
            if info.compress_type == zipfile.ZIP_STORED:
                offset = zip_data_offset(source, info) + header_size
                root[name] = _array_ref(source, offset, shape, fortran, dtype, name)
            else:
                nbytes = header_size + math.prod(shape) * dtype.itemsize
                data = read_member(archive, info, nbytes, what=f"member '{info.filename}'",
                                   path=str(path))
                root[name] = _array_ref(MemorySource(data, f"{path}:{info.filename}"),
                                        header_size, shape, fortran, dtype, name)
    return root


def write_npz(job: WriteJob, path: Path) -> None:
    """Write an uncompressed ``.npz``, one array in memory at a time.

    Args:
        job: What to write.
        path: Where.

    Raises:
        UnsupportedCheckpointError: For dtypes numpy lacks (bfloat16, float8).
    """
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for count, name in enumerate(job.tensors, start=1):
            array = job.read_numpy(name, "numpy", path)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
            job.done(count)


def _npz_magic(head: bytes) -> bool:
    name = first_zip_entry(head)
    return name is not None and name.endswith(".npy")


NPY_FORMAT = Format(name="numpy", open=_open_npy, suffixes=(".npy",),
                    magic=lambda head: head.startswith(_NPY_MAGIC))
NPZ_FORMAT = Format(name="numpy", open=_open_npz, suffixes=(".npz",), magic=_npz_magic,
                    writes="numpy", write=write_npz)
