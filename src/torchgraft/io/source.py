"""Byte sources that formats read tensor data from: a memory-mapped file, or bytes in memory."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO, cast

import torch

from ..bounds import check_view
from ..errors import CorruptCheckpointError, TorchgraftError
from ..meta import TensorMeta, TensorRef
from .boxes import box_reader
from .contain import open_regular

__all__ = ["ByteSource", "FileSource", "FileTensor", "MemorySource", "check_view",
           "contiguous_strides", "file_named", "released_on_failure", "strided"]

#: The file sources opened inside the innermost :func:`released_on_failure` block.
_OPENED: ContextVar[list[FileSource] | None] = ContextVar("torchgraft_opened", default=None)


@contextmanager
def released_on_failure() -> Iterator[None]:
    """Close every :class:`FileSource` opened in the block if the block fails.

    :func:`~torchgraft.io.registry.open_contents` runs each format's opener in one: a reader
    that raises on a refused file keeps no descriptor, whether or not it closes its sources
    itself. Sources opened in a block that succeeds count as opened in the enclosing block
    (a shard opened by an index that is then refused is closed too).

    Yields:
        Nothing.
    """
    opened: list[FileSource] = []
    token = _OPENED.set(opened)
    try:
        yield
    except BaseException:
        for source in opened:
            source.close()
        raise
    finally:
        _OPENED.reset(token)
    outer = _OPENED.get()
    if outer is not None:
        outer.extend(opened)


class ByteSource:
    """Random access to the bytes of a checkpoint.

    Args:
        name: What to call the source in errors (usually the file path).
        size: The number of bytes available.
    """

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size

    def check_range(self, offset: int, nbytes: int, *, what: str) -> None:
        """Raise if ``[offset, offset + nbytes)`` is not inside the source.

        Args:
            offset: First byte.
            nbytes: Number of bytes.
            what: What is stored there, for the error message.

        Raises:
            CorruptCheckpointError: If the range does not fit: the file is truncated or lies.
        """
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise CorruptCheckpointError(
                f"{what} needs bytes {offset}..{offset + nbytes} but the file has {self.size}: "
                "it is truncated or its index is wrong", path=self.name)

    def read(self, offset: int, nbytes: int, *, what: str = "data") -> bytes:
        """Read bytes, checking the range first."""
        raise NotImplementedError

    def _raw(self, offset: int, nbytes: int) -> torch.Tensor:
        """Return ``nbytes`` from ``offset`` as a 1-D uint8 tensor (range already checked)."""
        raise NotImplementedError

    def _mapped(self, offset: int, nbytes: int, dtype: torch.dtype,
                shape: tuple[int, ...]) -> torch.Tensor | None:
        """The bytes as a contiguous tensor in one step, where the source maps them aligned."""
        return None

    def array(self, offset: int, nbytes: int, dtype: torch.dtype, *, what: str = "data",
              shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Return the bytes at ``offset`` as a tensor of ``dtype``, flat or of ``shape``.

        Memory-mapped where the offset is aligned to the element size, else copied.

        Args:
            offset: First byte.
            nbytes: Number of bytes, a multiple of the element size.
            dtype: Element type.
            what: What is stored there, for error messages.
            shape: The tensor's shape (``nbytes`` of ``dtype``), if not flat.

        Returns:
            A contiguous CPU tensor.
        """
        self.check_range(offset, nbytes, what=what)
        itemsize = dtype.itemsize
        if nbytes % itemsize:
            raise CorruptCheckpointError(
                f"{what} holds {nbytes} bytes, not a whole number of {dtype} elements",
                path=self.name)
        shape = (nbytes // itemsize,) if shape is None else shape
        if not nbytes:
            return torch.empty(shape, dtype=dtype, device="cpu")  # no bytes to map
        mapped = self._mapped(offset, nbytes, dtype, shape)
        if mapped is not None:
            return mapped
        raw = self._raw(offset, nbytes)
        if raw.data_ptr() % itemsize:  # misaligned in memory: copied, never viewed
            raw = raw.clone()
        return raw.view(dtype).view(shape)


#: Bytes read by one system call at most.
_CHUNK = 64 * 1024 * 1024


class FileSource(ByteSource):
    """A file on disk, held open by descriptor; memory-mapped privately on first use.

    The file is opened once, here: later reads and the mapping use that descriptor, so a file
    replaced or removed after opening is never read in its place. Use it in a ``with`` block,
    or call :meth:`close`.

    Args:
        path: The file.

    Raises:
        UnsupportedCheckpointError: If ``path`` is not a regular file.
    """

    def __init__(self, path: Path) -> None:
        fd = open_regular(path, what="checkpoint file")
        super().__init__(str(path), os.fstat(fd).st_size)
        self.path = path
        self._storage: torch.UntypedStorage | None = None
        self._fd: int | None = fd
        self._lock = threading.Lock()
        opening = _OPENED.get()
        if opening is not None:
            opening.append(self)

    @property
    def fd(self) -> int:
        """The open descriptor (raises once closed)."""
        if self._fd is None:
            raise TorchgraftError("the checkpoint was closed: read its tensors while it is "
                                  "open (inside its with block)", path=self.name)
        return self._fd

    def stream(self) -> IO[bytes]:
        """A buffered stream over the held descriptor, from its start.

        Closing the stream keeps the descriptor open.
        """
        stream = open(self.fd, "rb", closefd=False)  # noqa: SIM115
        stream.seek(0)
        return stream

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, offset: int, nbytes: int, *, what: str = "data") -> bytes:
        """Read bytes with a positioned read, checking the range first."""
        self.check_range(offset, nbytes, what=what)
        data = os.pread(self._descriptor(), nbytes, offset)
        if len(data) != nbytes:
            raise CorruptCheckpointError(f"{what} ends early: the file shrank while open",
                                         path=self.name)
        return data

    def read_into(self, offset: int, out: torch.Tensor, *, what: str = "data") -> None:
        """Copy bytes at ``offset`` straight into a contiguous CPU tensor's memory.

        Positioned reads (``preadv``) copy from the page cache into the tensor: one copy of
        the bytes, no mapping of the file (no page faults, nothing of the file resident in
        this process), and the GIL released, so several tensors read in parallel threads.

        Args:
            offset: First byte.
            out: The destination; its size in bytes is the number read.
            what: What is stored there, for error messages.

        Raises:
            CorruptCheckpointError: If the range is not inside the file.
        """
        nbytes = out.numel() * out.element_size()
        self.check_range(offset, nbytes, what=what)
        if nbytes == 0:
            return
        fd = self._descriptor()
        view = out.detach().reshape(-1).view(torch.uint8).numpy().data
        done = 0
        while done < nbytes:
            count = os.preadv(fd, [view[done:done + min(_CHUNK, nbytes - done)]], offset + done)
            if count <= 0:
                raise CorruptCheckpointError(f"{what} ends early: the file shrank while open",
                                             path=self.name)
            done += count

    def _descriptor(self) -> int:
        return self.fd

    def held_name(self) -> str:
        """A name that opens the held file itself, not whatever is at its path now.

        ``/proc/self/fd/N`` where the system has it (a tensor's byte range, ``span``, names
        it, so kernel copies and positioned reads open this file); raises once closed.
        """
        by_descriptor = f"/proc/self/fd/{self.fd}"
        return by_descriptor if os.path.exists(by_descriptor) else str(self.path)

    def place(self, offset: int) -> tuple[str, int]:
        """Where byte ``offset`` of this source lies: :meth:`held_name`, and the offset there.

        A range of a file (:class:`~torchgraft.io.window.Window`) gives the whole file's.
        """
        return self.held_name(), offset

    def _slice(self, offset: int, nbytes: int) -> torch.UntypedStorage:
        """A storage of its own viewing these bytes of the private mapping.

        As torch.load(mmap=True) gives each storage: a tensor saved later (torch.save,
        safetensors) holds its bytes, not the file.
        """
        storage = self._storage
        if storage is None:
            if os.fstat(self.fd).st_size < self.size:
                raise CorruptCheckpointError("the file shrank while open", path=self.name)
            storage = self._storage = cast(torch.UntypedStorage, torch.UntypedStorage.from_file(
                self.held_name(), shared=False, nbytes=self.size))
        return _SLICE(storage, slice(offset, offset + nbytes))

    def _raw(self, offset: int, nbytes: int) -> torch.Tensor:
        return _empty_cpu(torch.uint8).set_(self._slice(offset, nbytes), 0, (nbytes,), (1,))

    def _mapped(self, offset: int, nbytes: int, dtype: torch.dtype,
                shape: tuple[int, ...]) -> torch.Tensor | None:
        if offset % dtype.itemsize:  # the mapping starts on a page: this is the alignment
            return None
        # () strides: contiguous
        return _empty_cpu(dtype).set_(self._slice(offset, nbytes), 0, shape, ())

    def close(self) -> None:
        """Close the file and drop the mapping (tensors already read keep the mapping alive)."""
        self._storage = None
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


#: An empty CPU tensor per dtype: ``new()`` of one is a new empty tensor, on the CPU also under
#: ``torch.device("meta")``, at half the cost of ``torch.empty`` (100k tensors are mapped).
_EMPTY: dict[torch.dtype, torch.Tensor] = {}


def _empty_cpu(dtype: torch.dtype) -> torch.Tensor:
    """A new empty CPU tensor of ``dtype``, to set onto a storage."""
    proto = _EMPTY.get(dtype)
    if proto is None:
        proto = _EMPTY[dtype] = torch.empty(0, dtype=dtype, device="cpu")
    return proto.new()


def file_named(path: str) -> str:
    """The file a held name stands for (:meth:`FileSource.held_name`), to name it in messages.

    ``/proc/self/fd/N`` is this process's descriptor of a file: a message names the file it
    was opened as, not the descriptor.
    """
    if path.startswith("/proc/self/fd/"):
        try:
            return os.readlink(path).removesuffix(" (deleted)")
        except OSError:
            return path
    return path


#: torch's own storage slice, without ``UntypedStorage.__getitem__``'s Python check of the
#: device (a file mapping is on the CPU): tens of thousands of tensors are sliced at once.
_SLICE: Callable[[torch.UntypedStorage, slice], torch.UntypedStorage] = (
    torch._C.StorageBase.__dict__["__getitem__"])


class MemorySource(ByteSource):
    """Bytes held in memory, such as a chunk read out of a larger file.

    Args:
        data: The bytes.
        name: What to call them in errors.
    """

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(name, len(data))
        self.data = data

    def read(self, offset: int, nbytes: int, *, what: str = "data") -> bytes:
        """Return a slice of the bytes, checking the range first."""
        self.check_range(offset, nbytes, what=what)
        return self.data[offset:offset + nbytes]

    def _raw(self, offset: int, nbytes: int) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.data[offset:offset + nbytes]), dtype=torch.uint8)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in elements, of a C-contiguous tensor of ``shape``."""
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def strided(flat: torch.Tensor, shape: tuple[int, ...], stride: tuple[int, ...], offset: int, *,
            what: str, source: str) -> torch.Tensor:
    """View ``flat`` (a whole storage) as a tensor, checking it stays inside the storage.

    Args:
        flat: The storage as a 1-D tensor.
        shape: The tensor's shape.
        stride: The tensor's strides, in elements.
        offset: The tensor's offset in the storage, in elements.
        what: The tensor's name, for the error message.
        source: The file, for the error message.

    Returns:
        The tensor, sharing memory with ``flat``.

    Raises:
        CorruptCheckpointError: If the view reaches outside the storage.
    """
    check_view(shape, stride, offset, flat.numel(), what=what, source=source)
    if math.prod(shape) == 0:
        return flat.new_empty(shape)
    return flat.as_strided(shape, stride, flat.storage_offset() + offset)


class FileTensor(TensorRef):
    """A lazy tensor stored plainly (row-major, native order) at an offset of an open file.

    Reads go through the held file's checked reads: the whole tensor, straight into a
    destination (``read_into``), or one block of it (``read_box``, a sharded target's part).
    Its readers are methods (see :class:`~torchgraft.meta.TensorRef`): a checkpoint of 100k
    tensors makes one object per tensor on opening.

    Args:
        source: The open file.
        offset: Where the tensor's bytes start.
        meta: Its shape and dtype.
        what: Named in errors (e.g. ``"tensor 'fc.weight'"``).
    """

    __slots__ = ("_offset", "_source", "_what")

    def __init__(self, source: FileSource, offset: int, meta: TensorMeta, *,
                 what: str) -> None:
        # its readers are methods: not TensorRef.__init__ (see TensorRef)
        self.meta = meta
        self.alias_key = ("ref", id(self))
        self._source = source
        self._offset = offset
        self._what = what

    def read(self) -> torch.Tensor:
        """Read the tensor: a memory-mapped view of the file where aligned, else a copy."""
        meta = self.meta
        return self._source.array(self._offset, meta.nbytes, meta.dtype, what=self._what,
                                  shape=meta.shape)

    def _read_into(self, out: torch.Tensor) -> None:
        self._source.read_into(self._offset, out, what=self._what)

    def _read_at(self, start: int, out: torch.Tensor) -> None:
        self._source.read_into(self._offset + start, out, what=self._what)

    def _read_box(self, start: tuple[int, ...], out: torch.Tensor) -> None:
        box_reader(self.meta.shape, self.meta.dtype, self._read_at)(start, out)

    def span(self) -> tuple[str, int]:
        """Where the bytes lie: the held file's name and the offset there."""
        return self._source.place(self._offset)
