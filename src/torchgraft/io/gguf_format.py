"""GGUF, llama.cpp's format: a header, typed metadata, tensor infos, then aligned tensor data.

The header is parsed and the tensors planned by :mod:`torchgraft.gguf_header` (torch-free,
so ``inspect`` reads it without torch) rather than with the ``gguf`` package's reader, which
maps the whole file and builds every metadata array as numpy objects: that parser checks each
count, length and offset against the file before it reads or allocates, and walks nested arrays
to a fixed depth. Float tensors are memory-mapped; quantized ones (Q8_0, Q4_0, Q4_K, Q6_K...) are
dequantized to float32 on read with the ``gguf`` package's numpy code (an optional extra).

llama.cpp's names (``blk.N.attn_q``) are renamed to transformers' (``model.layers.N.self_attn.
q_proj``) by a table, and for the architectures whose converter interleaves the rotary rows of
q and k (``llama``), the rows are put back in transformers' order using the head counts the
file's metadata states.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..gguf_header import MAGIC, GgufTensor, plan
from ..meta import TensorMeta, TensorRef
from .base import Contents, Format, ReadOptions
from .framework import import_optional
from .source import FileSource, FileTensor

__all__ = ["FORMAT", "unpermute_rotary"]


def unpermute_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of a q or k projection's rows (per head, rotary halves).

    Args:
        weight: The weight (or bias) as the GGUF file stores it, rows first.
        heads: The number of heads the rows hold.

    Returns:
        The rows in transformers' order.
    """
    rows = weight.shape[0]
    return (weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2)
            .reshape(weight.shape))


def _dequantize(raw: torch.Tensor, kind: str, shape: tuple[int, ...]) -> torch.Tensor:
    gguf = import_optional("gguf", extra="gguf", feature="Dequantizing GGUF tensors")
    blocks = raw.numpy().reshape(*shape[:-1], -1)
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(shape)


def _ref(source: FileSource, tensor: GgufTensor) -> TensorRef:
    name, shape, offset, nbytes = tensor.name, tensor.shape, tensor.offset, tensor.nbytes
    ref: TensorRef
    if tensor.dtype is not None:
        ref = FileTensor(source, offset, TensorMeta.of(shape, getattr(torch, tensor.dtype)),
                         what=f"tensor '{name}'")
    else:
        def read_quantized() -> torch.Tensor:
            raw = source.array(offset, nbytes, torch.uint8, what=f"tensor '{name}'")
            return _dequantize(raw, tensor.type_name, shape)

        ref = TensorRef(TensorMeta.of(shape, torch.float32), read_quantized)
    heads = tensor.heads
    if heads is None:
        return ref
    return TensorRef(ref.meta, lambda: unpermute_rotary(ref.read(), heads).contiguous())


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    contents = plan(source)
    root: dict[str, object] = {new: _ref(source, tensor)
                               for new, tensor in contents.tensors.items()}
    root["__metadata__"] = contents.metadata
    return Contents("gguf", path, root, [source.close])


FORMAT = Format(name="gguf", open=_open, suffixes=(".gguf",),
                magic=lambda head: head.startswith(MAGIC))
