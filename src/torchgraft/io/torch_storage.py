"""What both torch.save layouts share: storage records in the pickle, and tensors viewing them."""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..errors import CorruptCheckpointError, shown
from ..meta import TensorMeta, TensorRef
from ..safe_pickle import StorageType
from .boxes import box_reader, permuted_reader, storage_order
from .source import ByteSource, FileSource, check_view, contiguous_strides, strided

__all__ = ["Storage", "StorageTensors", "text"]


def text(value: Any) -> str:
    """A string field of a storage record (Python 2 pickles store them as bytes)."""
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Storage:
    """A storage named by the pickle's persistent ids.

    Attributes:
        key: The storage's key in the file.
        dtype: The element type it was saved with.
        location: Where it lived when saved, e.g. ``"cuda:1"``.
        numel: Its number of elements.
        view_offset: For legacy storage views, the element offset into the root storage.
    """

    key: str
    dtype: torch.dtype
    location: str
    numel: int
    view_offset: int = 0

    @classmethod
    def parse(cls, pid: Any, *, fields: int) -> Storage:
        """Parse a ``('storage', type, key, location, numel, ...)`` persistent id.

        Args:
            pid: The persistent id.
            fields: How many fields the layout uses (5 for zip files, 6 for legacy files).

        Returns:
            The storage (for a legacy view, its root).

        Raises:
            CorruptCheckpointError: If the record is malformed.
        """
        if not isinstance(pid, tuple) or len(pid) != fields or text(pid[0]) != "storage":
            raise CorruptCheckpointError(f"unknown storage record {shown(pid, 80)}")
        storage_type, key, location, numel = pid[1:5]
        if not isinstance(storage_type, StorageType) or not isinstance(numel, int):
            raise CorruptCheckpointError(f"malformed storage record {shown(pid, 80)}")
        return cls(text(key), storage_type.dtype, text(location), numel)


class StorageTensors(ABC):
    """Turns storage records into lazy tensors; a format says where a storage's bytes are.

    Args:
        source: The file's bytes.
    """

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self._flat: weakref.WeakValueDictionary[tuple[Storage, torch.dtype], torch.Tensor] = (
            weakref.WeakValueDictionary())

    @abstractmethod
    def persistent_load(self, pid: Any) -> Storage:
        """Parse a storage record of this layout."""

    @abstractmethod
    def locate(self, storage: Storage) -> int:
        """Return the offset of the storage's first byte in :attr:`source`."""

    def stored_plainly(self, storage: Storage) -> bool:
        """Whether the storage's bytes lie as they are in the file (not compressed)."""
        return True

    def read_flat(self, storage: Storage, dtype: torch.dtype) -> torch.Tensor:
        """Read a whole storage as a flat tensor of ``dtype`` (memory-mapped where aligned)."""
        nbytes = storage.numel * storage.dtype.itemsize
        return self.source.array(self.locate(storage), nbytes, dtype,
                                 what=f"storage '{storage.key}'")

    def flat(self, storage: Storage, dtype: torch.dtype) -> torch.Tensor:
        """Return a storage as a flat tensor, shared between the tensors that view it."""
        cached = self._flat.get((storage, dtype))
        if cached is None:
            cached = self.read_flat(storage, dtype)
            self._flat[(storage, dtype)] = cached
        return cached

    def tensor(self, storage: Any, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
               dtype: torch.dtype | None) -> TensorRef:
        """A lazy tensor viewing ``storage``; ``dtype`` overrides the storage's own."""
        if not isinstance(storage, Storage):
            raise CorruptCheckpointError("a tensor record without a storage")
        view_dtype = dtype or storage.dtype
        check_view(size, stride, offset,
                   storage.numel * storage.dtype.itemsize // view_dtype.itemsize,
                   what=f"storage {storage.key}", source=self.source.name)

        def read() -> torch.Tensor:
            return strided(self.flat(storage, view_dtype), size, stride, offset,
                           what=f"storage {storage.key}", source=self.source.name)

        def read_into(out: torch.Tensor) -> None:
            start = self.locate(storage) + offset * view_dtype.itemsize
            cast(FileSource, self.source).read_into(start, out, what=f"storage '{storage.key}'")

        def span() -> tuple[str, int]:
            return cast(FileSource, self.source).place(
                self.locate(storage) + offset * view_dtype.itemsize)

        located: list[int] = []  # the zip header is read once, not once per run of a block

        def read_at(start: int, out: torch.Tensor) -> None:
            if not located:
                located.append(self.locate(storage) + offset * view_dtype.itemsize)
            cast(FileSource, self.source).read_into(located[0] + start, out,
                                                    what=f"storage '{storage.key}'")

        plain = (isinstance(self.source, FileSource) and view_dtype == storage.dtype
                 and self.stored_plainly(storage))
        direct = plain and stride == contiguous_strides(size)
        meta = TensorMeta.of(size, view_dtype, storage.location)
        alias = (id(self), storage, offset, size, stride, view_dtype)
        order = storage_order(size, stride) if plain and not direct else None
        if order is not None:  # saved transposed: its blocks read as such, never mapped
            box = permuted_reader(size, view_dtype, order, read_at)
            whole = (0,) * len(size)
            return TensorRef(meta, read, lambda out: box(whole, out), alias_key=alias,
                             read_box=box)
        return TensorRef(meta, read, read_into if direct else None, alias_key=alias,
                         span=span if direct else None,
                         read_box=box_reader(size, view_dtype, read_at) if direct else None)
