"""The operations a plan step applies: reversible layout steps, and adaptations that lose.

A :class:`Step` is one reversible operation of :mod:`~torchgraft.graft.layouts.ops` (a
transpose, permuted axes, a reshape, rotary rows, exchanged halves, a unit offset...) with why
it is needed: applied forwards to fill a model, its exact inverse writes the model's weights
in the checkpoint's layout (``tg.save(layout_of=...)``). An identity step says that the source
tensor is virtual (fused, split or stacked by its own operation). The adaptations that change
what a tensor holds (a head's or an embedding's rows, a first convolution's input channels,
dequantisation) have classes of their own and no inverse; only :class:`Rows` reads the
target's present values (new rows keep the model's own with ``init="keep"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..layouts import ops

__all__ = ["Dequantize", "Init", "InputChannels", "LabelMap", "Op", "Rows", "Step", "applied",
           "fresh_values", "label_pairs", "reversible"]

Init = Literal["keep", "normal", "zeros"]
LabelMap = Mapping[int, int] | Sequence[int | None]


def fresh_values(current: torch.Tensor, init: Init) -> torch.Tensor:
    """New values for rows or channels that the checkpoint does not have.

    Args:
        current: The target's present values for them.
        init: ``"keep"`` the model's own, ``"normal"`` (std 0.02; zeros for 1-D biases), or
            ``"zeros"``.

    Returns:
        A tensor like ``current``.
    """
    if init == "keep":
        return current.clone()
    if init == "normal" and current.dim() > 1 and current.is_floating_point():
        return torch.randn_like(current) * 0.02
    return torch.zeros_like(current)


@dataclass(frozen=True)
class Step:
    """One reversible operation a tensor goes through, and why.

    Attributes:
        op: The operation (one tensor in, one out).
        why: Why the two sides need it (a layout's, a convention's reason); for an identity
            step, how the virtual source tensor was made.
    """

    op: ops.TensorOp
    why: str = ""

    @property
    def identity(self) -> bool:
        """Whether it leaves the tensor as it is (a virtual source, already made)."""
        return isinstance(self.op, ops.Chain) and not self.op.ops

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        """The stored tensor in the target's layout."""
        return self.op.apply([tensor])[0]

    def describe(self) -> str:
        """Text for the report: what was done, and why."""
        done = self.op.done()
        if not done or not self.why:
            return done or self.why
        return f"{done} ({self.why})"


@dataclass(frozen=True)
class Dequantize:
    """The source is quantized (``qint8``...); the target holds its float values."""

    dtype: str

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        """The float values the quantized tensor stands for."""
        return tensor.dequantize()

    def describe(self) -> str:
        """Text for the report."""
        return f"dequantized from {self.dtype}"


@dataclass(frozen=True)
class InputChannels:
    """A convolution's input channels change from ``n_from`` to ``n_to`` (dim 1 of its weight).

    Growing keeps every pretrained filter exactly and fills each new input channel with the
    mean of the pretrained channels' filters (``init="zeros"``: zeros), so an input whose new
    channels are zero gives the same output as the pretrained model. Shrinking folds each
    dropped channel into channel ``i % n_to`` by summing (timm's RGB-to-grey sum, generalised),
    so an input whose channels repeat with period ``n_to`` gives the same output.
    """

    n_from: int
    n_to: int
    init: Init = "keep"

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return the weight with ``n_to`` input channels."""
        if self.n_to > self.n_from:
            extra_shape = list(tensor.shape)
            extra_shape[1] = self.n_to - self.n_from
            if self.init == "zeros":
                extra = tensor.new_zeros(extra_shape)
            else:
                extra = tensor.mean(dim=1, keepdim=True).expand(extra_shape)
            return torch.cat([tensor, extra.to(tensor.dtype)], dim=1)
        folded = tensor.new_zeros((tensor.shape[0], self.n_to, *tensor.shape[2:]))
        for channel in range(self.n_from):
            folded[:, channel % self.n_to] += tensor[:, channel]
        return folded

    def describe(self) -> str:
        """Text for the report."""
        if self.n_to > self.n_from:
            fill = "zeros" if self.init == "zeros" else "the mean of the pretrained channels"
            return (f"in_channels {self.n_from}->{self.n_to}: {self.n_from} kept, "
                    f"{self.n_to - self.n_from} new = {fill}")
        return (f"in_channels {self.n_from}->{self.n_to}: channels folded by summing "
                f"(i % {self.n_to})")


@dataclass(frozen=True)
class Rows:
    """The leading dimension changes (a classifier's classes, an embedding's vocabulary).

    Rows present in both are kept (target row ``i`` takes source row ``i``, or the row a
    label map names); the other target rows get fresh values per ``init``.
    """

    n_from: int
    n_to: int
    init: Init = "keep"
    label_map: tuple[tuple[int, int], ...] | None = None

    def pairs(self) -> list[tuple[int, int]]:
        """(target row, source row) pairs that are kept."""
        if self.label_map is not None:
            return list(self.label_map)
        return [(i, i) for i in range(min(self.n_from, self.n_to))]

    def apply(self, tensor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """Return the tensor with ``n_to`` rows."""
        out = fresh_values(current, self.init).to(device=tensor.device, dtype=tensor.dtype)
        pairs = self.pairs()
        if pairs:
            target_rows = torch.tensor([t for t, _ in pairs])
            source_rows = torch.tensor([s for _, s in pairs])
            out[target_rows] = tensor[source_rows]
        return out

    def describe(self) -> str:
        """Text for the report."""
        kept = len(self.pairs())
        new = self.n_to - kept
        chosen = " chosen by label_map" if self.label_map is not None else ""
        text = f"rows {self.n_from}->{self.n_to}: {kept} kept{chosen}"
        return text + (f", {new} new (init={self.init})" if new else "")


#: What a plan step applies, in order.
Op = Step | Dequantize | InputChannels | Rows


def reversible(op: Op) -> ops.TensorOp | None:
    """The reversible operation ``op`` is, or ``None`` for an adaptation that loses."""
    return op.op if isinstance(op, Step) else None


def applied(op: Op, tensor: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``op`` applied to ``tensor``; only :class:`Rows` reads ``target``, the model's tensor.

    Args:
        op: The operation.
        tensor: The source tensor, as the operations before made it.
        target: The tensor it fills (on its own device: nothing is copied for it).

    Returns:
        The tensor in the target's layout and shape.
    """
    return op.apply(tensor, target) if isinstance(op, Rows) else op.apply(tensor)


def label_pairs(label_map: LabelMap, n_from: int, n_to: int) -> tuple[tuple[int, int], ...]:
    """Normalise a label map to (target row, source row) pairs, checking the bounds.

    Args:
        label_map: ``{target_row: source_row}``, or a sequence whose item ``i`` is the source
            row for target row ``i`` (``None`` for a new row).
        n_from: Source rows.
        n_to: Target rows.

    Returns:
        The pairs.

    Raises:
        ValueError: If a row is out of range.
    """
    items = label_map.items() if isinstance(label_map, Mapping) else enumerate(label_map)
    pairs = tuple((int(t), int(s)) for t, s in items if s is not None)
    for target, source in pairs:
        if not (0 <= target < n_to and 0 <= source < n_from):
            raise ValueError(f"label_map pair {target}: {source} is outside {n_to} target rows "
                             f"and {n_from} checkpoint rows")
    return pairs
