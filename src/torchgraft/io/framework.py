"""What the other frameworks' readers share: tensors re-laid lazily, names renamed by tables.

Keras, Flax, GGUF, ONNX and MLX files store what PyTorch calls the same weight under other
names and in other axis orders (a Dense kernel is ``[in, out]``, a convolution ``HWIO``). Their
readers present each tensor as PyTorch lays it out, under PyTorch's leaf names, so grafting,
converting and inspecting need nothing framework-specific. What each framework does is data:
:class:`Leaf` tables in the reader modules; the re-laying happens here, on read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from types import ModuleType

import torch

from ..errors import CorruptCheckpointError, MissingDependencyError
from ..meta import TensorMeta, TensorRef

__all__ = ["ATTENTION_PROJECTIONS", "LAYOUT_OPS", "Leaf", "import_optional",
           "record_head_dim", "relaid", "torch_layout"]


def import_optional(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import an optional dependency, or raise an error that says how to install it.

    Args:
        module: The module (``"h5py"``).
        extra: The torchgraft extra that installs it.
        feature: What needs it, for the message (``"Reading Keras .h5 files"``).

    Returns:
        The module.

    Raises:
        MissingDependencyError: If it is not installed.
    """
    try:
        return import_module(module)
    except ImportError:
        raise MissingDependencyError(module, extra=extra, feature=feature) from None


_Relay = Callable[[torch.Tensor], torch.Tensor]
_Op = tuple[tuple[int, ...], _Relay]


def _transpose(shape: tuple[int, ...]) -> _Op:
    return shape[::-1], lambda t: t.t()


def _channels_last_kernel(shape: tuple[int, ...]) -> _Op:
    """``[*spatial, in, out]`` (Keras/Flax ``HWIO``) to ``[out, in, *spatial]`` (``OIHW``).

    A transposed convolution's kernel is ``[*spatial, out, in]`` there and ``[in, out,
    *spatial]`` in PyTorch: the same permutation.
    """
    n = len(shape)
    perm = (n - 1, n - 2, *range(n - 2))
    return tuple(shape[p] for p in perm), lambda t: t.permute(perm)


def _depthwise_kernel(shape: tuple[int, ...]) -> _Op:
    """Keras ``[kh, kw, channels, m]`` to PyTorch's grouped ``[channels * m, 1, kh, kw]``."""
    *spatial, channels, multiplier = shape
    n = len(shape)
    perm = (n - 2, n - 1, *range(n - 2))
    return ((channels * multiplier, 1, *spatial),
            lambda t: t.permute(perm).reshape(channels * multiplier, 1, *spatial))


def _heads_in(shape: tuple[int, ...]) -> _Op:
    """An attention projection ``[hidden, heads, dim]`` to a Linear ``[heads * dim, hidden]``."""
    hidden, rest = shape[0], math.prod(shape[1:])
    return (rest, hidden), lambda t: t.reshape(hidden, rest).t()


def _heads_out(shape: tuple[int, ...]) -> _Op:
    """An attention output ``[heads, dim, hidden]`` to a Linear ``[hidden, heads * dim]``."""
    rest, hidden = math.prod(shape[:-1]), shape[-1]
    return (hidden, rest), lambda t: t.reshape(rest, hidden).t()


def _flatten(shape: tuple[int, ...]) -> _Op:
    """A per-head bias ``[heads, dim]`` to ``[heads * dim]``."""
    size = math.prod(shape)
    return (size,), lambda t: t.reshape(size)


#: Layout operations by name: a stored shape to PyTorch's shape and the function re-laying it.
LAYOUT_OPS: dict[str, Callable[[tuple[int, ...]], tuple[tuple[int, ...], _Relay]]] = {
    "transpose": _transpose,
    "channels_last_kernel": _channels_last_kernel,
    "depthwise_kernel": _depthwise_kernel,
    "heads_in": _heads_in,
    "heads_out": _heads_out,
    "flatten": _flatten,
}


@dataclass(frozen=True)
class Leaf:
    """One framework's name for a weight, PyTorch's name for it, and how it is re-laid.

    Attributes:
        name: The framework's leaf name (``"kernel"``, ``"gamma"``, ``"moving_mean"``).
        torch_name: PyTorch's leaf name (``"weight"``, ``"running_mean"``).
        ops: Layout operation (:data:`LAYOUT_OPS`) by the stored tensor's number of
            dimensions; a number of dimensions not listed is kept as stored.
        parent: Only under a module whose own name matches this pattern (``"query"`` for
            attention projections), and only for the numbers of dimensions in ``ops``; ``None``
            for any module.
    """

    name: str
    torch_name: str
    ops: tuple[tuple[int, str], ...] = ()
    parent: str | None = None

    def op_for(self, ndim: int) -> str | None:
        """The layout operation for a tensor of ``ndim`` dimensions, if any."""
        return dict(self.ops).get(ndim)


def torch_layout(leaves: Sequence[Leaf], parent: str, leaf: str,
                 ndim: int) -> tuple[str, str | None] | None:
    """PyTorch's leaf name and the layout operation for a framework leaf, from a table.

    Args:
        leaves: The framework's table; the first entry that fits wins.
        parent: The owning module's own name (last part of its path).
        leaf: The framework's leaf name.
        ndim: The stored tensor's number of dimensions.

    Returns:
        The name and operation, or ``None`` when the table has no entry (kept as stored).
    """
    for entry in leaves:
        if entry.name != leaf or (entry.parent is not None
                                  and not re.fullmatch(entry.parent, parent)):
            continue
        if entry.parent is None or entry.op_for(ndim) is not None:
            return entry.torch_name, entry.op_for(ndim)
    return None


#: Attention projections whose kernels are ``[hidden, heads, head_dim]`` (Keras, Flax).
ATTENTION_PROJECTIONS = r"query|key|value"


def record_head_dim(head_dims: dict[str, int], module: tuple[str, ...], leaf: str,
                    shape: tuple[int, ...]) -> None:
    """Note the head size a ``[hidden, heads, head_dim]`` query/key/value kernel states.

    Args:
        head_dims: Attention module path to head size, filled in.
        module: The kernel's module path (``("attn", "query")``).
        leaf: Its leaf name.
        shape: Its stored shape.
    """
    if (leaf == "kernel" and len(shape) == 3 and module
            and re.fullmatch(ATTENTION_PROJECTIONS, module[-1])):
        head_dims[".".join(module[:-1])] = shape[2]


def relaid(ref: TensorRef, op: str | None, *, name: str, path: str) -> TensorRef:
    """A lazy tensor giving ``ref``'s data in PyTorch's layout.

    Args:
        ref: The tensor as stored.
        op: A :data:`LAYOUT_OPS` name, or ``None`` to keep it.
        name: Its name, for errors.
        path: The file, for errors.

    Returns:
        The re-laid lazy tensor (``ref`` itself when ``op`` is ``None``).

    Raises:
        CorruptCheckpointError: If the stored shape does not fit the operation.
    """
    if op is None:
        return ref
    stored = ref.meta.shape
    minimum = 1 if op == "flatten" else 2
    if len(stored) < minimum:
        raise CorruptCheckpointError(f"'{name}' has shape {stored}, which a {op} cannot re-lay",
                                     path=path)
    shape, apply = LAYOUT_OPS[op](stored)

    def stored_copy() -> torch.Tensor:
        # Read into a buffer of this process (not a view of the file's mapping, whose pages
        # would stay resident): one tensor's bytes at a time.
        buffer = torch.empty(stored, dtype=ref.meta.dtype)
        ref.read_into(buffer)
        return buffer

    def read() -> torch.Tensor:
        return apply(stored_copy()).contiguous()

    def read_into(out: torch.Tensor) -> None:
        out.copy_(apply(stored_copy()))

    return TensorRef(TensorMeta.of(shape, ref.meta.dtype), read, read_into)
