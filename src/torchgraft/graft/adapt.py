"""Tensor adaptations a plan can ask for: transposes, input channels, rows.

Each operation is data (what to do, and how to describe it) plus ``apply``, which turns the
source tensor into one of the target's shape; ``current`` is the target's present value.
Layout operations (transposes, permuted axes, rotary rows) run through the reversible
operations of :mod:`~torchgraft.graft.ops`; their ``reversible()`` is that operation, so a
plan can be run backwards (``tg.save(layout_of=...)``). Adaptations of shapes (rows, input
channels) and dequantisation lose information and have none.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from . import ops

__all__ = ["Dequantize", "Derived", "Init", "InputChannels", "LabelMap", "Op", "RotaryPermute",
           "PartsReversed", "Permute", "Reshape", "Rows", "Transpose", "UnitOffset",
           "fresh_values", "label_pairs"]

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


class _Reversible(ABC):
    """An adaptation that is one reversible operation: applying it runs that operation."""

    @abstractmethod
    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is."""

    def apply(self, tensor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """The stored tensor in the target's layout."""
        return self.reversible().apply([tensor])[0]


@dataclass(frozen=True)
class Dequantize:
    """The source is quantized (``qint8``...); the target holds its float values."""

    dtype: str

    def apply(self, tensor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """The float values the quantized tensor stands for."""
        return tensor.dequantize()

    def describe(self) -> str:
        """Text for the report."""
        return f"dequantized from {self.dtype}"


@dataclass(frozen=True)
class Transpose(_Reversible):
    """The source stores this weight transposed (another framework's layout)."""

    why: str

    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is."""
        return ops.Transpose(0, 1)

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape a stored tensor of ``shape`` has once transposed."""
        return shape[::-1]

    def describe(self) -> str:
        """Text for the report."""
        return f"transposed ({self.why})"


@dataclass(frozen=True)
class Permute(_Reversible):
    """The source stores this weight's axes in another order (another framework's layout)."""

    why: str
    dims: tuple[int, ...]

    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is."""
        return ops.Permute(self.dims)

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape a stored tensor of ``shape`` has once permuted."""
        return tuple(shape[d] for d in self.dims)

    def describe(self) -> str:
        """Text for the report."""
        return f"axes permuted to {self.dims} ({self.why})"


@dataclass(frozen=True)
class Reshape(_Reversible):
    """The source stores this weight with other unit dimensions.

    A 1x1 convolution's weight ``[out, in, 1, 1]`` is a Linear's ``[out, in]``.
    """

    why: str
    to: tuple[int, ...]

    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is."""
        return ops.Reshape(self.to)

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The target's shape."""
        return self.to

    def describe(self) -> str:
        """Text for the report."""
        return f"reshaped to {self.to} ({self.why})"


@dataclass(frozen=True)
class PartsReversed(_Reversible):
    """A fused gated projection stored with its halves the other way round (``[up; gate]``)."""

    why: str

    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is."""
        return ops.Reverse(0, 2)

    def describe(self) -> str:
        """Text for the report."""
        return f"halves exchanged ({self.why})"


@dataclass(frozen=True)
class UnitOffset:
    """A norm's scale stored with another offset: ``delta`` is added.

    1 takes a Gemma norm's ``gamma - 1`` into a plain norm; -1 goes the other way.
    """

    delta: float

    def apply(self, tensor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """The weight plus ``delta``, in the wider of its dtype and the target's.

        A bfloat16 ``gamma - 1`` plus 1 would otherwise round in bfloat16.
        """
        wide = torch.promote_types(tensor.dtype, current.dtype)
        return self.reversible().apply([tensor.to(wide)])[0]

    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is."""
        return ops.Offset(self.delta)

    def describe(self) -> str:
        """Text for the report."""
        way = "added to" if self.delta > 0 else "taken from"
        return (f"unit offset: {abs(self.delta):g} {way} the norm's weight (one norm scales by "
                "1 + weight, the other by weight)")


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

    def apply(self, tensor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
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


@dataclass(frozen=True)
class RotaryPermute(_Reversible):
    """Reorder each attention head's rows between transformers' and Meta's rotary layouts.

    transformers' Llama conversion stores each head's rows as ``view(heads, head_dim // 2, 2,
    ...).transpose(1, 2)`` of Meta's; this undoes it (``to_meta``) or applies it. ``rows``:
    only the first rows have rotary heads (q and k of a fused ``[Q; K; V]``).
    """

    head_dim: int
    to_meta: bool
    rows: int | None = None

    def reversible(self) -> ops.TensorOp:
        """The reversible operation it is: Meta's order keeps each head's pairs together."""
        return ops.RotaryRows(self.head_dim, to_halves=not self.to_meta, rows=self.rows)

    def describe(self) -> str:
        """Text for the report."""
        way = "transformers' -> Meta's" if self.to_meta else "Meta's -> transformers'"
        which = "" if self.rows is None else f", q and k: the first {self.rows} rows"
        return f"rotary rows permuted ({way} layout, head_dim {self.head_dim}{which})"


@dataclass(frozen=True)
class Derived:
    """The source tensor is virtual: made by fusing or splitting stored ones."""

    why: str

    def apply(self, tensor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """The tensor as it is: the virtual source already fused or split it."""
        return tensor

    def reversible(self) -> ops.TensorOp:
        """Nothing to do here: the virtual source's own operation is reversed."""
        return ops.Chain(())

    def describe(self) -> str:
        """Text for the report."""
        return self.why


Op = (Dequantize | Derived | Transpose | Permute | Reshape | PartsReversed | UnitOffset
      | InputChannels | Rows | RotaryPermute)


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
