"""Framework layouts: how another framework names and stores what PyTorch calls the same thing.

Each layout is data: renames (rules) and which weights are stored transposed. A layout applies
when the source's format or module types say it was written that way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .rules import Rule
from .sides import Side, TensorInfo

__all__ = ["GPT2_CONV1D", "LAYOUTS", "PADDLE", "Layout", "layouts_for"]


@dataclass(frozen=True)
class Layout:
    """A framework's way of storing weights.

    Attributes:
        name: Shown in reports.
        applies: Whether a source uses this layout.
        renames: Rules from this layout's names to PyTorch's.
        exports: Rules from PyTorch's names to this layout's (``None`` drops what it lacks).
        transposed: Whether a source tensor is stored transposed relative to a target tensor.
        why: Shown in reports for transposed tensors.
    """

    name: str
    applies: Callable[[Side], bool]
    renames: tuple[Rule, ...] = ()
    exports: tuple[Rule, ...] = ()
    transposed: Callable[[TensorInfo, TensorInfo], bool] = lambda src, dst: False
    why: str = ""


def _linear_weight(dst: TensorInfo) -> bool:
    return dst.kind == "linear" and dst.name.rsplit(".", 1)[-1] == "weight" and len(dst.shape) == 2


PADDLE = Layout(
    name="paddle",
    applies=lambda side: side.format == "paddle",
    renames=(Rule(r"\._mean$", ".running_mean"), Rule(r"\._variance$", ".running_var")),
    exports=(Rule(r"\.running_mean$", "._mean"), Rule(r"\.running_var$", "._variance"),
             Rule(r"(^|\.)num_batches_tracked$", None)),
    transposed=lambda src, dst: _linear_weight(dst) and len(src.shape) == 2,
    why="Paddle stores Linear weights as [in, out]",
)

GPT2_CONV1D = Layout(
    name="gpt2-conv1d",
    applies=lambda side: any(t.kind == "gpt2_conv1d" for t in side.tensors.values()),
    transposed=lambda src, dst: src.kind == "gpt2_conv1d" and _linear_weight(dst),
    why="GPT-2's Conv1D stores weights as [in, out]",
)

LAYOUTS = (PADDLE, GPT2_CONV1D)


def layouts_for(source: Side) -> list[Layout]:
    """Return the layouts a source was written in.

    Args:
        source: The source side.

    Returns:
        The layouts that apply, in :data:`LAYOUTS` order.
    """
    return [layout for layout in LAYOUTS if layout.applies(source)]
