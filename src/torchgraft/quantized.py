"""Quantized tensors (qint8, quint8, qint32) as torch saves them: integer values and a quantizer.

``torch.save`` stores a quantized tensor as its integer representation in a ``QInt8Storage``
(or ``QUInt8Storage``, ``QInt32Storage``) and the quantizer's parameters beside it: per tensor
``(per_tensor_affine, scale, zero_point)``, per channel ``(per_channel_affine, scales,
zero_points, axis)`` with the scales and zero points as tensors of their own. A reference
built here reads the integers lazily and returns the tensor ``torch.load`` would give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .errors import CorruptCheckpointError, UnsupportedCheckpointError, shown
from .meta import TensorMeta, TensorRef

__all__ = ["INT_REPR", "is_quantized", "quantized_ref"]

#: Quantized dtype to the integer dtype its values are stored as.
INT_REPR: dict[torch.dtype, torch.dtype] = {
    torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32,
}

_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_affine_float_qparams)
_COMPLEX = (torch.complex32, torch.complex64, torch.complex128)


def is_quantized(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is a quantized dtype torchgraft reads."""
    return dtype in INT_REPR


def _number(value: Any, kind: type[float] | type[int], what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CorruptCheckpointError(f"quantized tensor record with {what} {shown(value, 40)}")
    return kind(value)


def _zero_points_fit(low: float, high: float, dtype: torch.dtype) -> None:
    """Zero points outside the integer range of ``dtype``: ``dequantize`` would fail later."""
    info = torch.iinfo(INT_REPR[dtype])
    if low < info.min or high > info.max:
        raise CorruptCheckpointError(
            f"quantized tensor record with a zero point of {low if low < info.min else high}, "
            f"outside {dtype}'s range {info.min}..{info.max}")


def _view(values: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """The quantized tensor viewing ``values``' memory, as ``torch.load`` builds it.

    No copy: a view with stride 0 over one element stays one element.
    """
    return empty.set_(values.untyped_storage(), values.storage_offset(), values.shape,
                      values.stride())


def _per_tensor(params: tuple[Any, ...], dtype: torch.dtype,
                ) -> Callable[[torch.Tensor], torch.Tensor]:
    if len(params) != 3:
        raise CorruptCheckpointError("per-tensor quantizer record without scale and zero point")
    scale = _number(params[1], float, "scale")
    zero_point = _number(params[2], int, "zero point")
    _zero_points_fit(zero_point, zero_point, dtype)
    return lambda values: _view(values, torch._empty_affine_quantized(
        [0], scale=scale, zero_point=zero_point, dtype=dtype))


def _check_dtypes(scales: torch.dtype, zero_points: torch.dtype) -> None:
    """Per-channel scales are floats; zero points integers or floats (float qparams).

    torch saves float-qparams tensors as ``per_channel_affine`` with floating-point zero
    points. Integer scales (``int8``) would be read as values they are not: refused.
    """
    if not scales.is_floating_point or zero_points in (torch.bool, *_COMPLEX):
        raise CorruptCheckpointError(
            f"per-channel quantizer with scales of {scales} and zero points of {zero_points}; "
            "torch keeps floating-point scales and integer or floating-point zero points")


def _per_channel(params: tuple[Any, ...], shape: tuple[int, ...], dtype: torch.dtype,
                 ) -> Callable[[torch.Tensor], torch.Tensor]:
    if len(params) != 4 or not all(isinstance(p, TensorRef) for p in params[1:3]):
        raise CorruptCheckpointError("per-channel quantizer record without scales and zero points")
    scales, zero_points = params[1], params[2]
    axis = _number(params[3], int, "axis")
    if not 0 <= axis < len(shape) or any(
            p.meta.shape != (shape[axis],) for p in (scales, zero_points)):
        raise CorruptCheckpointError(
            f"per-channel quantizer does not fit a tensor of shape {shape} (axis {axis})")
    _check_dtypes(scales.meta.dtype, zero_points.meta.dtype)

    def make(values: torch.Tensor) -> torch.Tensor:
        points = zero_points.read()
        if points.numel() and not points.is_floating_point():
            _zero_points_fit(int(points.min()), int(points.max()), dtype)
        return _view(values, torch._empty_per_channel_affine_quantized(
            [0], scales=scales.read().double(), zero_points=points, axis=axis, dtype=dtype))
    return make


def quantized_ref(values: TensorRef, dtype: torch.dtype, quantizer: Any) -> TensorRef:
    """A lazy quantized tensor from its integer values and torch's quantizer record.

    Args:
        values: The integer representation (``int8`` for ``qint8``...).
        dtype: The quantized dtype.
        quantizer: The pickled quantizer parameters.

    Returns:
        A reference whose ``read`` gives the quantized tensor, as ``torch.load`` does.

    Raises:
        CorruptCheckpointError: If the quantizer record is malformed.
        UnsupportedCheckpointError: For a quantization scheme torchgraft does not read.
    """
    if not isinstance(quantizer, tuple) or not quantizer:
        raise CorruptCheckpointError("quantized tensor record without a quantizer")
    scheme = quantizer[0]
    if scheme == torch.per_tensor_affine:
        make = _per_tensor(quantizer, dtype)
    elif scheme in _PER_CHANNEL:
        make = _per_channel(quantizer, values.meta.shape, dtype)
    else:
        raise UnsupportedCheckpointError(
            f"quantization scheme {shown(scheme, 40)} is not read; dequantize before saving")

    def read() -> torch.Tensor:
        return make(values.read())

    meta = TensorMeta.of(values.meta.shape, dtype, values.meta.device)
    return TensorRef(meta, read, alias_key=("quantized", values.alias_key))
