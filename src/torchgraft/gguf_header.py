"""GGUF's header read without torch: metadata, tensor infos and the plan of what they hold.

A GGUF file is a header, typed metadata, tensor infos, then aligned tensor data. This module
parses everything before the data section with plain bounded reads (each count, length and
offset checked against the file before it is read or allocated, nested arrays walked to a fixed
depth) and plans the tensors: llama.cpp's names renamed to transformers', each tensor's type,
shape, bytes and rotary head count, and the summary metadata. :mod:`torchgraft.io.gguf_format`
reads the data from that plan (with torch); ``torchgraft inspect`` needs the plan alone
(:mod:`torchgraft.quick_inspect`), so it lives here, outside the ``io`` package that imports
torch.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .errors import CorruptCheckpointError, UnsupportedCheckpointError

__all__ = ["GGML_TYPES", "MAGIC", "GgufPlan", "GgufTensor", "HeaderSource", "plain_metadata",
           "plan", "rename"]

MAGIC = b"GGUF"
_MAX_DEPTH = 3  # arrays of arrays of scalars at most
_MAX_DIMS = 8
_DEFAULT_ALIGNMENT = 32

#: GGML tensor types: id to (name, elements per block, bytes per block, torch's name of the
#: dtype when the bytes are plain values, else ``None``: dequantized to float32).
GGML_TYPES: dict[int, tuple[str, int, int, str | None]] = {
    0: ("F32", 1, 4, "float32"), 1: ("F16", 1, 2, "float16"),
    2: ("Q4_0", 32, 18, None), 3: ("Q4_1", 32, 20, None), 6: ("Q5_0", 32, 22, None),
    7: ("Q5_1", 32, 24, None), 8: ("Q8_0", 32, 34, None), 9: ("Q8_1", 32, 40, None),
    10: ("Q2_K", 256, 84, None), 11: ("Q3_K", 256, 110, None), 12: ("Q4_K", 256, 144, None),
    13: ("Q5_K", 256, 176, None), 14: ("Q6_K", 256, 210, None), 15: ("Q8_K", 256, 292, None),
    24: ("I8", 1, 1, "int8"), 25: ("I16", 1, 2, "int16"),
    26: ("I32", 1, 4, "int32"), 27: ("I64", 1, 8, "int64"),
    28: ("F64", 1, 8, "float64"), 30: ("BF16", 1, 2, "bfloat16"),
}

# Metadata value types: id to struct code (scalars); 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9

#: llama.cpp's tensor names to transformers', per layer (``blk.N.``) and global.
_NAMES = tuple((re.compile(p), r) for p, r in (
    (r"token_embd\.(weight)", r"model.embed_tokens.\1"),
    (r"output_norm\.(weight|bias)", r"model.norm.\1"),
    (r"output\.(weight|bias)", r"lm_head.\1"),
    (r"blk\.(\d+)\.attn_norm\.(weight|bias)", r"model.layers.\1.input_layernorm.\2"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", r"model.layers.\1.self_attn.q_proj.\2"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", r"model.layers.\1.self_attn.k_proj.\2"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", r"model.layers.\1.self_attn.v_proj.\2"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2"),
    (r"blk\.(\d+)\.attn_q_norm\.(weight)", r"model.layers.\1.self_attn.q_norm.\2"),
    (r"blk\.(\d+)\.attn_k_norm\.(weight)", r"model.layers.\1.self_attn.k_norm.\2"),
    (r"blk\.(\d+)\.ffn_norm\.(weight|bias)", r"model.layers.\1.post_attention_layernorm.\2"),
    (r"blk\.(\d+)\.ffn_gate\.(weight)", r"model.layers.\1.mlp.gate_proj.\2"),
    (r"blk\.(\d+)\.ffn_up\.(weight)", r"model.layers.\1.mlp.up_proj.\2"),
    (r"blk\.(\d+)\.ffn_down\.(weight)", r"model.layers.\1.mlp.down_proj.\2"),
))

#: Architectures whose llama.cpp converter interleaves q and k rows for its rotary kernel
#: (``LlamaModel.permute``); the others (qwen2, qwen3...) keep transformers' order.
_ROTARY_PERMUTED = frozenset({"llama", "mistral", "granite"})
_ROTARY_TARGETS = {re.compile(r".*\.self_attn\.q_proj\.(weight|bias)"): "head_count",
                   re.compile(r".*\.self_attn\.k_proj\.(weight|bias)"): "head_count_kv"}


class HeaderSource(Protocol):
    """Bounded reads of a file: what the header parser needs (``FileSource`` is one)."""

    name: str
    size: int

    def read(self, offset: int, nbytes: int, *, what: str = "data") -> bytes:
        """Read bytes, checking the range first."""

    def check_range(self, offset: int, nbytes: int, *, what: str) -> None:
        """Raise if ``[offset, offset + nbytes)`` is not inside the file."""


def rename(name: str, table: Sequence[tuple[re.Pattern[str], str]]) -> str:
    """Rename by the first pattern of a table that matches the whole name (else keep it).

    Args:
        name: A name.
        table: Patterns and replacements (``re`` syntax).

    Returns:
        The new name.
    """
    for pattern, replacement in table:
        if pattern.fullmatch(name):
            return pattern.sub(replacement, name)
    return name


def plain_metadata(value: Any, *, limit: int = 16) -> Any:
    """A metadata value fit for a report: long lists summarised by their length.

    Args:
        value: A value read from a file's metadata.
        limit: Lists longer than this are summarised.

    Returns:
        The value, or ``"<N items>"``.
    """
    if isinstance(value, list) and len(value) > limit:
        return f"<{len(value)} items>"
    return value


class _Reader:
    """Bounded sequential reads of the header (all of it before the data section)."""

    def __init__(self, source: HeaderSource) -> None:
        self.source = source
        self.pos = 0

    def unpack(self, code: str, what: str) -> Any:
        size = struct.calcsize("<" + code)
        (value,) = struct.unpack("<" + code, self.source.read(self.pos, size, what=what))
        self.pos += size
        return value

    def count(self, what: str, item_bytes: int) -> int:
        """A count, checked against the bytes left (each item takes at least ``item_bytes``)."""
        value = int(self.unpack("Q", what))
        if value * item_bytes > self.source.size - self.pos:
            raise CorruptCheckpointError(f"{what} is {value}, more than the file can hold",
                                         path=self.source.name)
        return value

    def string(self, what: str) -> str:
        length = self.count(f"the length of {what}", 1)
        raw = self.source.read(self.pos, length, what=what)
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(f"{what} is not UTF-8", path=self.source.name) from None

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise CorruptCheckpointError(f"{what} has unknown value type {kind}",
                                         path=self.source.name)
        if depth >= _MAX_DEPTH:
            raise CorruptCheckpointError(f"{what} nests arrays more than {_MAX_DEPTH} deep",
                                         path=self.source.name)
        item = int(self.unpack("I", f"the item type of {what}"))
        size = struct.calcsize("<" + _SCALARS[item]) if item in _SCALARS else 8
        length = self.count(f"the length of {what}", size)
        if item in _SCALARS:
            raw = self.source.read(self.pos, length * size, what=what)
            self.pos += length * size
            return list(struct.unpack(f"<{length}{_SCALARS[item]}", raw))
        return [self.value(item, what, depth + 1) for _ in range(length)]


def _header(source: HeaderSource) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int,
                                                                           int]], int]:
    """The metadata, the tensor infos (name, numpy shape, type, offset) and the data start."""
    reader = _Reader(source)
    if source.read(0, 4, what="the magic") != MAGIC:
        raise CorruptCheckpointError("not a GGUF file (no GGUF magic)", path=source.name)
    reader.pos = 4
    version = reader.unpack("I", "the version")
    if version not in (2, 3):
        raise UnsupportedCheckpointError(f"GGUF version {version} is not read (2 and 3 are)",
                                         path=source.name)
    tensor_count = reader.count("the tensor count", 24)
    kv_count = reader.count("the metadata count", 12)
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = reader.string("a metadata key")
        kind = reader.unpack("I", f"the type of metadata '{key}'")
        metadata[key] = reader.value(kind, f"metadata '{key}'")
    infos = []
    for _ in range(tensor_count):
        name = reader.string("a tensor name")
        ndim = reader.unpack("I", f"the dimensions of tensor '{name}'")
        if not 1 <= ndim <= _MAX_DIMS:
            raise CorruptCheckpointError(f"tensor '{name}' has {ndim} dimensions", path=source.name)
        dims = tuple(reader.unpack("Q", f"a dimension of '{name}'") for _ in range(ndim))
        kind = reader.unpack("I", f"the type of tensor '{name}'")
        offset = reader.unpack("Q", f"the offset of tensor '{name}'")
        infos.append((name, dims[::-1], kind, offset))
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or not 1 <= alignment <= 1 << 20:
        raise CorruptCheckpointError(f"general.alignment is {alignment!r}", path=source.name)
    start = -(-reader.pos // alignment) * alignment
    return metadata, infos, start


def _head_dims(metadata: dict[str, Any], arch: str, names: Iterable[str]) -> dict[str, int]:
    """Each attention module's head size, as the file's metadata states it."""
    heads = metadata.get(f"{arch}.attention.head_count")
    width = metadata.get(f"{arch}.embedding_length")
    size = metadata.get(f"{arch}.attention.key_length")
    if not isinstance(size, int):
        if not isinstance(heads, int) or not isinstance(width, int) or heads <= 0:
            return {}
        size = width // heads
    return {name.rsplit(".", 2)[0]: size for name in names
            if name.endswith(".self_attn.q_proj.weight")}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as the header places it.

    Attributes:
        name: The name in the file (llama.cpp's).
        shape: The shape, rows first.
        type_name: The GGML type (``"Q4_K"``).
        dtype: torch's name of the stored dtype, or ``None`` for a quantized type (read as
            float32).
        offset: Its first byte in the file.
        nbytes: Its size in the file.
        heads: The heads whose rotary rows llama.cpp interleaved, or ``None``.
    """

    name: str
    shape: tuple[int, ...]
    type_name: str
    dtype: str | None
    offset: int
    nbytes: int
    heads: int | None


@dataclass(frozen=True)
class GgufPlan:
    """What a GGUF file holds, by transformers' names, and the summary metadata.

    Attributes:
        tensors: Each tensor by its new name, in the file's order.
        metadata: The ``__metadata__`` entry of the contents (framework, layout, metadata...).
    """

    tensors: dict[str, GgufTensor]
    metadata: dict[str, Any]


def _tensor(source: HeaderSource, name: str, shape: tuple[int, ...], kind: int,
            offset: int) -> GgufTensor:
    if kind not in GGML_TYPES:
        raise UnsupportedCheckpointError(f"tensor '{name}' has GGML type {kind}, not read yet",
                                         path=source.name)
    type_name, block, block_bytes, dtype = GGML_TYPES[kind]
    if shape[-1] % block:
        raise CorruptCheckpointError(f"tensor '{name}' ({type_name}) has rows of {shape[-1]} "
                                     f"elements, not whole blocks of {block}", path=source.name)
    numel = 1
    for dim in shape:
        numel *= dim
    nbytes = numel // block * block_bytes
    source.check_range(offset, nbytes, what=f"tensor '{name}'")
    return GgufTensor(name, shape, type_name, dtype, offset, nbytes, None)


def _rotary_heads(metadata: dict[str, Any], arch: str, tensor: GgufTensor, new: str,
                  path: str) -> int | None:
    """The heads of a q or k projection whose rows llama.cpp interleaved, else ``None``."""
    for pattern, key in _ROTARY_TARGETS.items():
        if pattern.fullmatch(new):
            heads = metadata.get(f"{arch}.attention.{key}",
                                 metadata.get(f"{arch}.attention.head_count"))
            if not isinstance(heads, int):
                raise CorruptCheckpointError(
                    f"'{tensor.name}' stores rotary rows interleaved, and the metadata lacks "
                    f"{arch}.attention.{key} to undo it", path=path)
            rows = tensor.shape[0]
            if heads <= 0 or rows % (2 * heads):
                raise CorruptCheckpointError(
                    f"'{tensor.name}' has {rows} rows, which {heads} heads with rotary halves "
                    "cannot split", path=path)
            return heads
    return None


def plan(source: HeaderSource) -> GgufPlan:
    """Read a GGUF file's header and plan its tensors, every offset checked against the file.

    Args:
        source: The file.

    Returns:
        The tensors by transformers' names and the summary metadata.

    Raises:
        CorruptCheckpointError: If the header is damaged or lies about the file.
        UnsupportedCheckpointError: For a GGUF version or a tensor type not read.
    """
    metadata, infos, start = _header(source)
    arch = str(metadata.get("general.architecture", ""))
    permuted = arch in _ROTARY_PERMUTED
    tensors: dict[str, GgufTensor] = {}
    types: dict[str, int] = {}
    for name, shape, kind, offset in infos:
        tensor = _tensor(source, name, shape, kind, start + offset)
        new = rename(name, _NAMES)
        if permuted:
            tensor = replace(tensor, heads=_rotary_heads(metadata, arch, tensor, new, source.name))
        if new in tensors:
            raise CorruptCheckpointError(f"tensor '{name}' is stored twice", path=source.name)
        tensors[new] = tensor
        types[tensor.type_name] = types.get(tensor.type_name, 0) + 1
    summary = {
        "framework": "gguf", "architecture": arch, "head_dims": _head_dims(metadata, arch, tensors),
        "layout": ("llama.cpp names renamed to transformers'"
                   + (", q/k rotary rows un-interleaved" if permuted else "")),
        "quantization": types,
        "metadata": {k: plain_metadata(v) for k, v in metadata.items()},
    }
    return GgufPlan(tensors, summary)
