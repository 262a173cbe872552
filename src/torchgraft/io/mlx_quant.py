"""MLX's quantization modes, dequantized with the values ``mx.dequantize`` gives.

``mx.quantize`` packs ``bits``-bit codes into uint32 words as one little-endian bit stream (the
first code in the lowest bits; 3-, 5- and 6-bit codes cross byte boundaries) and keeps one scale
per group of ``group_size`` inputs. What a code and a scale mean is the mode's (:data:`MODES`):

* ``affine``: ``scales * q + biases``, scales and biases in the weight's float dtype;
* ``mxfp4`` / ``mxfp8``: E2M1 / E4M3 codes times ``2 ** (e - 127)``, an E8M0 scale (uint8);
* ``nvfp4``: E2M1 codes times an E4M3 scale (uint8), groups of 16.

The floating modes have no biases, and their products fit bfloat16 exactly, which is what
``mx.dequantize`` returns for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["AFFINE_BITS", "MODES", "Mode", "dequantize", "unpack"]

_Decode = Callable[[torch.Tensor], torch.Tensor]

#: E2M1: sign, two exponent bits, one mantissa bit.
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _e2m1(codes: torch.Tensor) -> torch.Tensor:
    return _E2M1[codes.long()]


def _e4m3(codes: torch.Tensor) -> torch.Tensor:
    return codes.contiguous().view(torch.float8_e4m3fn).float()


def _e8m0(codes: torch.Tensor) -> torch.Tensor:
    """``2 ** (e - 127)`` built from its float32 bits (exact; 0 is 2^-127, 255 is NaN)."""
    exponent = codes.to(torch.int32)
    bits = torch.where(exponent == 0, torch.tensor(1 << 22, dtype=torch.int32), exponent << 23)
    bits = torch.where(exponent == 255, torch.tensor(0x7FC00000, dtype=torch.int32), bits)
    return bits.view(torch.float32)


@dataclass(frozen=True)
class Mode:
    """One MLX quantization mode.

    Attributes:
        shapes: The (bits, group_size) pairs MLX allows; ``None``: any group, :data:`AFFINE_BITS`.
        biases: Whether layers store ``biases`` beside ``scales``.
        values: Codes to float32 values (``None``: the codes themselves, affine).
        scales: Stored scales to float32 (``None``: already floats, affine).
    """

    shapes: tuple[tuple[int, int], ...] | None
    biases: bool
    values: _Decode | None = None
    scales: _Decode | None = None


#: The modes of ``mx.quantize`` (mlx 0.32).
MODES: dict[str, Mode] = {
    "affine": Mode(shapes=None, biases=True),
    "mxfp4": Mode(shapes=((4, 32),), biases=False, values=_e2m1, scales=_e8m0),
    "mxfp8": Mode(shapes=((8, 32),), biases=False, values=_e4m3, scales=_e8m0),
    "nvfp4": Mode(shapes=((4, 16),), biases=False, values=_e2m1, scales=_e4m3),
}
#: The affine widths MLX packs.
AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The ``bits``-bit codes of MLX's little-endian bit stream, as uint8.

    Args:
        packed: ``[..., words]`` uint32 (or its bytes).
        bits: Bits per code, 1 to 8.

    Returns:
        ``[..., words * 32 / bits]`` codes.
    """
    data = packed.contiguous().view(torch.uint8)
    mask = (1 << bits) - 1
    if 8 % bits == 0:  # whole codes per byte: code i at bit (i % per_byte) * bits
        shifts = torch.arange(8 // bits, dtype=torch.uint8) * bits
        return ((data.unsqueeze(-1) >> shifts) & mask).flatten(-2)
    # A code may straddle two bytes: read the 16-bit window at its first byte.
    count = data.shape[-1] * 8 // bits
    start = torch.arange(count) * bits
    padded = torch.nn.functional.pad(data, (0, 1)).to(torch.int32)
    window = padded[..., start // 8] | (padded[..., start // 8 + 1] << 8)
    return ((window >> (start % 8).to(torch.int32)) & mask).to(torch.uint8)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor | None, *,
               bits: int, group_size: int, mode: str = "affine") -> torch.Tensor:
    """MLX's dequantization of one packed weight.

    Args:
        packed: ``[..., in * bits / 32]`` uint32 words.
        scales: ``[..., in / group_size]``: floats (affine) or uint8 codes.
        biases: Same shape as ``scales`` (affine), else ``None``.
        bits: Bits per code.
        group_size: Inputs per scale.
        mode: A key of :data:`MODES`.

    Returns:
        The ``[..., in]`` weight: in the scales' dtype (affine), else bfloat16.
    """
    spec = MODES[mode]
    codes = unpack(packed, bits).reshape(*packed.shape[:-1], -1, group_size)
    if spec.values is None or spec.scales is None:
        assert biases is not None  # affine layers have biases: checked by the caller
        weight = scales.unsqueeze(-1) * codes.to(scales.dtype) + biases.unsqueeze(-1)
    else:
        weight = (spec.values(codes) * spec.scales(scales).unsqueeze(-1)).to(torch.bfloat16)
    return weight.reshape(*packed.shape[:-1], -1)
