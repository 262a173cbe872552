"""MLX: mlx-lm model folders, whose group-wise quantized weights are dequantized on read.

mlx-lm saves safetensors (``format: mlx`` in their metadata) beside a ``config.json`` whose
``quantization`` gives ``group_size`` and ``bits`` (per module where they differ). A quantized
Linear or Embedding ``X`` is stored as ``X.weight`` (uint32 words packing ``32 / bits`` values
each, first value in the lowest bits), ``X.scales`` and ``X.biases`` (one per group of
``group_size`` inputs): ``weight = scales * q + biases``. Read here, ``X.weight`` is that
float weight (in the scales' dtype) and the scales and biases are gone, so the folder grafts
into the unquantized PyTorch model. Names are transformers' already; MLX's rotary layout is
transformers' (``traditional=False``).

MLX's ``save_weights`` files are plain safetensors or npz with no marker; their convolutions
(``[out, kh, kw, in]``) are not re-laid here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..meta import TensorMeta, TensorRef
from .base import Contents, Format, ReadOptions
from .registry import checkpoint_in, open_contents
from .safetensors_format import FORMAT as SAFETENSORS

__all__ = ["FORMAT", "FOLDER_FORMAT", "dequantize"]

_CONFIG = "config.json"
_MAX_CONFIG = 16 << 20
_WORD_BITS = 32
_SUPPORTED_BITS = (2, 4, 8)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, *,
               bits: int, group_size: int) -> torch.Tensor:
    """MLX's affine dequantization: ``scales * q + biases`` per group of inputs.

    Args:
        packed: ``[..., in * bits / 32]`` uint32 words, first value in the lowest bits.
        scales: ``[..., in / group_size]``.
        biases: Same shape as ``scales``.
        bits: Bits per value.
        group_size: Inputs per scale.

    Returns:
        The ``[..., in]`` weight, in the scales' dtype.
    """
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, dtype=torch.uint8) * bits
    # Little-endian words: value i sits in byte i // per_byte, at bit (i % per_byte) * bits.
    data = packed.contiguous().view(torch.uint8).unsqueeze(-1)
    values = ((data >> shifts) & ((1 << bits) - 1)).reshape(*packed.shape[:-1], -1, group_size)
    dtype = scales.dtype
    weight = scales.unsqueeze(-1) * values.to(dtype) + biases.unsqueeze(-1)
    return weight.reshape(*packed.shape[:-1], -1)


def _quantization(folder: Path) -> dict[str, Any] | None:
    """The ``quantization`` entry of an mlx-lm ``config.json``, or ``None``."""
    config = folder / _CONFIG
    if not config.is_file() or config.stat().st_size > _MAX_CONFIG:
        return None
    try:
        value = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    found = value.get("quantization") if isinstance(value, dict) else None
    if isinstance(found, dict) and isinstance(found.get("bits"), int) and isinstance(
            found.get("group_size"), int):
        return found
    return None


def _parameters(quantization: dict[str, Any], module: str) -> tuple[int, int]:
    """The (bits, group_size) of one module: its own entry where mlx-lm wrote one."""
    own = quantization.get(module)
    chosen = own if isinstance(own, dict) else quantization
    bits, group = chosen.get("bits"), chosen.get("group_size")
    if chosen.get("mode", "affine") != "affine":
        raise UnsupportedCheckpointError(f"'{module}' is quantized in MLX's "
                                         f"{chosen.get('mode')!r} mode; torchgraft dequantizes "
                                         "'affine' (mlx-lm's default)")
    if not isinstance(bits, int) or not isinstance(group, int) or group <= 0:
        raise CorruptCheckpointError(f"config.json's quantization for '{module}' lacks bits "
                                     "or group_size")
    return bits, group


def _dequantized(module: str, packed: TensorRef, scales: TensorRef, biases: TensorRef,
                 bits: int, group: int, path: Path) -> TensorRef:
    if bits not in _SUPPORTED_BITS:
        raise UnsupportedCheckpointError(f"'{module}' is quantized to {bits} bits; torchgraft "
                                         f"dequantizes {_SUPPORTED_BITS} bits", path=path)
    rows, words = packed.meta.shape[:-1], packed.meta.shape[-1]
    width = words * (_WORD_BITS // bits)
    if (packed.meta.dtype != torch.uint32 or width % group
            or scales.meta.shape != (*rows, width // group) or biases.meta.shape
            != scales.meta.shape):
        raise CorruptCheckpointError(
            f"'{module}': weight {packed.meta.shape} ({packed.meta.dtype}), scales "
            f"{scales.meta.shape}, biases {biases.meta.shape} do not fit {bits}-bit groups of "
            f"{group}", path=path)
    meta = TensorMeta.of((*rows, width), scales.meta.dtype)

    def read() -> torch.Tensor:
        return dequantize(packed.read(), scales.read(), biases.read(), bits=bits,
                          group_size=group)

    return TensorRef(meta, read)


def _dequantize_root(root: dict[str, Any], quantization: dict[str, Any] | None,
                     path: Path) -> dict[str, Any]:
    """Replace every ``X.weight``/``X.scales``/``X.biases`` triple by ``X.weight`` in floats."""
    modules = [name.removesuffix(".scales") for name in root if name.endswith(".scales")
               and isinstance(root.get(name.removesuffix(".scales") + ".weight"), TensorRef)
               and isinstance(root.get(name.removesuffix(".scales") + ".biases"), TensorRef)]
    if not modules:
        return root
    if quantization is None:
        raise UnsupportedCheckpointError(
            f"'{modules[0]}' is MLX-quantized (weight, scales, biases) and the folder's "
            "config.json has no 'quantization' (bits, group_size)", path=path)
    out = dict(root)
    for module in modules:
        bits, group = _parameters(quantization, module)
        out[f"{module}.weight"] = _dequantized(module, root[f"{module}.weight"],
                                               root[f"{module}.scales"],
                                               root[f"{module}.biases"], bits, group, path)
        del out[f"{module}.scales"], out[f"{module}.biases"]
    return out


def _open_file(path: Path, options: ReadOptions) -> Contents:
    """One mlx-lm safetensors file, as stored (a shard: the folder dequantizes)."""
    contents = SAFETENSORS.open(path, options)
    if isinstance(contents.root, dict):
        metadata = contents.root.get("__metadata__")
        contents.root["__metadata__"] = {
            **(metadata if isinstance(metadata, dict) else {}), "framework": "mlx",
            "note": "quantized weights stay packed in one file: open the mlx-lm folder to "
                    "dequantize them"}
    return Contents("mlx", path, contents.root, contents.closers)


def _open_folder(path: Path, options: ReadOptions) -> Contents:
    quantization = _quantization(path)
    inner = open_contents(checkpoint_in(path), options.part())
    root = inner.root
    if isinstance(root, dict):
        root = _dequantize_root(root, quantization, path)
        root["__metadata__"] = {"framework": "mlx", "quantization": quantization or {}}
    return Contents("mlx", path, root, inner.closers)


def _claims(folder: Path) -> bool:
    return _quantization(folder) is not None and any(folder.glob("*.safetensors"))


def _magic(head: bytes) -> bool:
    return SAFETENSORS.magic is not None and SAFETENSORS.magic(head) and (
        b'"format":"mlx"' in head)


FORMAT = Format(name="mlx", open=_open_file, magic=_magic)
FOLDER_FORMAT = Format(name="mlx", open=_open_folder, claims_directory=_claims)
