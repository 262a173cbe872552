"""A layout: how one side of a graft names and stores what the other calls the same thing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...renames import Rule
from ..tensors import Side, TensorInfo
from .conventions import RotaryOrder

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """A framework's way of storing weights, relative to the other side of a graft.

    Attributes:
        name: Shown in reports.
        applies: Whether this layout stands between a source and a target.
        renames: Rules from the source's names to the target's.
        exports: Rules from PyTorch's names to this layout's (``None`` drops what it lacks).
        transposed: Whether a source tensor is stored transposed relative to a target tensor.
        permuted: The axis order (``torch.permute`` dims) a source tensor needs to fill a target
            tensor, for layouts that store more than 2-D weights another way; ``None`` if none.
        reshaped: Whether a source weight is the target's with unit dimensions added or
            removed (a 1x1 convolution's ``[out, in, 1, 1]`` for a Linear's ``[out, in]``).
        why: Shown in reports for transposed or reshaped tensors.
        doubt: For a pair this layout cannot decide (a shape that reads the same two ways):
            its readings (the one taken among them) and why none is known; ``None`` if it
            decides.
        rotary: Where the two sides store rotary (RoPE) rows in other orders: the target
            family's order, into which its q and k rows are reordered.
        across: Whether its two sides are two code bases (or frameworks), whose names tell
            apart only by their conventions; ``False`` for another storage of the same model
            (a PEFT adapter, packed quantized weights, a transformers version's renames).
    """

    name: str
    applies: Callable[[Side, Side], bool]
    renames: tuple[Rule, ...] = ()
    exports: tuple[Rule, ...] = ()
    transposed: Callable[[TensorInfo, TensorInfo], bool] = lambda src, dst: False
    permuted: Callable[[TensorInfo, TensorInfo], tuple[int, ...] | None] = lambda src, dst: None
    reshaped: Callable[[TensorInfo, TensorInfo], bool] = lambda src, dst: False
    why: str = ""
    doubt: Callable[[TensorInfo, TensorInfo], tuple[tuple[str, ...], str] | None] = \
        lambda src, dst: None
    rotary: RotaryOrder | None = None
    across: bool = True
