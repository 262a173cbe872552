"""Tensor metadata, and lazy references to tensors that have not been read yet."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .dtype_names import ALIASES, CASTS
from .errors import TorchgraftError

__all__ = ["TensorMeta", "TensorRef", "dtype_name", "parse_dtype", "torch_dtype_of_numpy"]


def dtype_name(dtype: torch.dtype) -> str:
    """Return the short name of a torch dtype, e.g. ``"float32"``.

    Args:
        dtype: A torch dtype.

    Returns:
        The name without the ``torch.`` prefix.
    """
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Turn ``"float16"``, ``"fp16"``, ``"bf16"`` or ``"torch.bfloat16"`` into a torch dtype.

    Args:
        name: A dtype name or a torch dtype.

    Returns:
        The torch dtype.

    Raises:
        TorchgraftError: If the name is not a torch dtype.
    """
    if isinstance(name, torch.dtype):
        return name
    key = str(name).removeprefix("torch.")
    value = getattr(torch, ALIASES.get(key, key), None)
    if not isinstance(value, torch.dtype):
        raise TorchgraftError(f"dtype={name!r} is not a torch dtype: use one of "
                              f"{', '.join(CASTS)}")
    return value


def torch_dtype_of_numpy(dtype: np.dtype[Any]) -> torch.dtype | None:
    """Return the torch dtype matching a numpy dtype of any byte order, or ``None``.

    Args:
        dtype: A numpy dtype.

    Returns:
        The torch dtype, or ``None`` where torch has no such type (strings, objects...).
    """
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype.newbyteorder("="))).dtype
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class TensorMeta:
    """What is known about a stored tensor without reading its bytes.

    Attributes:
        shape: The tensor's shape.
        dtype: The tensor's dtype.
        nbytes: The size of its data in bytes.
        device: Where the tensor lived when it was saved, e.g. ``"cuda:1"``.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    device: str = "cpu"

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> TensorMeta:
        """Build the metadata of a dense tensor, computing its size.

        Args:
            shape: The tensor's shape.
            dtype: The tensor's dtype.
            device: Where it was saved.

        Returns:
            The metadata.
        """
        shape = tuple(int(d) for d in shape)
        itemsize = dtype.itemsize
        return cls(shape, dtype, math.prod(shape) * itemsize, device)

    @property
    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        """Return the metadata as JSON-ready data."""
        return {"shape": list(self.shape), "dtype": dtype_name(self.dtype),
                "nbytes": self.nbytes, "device": self.device}

    def describe(self) -> str:
        """Return a short text such as ``tensor(float32, (64, 3, 7, 7))``."""
        return f"tensor({dtype_name(self.dtype)}, {self.shape})"


class TensorRef:
    """A tensor in a checkpoint, known by its metadata and read only when asked.

    Args:
        meta: The tensor's metadata.
        read: A function returning the tensor on the CPU; it may be memory-mapped.
        read_into: A function filling a contiguous CPU tensor of :attr:`meta`'s shape and dtype
            straight from the file, without an intermediate copy; ``None`` if the format
            cannot.
        span: Where the tensor's bytes lie in a file, contiguous and exactly as stored: a
            function giving ``(path, offset)`` (it may read a zip header), or ``None``. Writers
            copy such tensors file to file without reading them into memory.
        read_box: A function filling a contiguous CPU tensor of :attr:`meta`'s dtype with the
            block of the tensor that starts at the given index and has the tensor's shape,
            reading only that block's bytes (:func:`torchgraft.io.boxes.box_reader`); ``None``
            if the format cannot, and the whole tensor is read and cut.

    A subclass of which 100k are made may define ``read``, ``_read_into``, ``_read_box`` and
    ``span`` as methods instead of holding functions (one object per tensor, not five): its
    methods stand in for the slots of the same names, it sets :attr:`meta` and
    :attr:`alias_key` itself and does not call this ``__init__``
    (:class:`~torchgraft.io.source.FileTensor`).
    """

    __slots__ = ("_read", "_read_box", "_read_into", "alias_key", "meta", "span")

    def __init__(self, meta: TensorMeta, read: Callable[[], torch.Tensor],
                 read_into: Callable[[torch.Tensor], None] | None = None, *,
                 alias_key: Hashable | None = None,
                 span: Callable[[], tuple[str, int]] | None = None,
                 read_box: Callable[[tuple[int, ...], torch.Tensor], None] | None = None) -> None:
        self.meta = meta
        self._read = read
        self._read_into = read_into
        self._read_box = read_box
        self.span = span
        #: Equal for references to the very same data (tied weights); by default a reference
        #: is only its own alias.
        self.alias_key: Hashable = alias_key if alias_key is not None else ("ref", id(self))

    def read(self) -> torch.Tensor:
        """Read the tensor's data.

        Returns:
            A CPU tensor with the shape and dtype of :attr:`meta`.
        """
        return self._read()

    def read_into(self, out: torch.Tensor) -> None:
        """Copy the tensor's data into ``out``, which has its shape (any dtype or device).

        A contiguous CPU ``out`` of the same dtype is filled straight from the file where the
        format allows, so no other memory holds the data.

        Args:
            out: The destination, e.g. a model parameter.
        """
        direct = (self._read_into is not None and out.device.type == "cpu"
                  and out.dtype == self.meta.dtype and out.is_contiguous())
        if direct and self._read_into is not None:
            self._read_into(out)
        else:
            out.copy_(self.read())

    def read_box(self, start: tuple[int, ...], out: torch.Tensor) -> None:
        """Copy the block of the tensor at index ``start``, of ``out``'s shape, into ``out``.

        Where the format allows, only the block's bytes are read: a rank
        filling its shard of a sharded model reads its rows, not the whole tensor.

        Args:
            start: The block's first index in each dimension.
            out: The destination (any dtype or device); its shape is the block's.

        Raises:
            ValueError: If the block does not lie inside the tensor.
        """
        shape = self.meta.shape
        if len(start) != len(shape) or out.dim() != len(shape) or any(
                s < 0 or n < 0 or s + n > d for s, n, d in zip(start, out.shape, shape,
                                                              strict=True)):
            raise ValueError(f"block at {tuple(start)} of shape {tuple(out.shape)} does not lie "
                             f"inside a {shape} tensor")
        if self._read_box is None:
            block = self.read()
            for dim, (first, length) in enumerate(zip(start, out.shape, strict=True)):
                block = block.narrow(dim, first, length)
            out.copy_(block)
        elif out.device.type == "cpu" and out.dtype == self.meta.dtype and out.is_contiguous():
            self._read_box(tuple(start), out)
        else:
            staged = torch.empty(out.shape, dtype=self.meta.dtype)
            self._read_box(tuple(start), staged)
            out.copy_(staged)

    def __repr__(self) -> str:
        return f"TensorRef({self.meta.describe()}, saved on {self.meta.device})"
