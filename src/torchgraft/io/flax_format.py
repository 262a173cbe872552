"""Flax ``msgpack`` checkpoints, read without JAX, Flax or the ``msgpack`` package.

``flax.serialization.to_bytes`` writes them, and transformers' ``flax_model.msgpack``.

Flax writes the variables' tree as msgpack maps, each array as an extension (code 1) holding a
msgpack ``(shape, dtype name, bytes)``; arrays over 1 GiB are split into a
``__msgpack_chunked_array__`` map of flat chunks. The parser here walks the tree at most
:data:`~torchgraft.bounds.MAX_NESTING` deep, checks every length against the bytes left, and
only locates array bytes: they are memory-mapped on read. Every later walk of the leaves is
linear in their number.

Names and layouts become PyTorch's by a table (:data:`LEAVES`): Dense ``kernel [in, out]``,
Conv ``kernel HWIO``, ``scale``/``bias`` norms, ``embedding``, BatchNorm ``mean``/``var`` (in
``batch_stats``), attention kernels ``[hidden, heads, dim]``. The collection names
(``params``, ``batch_stats``) are dropped so that a module's parameters and statistics meet.
Layers stacked by ``nn.scan`` (every leaf with a leading layer axis, norms and biases one
dimension more than a layer has) are unstacked into numbered modules.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..bounds import check_nesting
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..meta import TensorMeta, TensorRef, torch_dtype_of_numpy
from .base import Contents, Format, ReadOptions
from .framework import ATTENTION_PROJECTIONS, Leaf, record_head_dim, relaid, torch_layout
from .source import FileSource, FileTensor

__all__ = ["FORMAT", "LEAVES", "flax_key", "flax_tree"]

_MAX_NODES = 10_000_000
_NDARRAY, _NPSCALAR = 1, 3
_CHUNKED = "__msgpack_chunked_array__"
_COLLECTIONS = ("params", "batch_stats")

_CONV = "channels_last_kernel"
#: Flax leaf names to PyTorch's, with layout operations by number of dimensions.
LEAVES = (
    Leaf("kernel", "weight", ((3, "heads_in"),), parent=ATTENTION_PROJECTIONS),
    Leaf("kernel", "weight", ((3, "heads_out"),), parent=r"out"),
    Leaf("bias", "bias", ((2, "flatten"),), parent=ATTENTION_PROJECTIONS),
    Leaf("kernel", "weight", ((2, "transpose"), (3, _CONV), (4, _CONV), (5, _CONV))),
    Leaf("bias", "bias"), Leaf("scale", "weight"), Leaf("embedding", "weight"),
    Leaf("mean", "running_mean"), Leaf("var", "running_var"),
)
#: Leaves whose normal (unstacked) form has one dimension, outside attention projections.
_VECTOR_LEAVES = ("bias", "scale", "mean", "var")

# msgpack type bytes: fixed-size scalars (struct code), and headers with a length.
_SCALARS = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
            0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
_LENGTHS = {0xC4: ("bin", ">B"), 0xC5: ("bin", ">H"), 0xC6: ("bin", ">I"),
            0xD9: ("str", ">B"), 0xDA: ("str", ">H"), 0xDB: ("str", ">I"),
            0xDC: ("array", ">H"), 0xDD: ("array", ">I"),
            0xDE: ("map", ">H"), 0xDF: ("map", ">I"),
            0xC7: ("ext", ">B"), 0xC8: ("ext", ">H"), 0xC9: ("ext", ">I")}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


@dataclass(frozen=True)
class _Bytes:
    """A msgpack ``bin`` value, located and not read."""

    offset: int
    length: int


@dataclass(frozen=True)
class _Array:
    """A Flax array: its shape, numpy dtype name, and where its bytes are."""

    shape: tuple[int, ...]
    dtype: str
    data: _Bytes


class _Parser:
    """A bounded msgpack parser over a file: nesting, counts and lengths checked first."""

    def __init__(self, source: FileSource, start: int, end: int) -> None:
        self.source, self.pos, self.end = source, start, end
        self.nodes = 0

    def _take(self, n: int, what: str) -> bytes:
        if n > self.end - self.pos:
            raise CorruptCheckpointError(f"{what} needs {n} bytes at byte {self.pos}, past the "
                                         f"end at {self.end}", path=self.source.name)
        data = self.source.read(self.pos, n, what=what)
        self.pos += n
        return data

    def _unpack(self, code: str, what: str) -> Any:
        return struct.unpack(code, self._take(struct.calcsize(code), what))[0]

    def value(self, depth: int = 0) -> Any:
        self.nodes += 1
        check_nesting(depth, what="msgpack maps and arrays", path=self.source.name)
        if self.nodes > _MAX_NODES:
            raise CorruptCheckpointError(f"the msgpack tree holds more than {_MAX_NODES} values",
                                         path=self.source.name)
        first = self._take(1, "a msgpack value")[0]
        if first <= 0x7F or first >= 0xE0:
            return first if first <= 0x7F else first - 0x100
        if 0x80 <= first <= 0x8F:
            return self._map(first & 0x0F, depth)
        if 0x90 <= first <= 0x9F:
            return self._array(first & 0x0F, depth)
        if 0xA0 <= first <= 0xBF:
            return self._str(first & 0x1F)
        if first in (0xC0, 0xC2, 0xC3):
            return {0xC0: None, 0xC2: False, 0xC3: True}[first]
        if first in _SCALARS:
            return self._unpack(_SCALARS[first], "a msgpack number")
        if first in _FIXEXT:
            return self._ext(_FIXEXT[first], depth)
        if first not in _LENGTHS:
            raise CorruptCheckpointError(f"byte 0x{first:02x} at {self.pos - 1} is not msgpack",
                                         path=self.source.name)
        kind, code = _LENGTHS[first]
        length = self._unpack(code, f"a msgpack {kind} length")
        if kind == "bin":
            return self._bin(length)
        if kind == "str":
            return self._str(length)
        if kind == "array":
            return self._array(length, depth)
        if kind == "map":
            return self._map(length, depth)
        return self._ext(length, depth)

    def _count(self, count: int, per_item: int, what: str) -> int:
        if count * per_item > self.end - self.pos:
            raise CorruptCheckpointError(f"a msgpack {what} claims {count} items, more than the "
                                         "bytes left", path=self.source.name)
        return count

    def _bin(self, length: int) -> _Bytes:
        self._count(length, 1, "bin")
        located = _Bytes(self.pos, length)
        self.pos += length
        return located

    def _str(self, length: int) -> str:
        try:
            return self._take(length, "a msgpack string").decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError("a msgpack string is not UTF-8",
                                         path=self.source.name) from None

    def _array(self, count: int, depth: int) -> list[Any]:
        return [self.value(depth + 1) for _ in range(self._count(count, 1, "array"))]

    def _map(self, count: int, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in range(self._count(count, 2, "map")):
            key = self.value(depth + 1)
            if not isinstance(key, (str, int)):
                raise CorruptCheckpointError("a msgpack map key is not a string",
                                             path=self.source.name)
            out[str(key)] = self.value(depth + 1)
        return out

    def _ext(self, length: int, depth: int) -> Any:
        code = self._unpack(">b", "a msgpack extension type")
        self._count(length, 1, "extension")
        end, self.end = self.end, self.pos + length
        try:
            if code not in (_NDARRAY, _NPSCALAR):
                raise UnsupportedCheckpointError(
                    f"msgpack extension type {code} (complex numbers...) is not read",
                    path=self.source.name)
            item = self.value(depth + 1)
            if self.pos != self.end:
                raise CorruptCheckpointError("an array record has bytes after its data",
                                             path=self.source.name)
        finally:
            self.end = end
        if (not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], list)
                or not all(isinstance(d, int) and d >= 0 for d in item[0])
                or not isinstance(item[1], (str, _Bytes)) or not isinstance(item[2], _Bytes)):
            raise CorruptCheckpointError("an array record is not (shape, dtype, bytes)",
                                         path=self.source.name)
        dtype = item[1] if isinstance(item[1], str) else self.source.read(
            item[1].offset, min(item[1].length, 32), what="a dtype name").decode("ascii",
                                                                                 "replace")
        return _Array(tuple(item[0]), dtype, item[2])


def _numpy_dtype(name: str, where: str, path: str) -> tuple[np.dtype[Any] | None, torch.dtype]:
    if name == "bfloat16":
        return None, torch.bfloat16
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise UnsupportedCheckpointError(f"'{where}' has dtype {name!r}, not read", path=path)\
            from None
    torch_dtype = torch_dtype_of_numpy(dtype)
    if torch_dtype is None or dtype.hasobject:
        raise UnsupportedCheckpointError(f"'{where}' has dtype {name}, which torch lacks",
                                         path=path)
    return dtype, torch_dtype


def _array_ref(source: FileSource, array: _Array, where: str, *, layer: int | None = None,
               ) -> TensorRef:
    """A lazy tensor over an array's bytes; ``layer`` picks one slice of a stacked array."""
    _, dtype = _numpy_dtype(array.dtype, where, source.name)
    full = TensorMeta.of(array.shape, dtype)
    if full.nbytes != array.data.length:
        raise CorruptCheckpointError(f"'{where}' says {array.dtype} {array.shape} "
                                     f"({full.nbytes} bytes) but holds {array.data.length}",
                                     path=source.name)
    shape, offset = array.shape, array.data.offset
    if layer is not None:
        shape = array.shape[1:]
        offset += layer * math.prod(shape) * dtype.itemsize
    return FileTensor(source, offset, TensorMeta.of(shape, dtype), what=f"'{where}'")


def _chunked_ref(source: FileSource, node: dict[str, Any], where: str) -> TensorRef:
    shape_map, chunks = node.get("shape"), node.get("chunks")
    if not isinstance(shape_map, dict) or not isinstance(chunks, dict):
        raise CorruptCheckpointError(f"chunked array '{where}' lacks shape or chunks",
                                     path=source.name)
    dims = [shape_map.get(str(i)) for i in range(len(shape_map))]
    parts = [chunks.get(str(i)) for i in range(len(chunks))]
    shape = tuple(d for d in dims if isinstance(d, int) and d >= 0)
    arrays = [p for p in parts if isinstance(p, _Array)]
    if (len(shape) != len(dims) or not arrays or len(arrays) != len(parts)
            or len({a.dtype for a in arrays}) != 1):
        raise CorruptCheckpointError(f"chunked array '{where}' is malformed", path=source.name)
    refs = [_array_ref(source, p, f"{where}[{i}]") for i, p in enumerate(arrays)]
    meta = TensorMeta.of(shape, refs[0].meta.dtype)
    if sum(r.meta.numel for r in refs) != meta.numel:
        raise CorruptCheckpointError(f"chunked array '{where}' holds another number of values "
                                     f"than its shape {meta.shape}", path=source.name)

    def read() -> torch.Tensor:
        return torch.cat([r.read().reshape(-1) for r in refs]).view(meta.shape)

    return TensorRef(meta, read)


def _leaves(node: Any, path: tuple[str, ...], out: dict[tuple[str, ...], Any]) -> None:
    if isinstance(node, dict) and _CHUNKED not in node:
        for key, value in node.items():
            _leaves(value, (*path, key), out)
    elif isinstance(node, (_Array, dict)):
        out[path] = node


def _leading_sizes(leaves: dict[tuple[str, ...], TensorRef]) -> dict[tuple[str, ...], int]:
    """Each module path to the leading size every leaf under it shares (absent: none shared).

    One pass over the leaves, each counted at each of its ancestors (as deep as the tree
    nests: at most :data:`~torchgraft.bounds.MAX_NESTING`).
    """
    shared: dict[tuple[str, ...], int | None] = {}
    for path, ref in leaves.items():
        lead = ref.meta.shape[0] if ref.meta.shape else None
        for cut in range(1, len(path) + 1):
            root = path[:cut]
            if root not in shared:
                shared[root] = lead
            elif shared[root] != lead:
                shared[root] = None
    return {root: size for root, size in shared.items() if size is not None}


def _stacked_roots(leaves: dict[tuple[str, ...], TensorRef]) -> dict[tuple[str, ...], int]:
    """Module paths holding ``nn.scan``-stacked layers, with their number of layers.

    A subtree is stacked when one of its vector leaves (a norm's scale, a bias, outside
    attention projections) has two dimensions, and every leaf under the subtree's top
    shares that leading size.
    """
    leading = _leading_sizes(leaves)
    stacked: dict[tuple[str, ...], int] = {}
    for path, ref in leaves.items():
        parent = path[-2] if len(path) > 1 else ""
        if path[-1] not in _VECTOR_LEAVES or len(ref.meta.shape) != 2 or (
                path[-1] == "bias" and parent in ATTENTION_PROJECTIONS.split("|")):
            continue
        layers = ref.meta.shape[0]
        for cut in range(1, len(path) - 1):
            if leading.get(path[:cut]) == layers:
                stacked.setdefault(path[:cut], layers)
                break
    return stacked


def _stacked_cut(key: tuple[str, ...], stacked: dict[tuple[str, ...], int]) -> int:
    """How many parts of ``key`` name the stacked root it lies under (0: none)."""
    return next((cut for cut in range(1, len(key) + 1) if key[:cut] in stacked), 0)


def flax_key(key: tuple[str, ...]) -> tuple[str, ...]:
    """A Flax leaf's module path and leaf name, without what only Flax's containers add.

    The collection (``params``, ``batch_stats``) goes, so that a module's parameters and
    statistics meet; so does the ``value`` under which Flax NNX states keep each variable.

    Args:
        key: The leaf's path in the saved tree.

    Returns:
        The path as :func:`flax_tree` takes it.
    """
    if len(key) > 1 and key[-1] == "value":
        key = key[:-1]
    return key[1:] if len(key) > 1 and key[0] in _COLLECTIONS else key


def flax_tree(stored: dict[tuple[str, ...], TensorRef],
              layer: Callable[[tuple[str, ...], int], TensorRef | None], path: Path, *,
              framework: str) -> dict[str, Any]:
    """Flax leaves as a PyTorch state dict: renamed, re-laid, ``nn.scan`` stacks unstacked.

    Args:
        stored: Leaf path (after :func:`flax_key`) to the array as stored.
        layer: Gives one layer's slice of a stacked leaf (``None`` where it cannot be cut; the
            leaf then stays stacked).
        path: The checkpoint, for errors.
        framework: The framework named in ``__metadata__``.

    Returns:
        The contents' root: PyTorch names to lazy tensors, and ``__metadata__``.

    Raises:
        CorruptCheckpointError: If two leaves get the same name.
    """
    stacked = _stacked_roots(stored)
    head_dims: dict[str, int] = {}
    for key, ref in stored.items():
        shape = ref.meta.shape[1:] if _stacked_cut(key, stacked) else ref.meta.shape
        record_head_dim(head_dims, key[:-1], key[-1], shape)
    root: dict[str, Any] = {}
    for key, ref in sorted(stored.items(), key=lambda item: _order(item[0])):
        cut = _stacked_cut(key, stacked)
        layers = stacked.get(key[:cut], 0) if cut else 0
        parts = [p for p in (layer(key, index) for index in range(layers)) if p is not None]
        if layers and len(parts) == layers:
            for index, part in enumerate(parts):
                _add(root, (*key[:cut], str(index), *key[cut:]), part, path)
        else:
            _add(root, key, ref, path)
    root["__metadata__"] = {
        "framework": framework,
        "layout": "Flax names and layouts re-laid as PyTorch's (kernels transposed, HWIO to "
                  "OIHW, scale/embedding/mean/var renamed)",
        "scan_stacked": {".".join(k): n for k, n in stacked.items()},
        "head_dims": head_dims,
    }
    return root


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    parser = _Parser(source, 0, source.size)
    tree = parser.value()
    if parser.pos != source.size:
        raise CorruptCheckpointError(f"{source.size - parser.pos} bytes follow the msgpack tree",
                                     path=path)
    if not isinstance(tree, dict):
        raise CorruptCheckpointError("the msgpack file does not hold a tree of arrays",
                                     path=path)
    found: dict[tuple[str, ...], Any] = {}
    _leaves(tree, (), found)
    stored: dict[tuple[str, ...], TensorRef] = {}
    arrays: dict[tuple[str, ...], _Array] = {}
    for key, node in found.items():
        trimmed = flax_key(key)
        where = ".".join(key)
        if trimmed in stored:
            raise CorruptCheckpointError(f"'{where}' collides with another collection's leaf",
                                         path=path)
        if isinstance(node, _Array):
            arrays[trimmed] = node
            stored[trimmed] = _array_ref(source, node, where)
        else:
            stored[trimmed] = _chunked_ref(source, node, where)

    def layer(key: tuple[str, ...], index: int) -> TensorRef | None:
        if key not in arrays:
            return None
        return _array_ref(source, arrays[key], ".".join(key), layer=index)

    return Contents("flax", path, flax_tree(stored, layer, path, framework="flax"),
                    [source.close])


#: Flax writes maps sorted by key; modules are put back in an order of use where the names
#: tell it: attention projections as used, a module's leaves as PyTorch lists them.
_CHILD_RANK = {"query": 0, "key": 1, "value": 2, "out": 3}
_LEAF_RANK = {"kernel": 0, "embedding": 0, "scale": 0, "bias": 1, "mean": 2, "var": 3}


def _order(key: tuple[str, ...]) -> tuple[Any, ...]:
    parts = [(_CHILD_RANK.get(p, -1), *(int(t) if t.isdigit() else t
                                         for t in re.split(r"(\d+)", p))) for p in key[:-1]]
    return (*parts, (_LEAF_RANK.get(key[-1], 9), key[-1]))


def _add(root: dict[str, Any], key: tuple[str, ...], ref: TensorRef, path: Path) -> None:
    parent = key[-2] if len(key) > 1 else ""
    found = torch_layout(LEAVES, parent, key[-1], len(ref.meta.shape))
    leaf, op = found if found is not None else (key[-1], None)
    name = ".".join((*key[:-1], leaf))
    if name in root:
        raise CorruptCheckpointError(f"two arrays are named '{name}'", path=path)
    root[name] = relaid(ref, op, name=".".join(key), path=str(path))


def _magic(head: bytes) -> bool:
    """A map whose first key is a string, holding a map or an array extension."""
    if not head or not (0x81 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return False
    key = 1 if head[0] < 0x90 else 3 if head[0] == 0xDE else 5  # map16/32: after the count
    return key < len(head) and 0xA1 <= head[key] <= 0xBF


FORMAT = Format(name="flax", open=_open, suffixes=(".msgpack",), magic=_magic)
