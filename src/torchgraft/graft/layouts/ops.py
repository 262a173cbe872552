"""Reversible tensor operations: the layout transforms of a graft, run forwards or backwards.

Each operation takes a list of tensors and gives a list of tensors (concatenating parts, cutting
a fused tensor, interleaving parts group by group, transposing, reordering rotary rows,
stacking, adding a unit offset...). Every one has an exact :meth:`~TensorOp.inverse`, given the
shapes it was applied to, so the plan that fills a model from a checkpoint can be run backwards
to write the model's weights in the checkpoint's layout (``tg.save(model, path,
layout_of=checkpoint)``). Operations compose (:class:`Chain`) and are applied lazily to
:class:`~torchgraft.meta.TensorRef` s (:func:`lazy`): nothing is read until a tensor is.

Which kinds exist is data: :data:`KINDS` maps each kind's name (as rules files name it) to
its class; layouts and users' rules build their transforms from these.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ...bounds import MAX_NDIM
from ...errors import TorchgraftError, shown
from ...meta import TensorMeta, TensorRef

__all__ = ["KINDS", "Chain", "Concatenate", "Deinterleave", "Interleave", "Offset", "Permute",
           "Reshape", "Reverse", "RotaryRows", "Shape", "Split", "Stack", "TensorOp", "Transpose",
           "Unstack", "WeightNorm", "WeightNormSplit", "lazy"]

Shape = tuple[int, ...]


class TensorOp(Protocol):
    """A reversible operation from a list of tensors to a list of tensors."""

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs for these inputs."""
        ...

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The outputs' shapes for inputs of these shapes (TorchgraftError if they misfit)."""
        ...

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """The operation that gives back inputs of these shapes from the outputs."""
        ...

    def describe(self) -> str:
        """Text for reports: what it does, as rules name it."""
        ...

    def done(self) -> str:
        """Text for reports: what was done to a tensor (empty when nothing)."""
        ...


def _misfit(op: TensorOp, shapes: Sequence[Shape], why: str) -> TorchgraftError:
    listed = ", ".join(str(tuple(s)) for s in shapes) or "nothing"
    return TorchgraftError(f"cannot {op.describe()} tensors of shapes {listed}: {why}")


def _axis(dim: int, rank: int, op: TensorOp, shapes: Sequence[Shape]) -> int:
    """``dim`` as a non-negative axis of a tensor of ``rank`` dimensions."""
    if not -rank <= dim < rank:
        raise _misfit(op, shapes, f"dim {dim} is outside {rank} dimensions")
    return dim % rank


def _one(op: TensorOp, shapes: Sequence[Shape]) -> Shape:
    if len(shapes) != 1:
        raise _misfit(op, shapes, "it takes one tensor")
    return tuple(shapes[0])


def _same_rank(op: TensorOp, shapes: Sequence[Shape], dim: int) -> int:
    """The axis ``dim`` of several tensors alike in every other dimension."""
    if not shapes:
        raise _misfit(op, shapes, "it takes at least one tensor")
    axis = _axis(dim, len(shapes[0]), op, shapes)
    rest = {tuple(s[:axis]) + tuple(s[axis + 1:]) for s in shapes}
    if len(rest) != 1 or len({len(s) for s in shapes}) != 1:
        raise _misfit(op, shapes, f"they differ outside dim {dim}")
    return axis


def _positive(op: TensorOp, field: str, values: Sequence[object], *, zero: bool = False,
              many: bool = True) -> None:
    """Refuse, as the operation is made, sizes that are not whole numbers from 1 (or 0).

    A rules file's ``reshape`` to ``[-1, -4]`` has the size of ``[4]`` (products alone would
    accept it) and ``split`` into parts of ``[-2, 6]`` adds up to 4: sizes are checked one
    by one, before any tensor is.
    """
    least = 0 if zero else 1
    if (many and not values) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values):
        kind = next((k for k, cls in KINDS.items() if cls is type(op)), type(op).__name__)
        raise TorchgraftError(f"{kind}: {field} must be whole numbers from {least}, not "
                              f"{shown(list(values), 60)}")


@dataclass(frozen=True)
class Concatenate:
    """Parts joined along ``dim`` (``torch.cat``); inverse: :class:`Split` with their sizes."""

    dim: int = 0

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The one tensor made of the parts."""
        return [torch.cat(list(tensors), dim=self.dim)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """One shape, the parts' sizes along ``dim`` summed."""
        axis = _same_rank(self, shapes, self.dim)
        first = shapes[0]
        return [(*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1:])]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Cut at the parts' sizes."""
        axis = _same_rank(self, shapes, self.dim)
        return Split(self.dim, tuple(s[axis] for s in shapes))

    def describe(self) -> str:
        """Text for reports."""
        return f"concatenate along dim {self.dim}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"concatenated along dim {self.dim}"


@dataclass(frozen=True)
class Split:
    """One tensor cut along ``dim`` into parts of ``sizes`` (or ``count`` equal parts)."""

    dim: int = 0
    sizes: tuple[int, ...] = ()
    count: int = 0

    def __post_init__(self) -> None:
        if self.sizes and self.count:
            raise TorchgraftError("split: give sizes or count, not both")
        if self.sizes:
            _positive(self, "sizes", self.sizes)
        else:
            _positive(self, "count", [self.count])

    def _sizes(self, shape: Shape, shapes: Sequence[Shape]) -> tuple[int, ...]:
        axis = _axis(self.dim, len(shape), self, shapes)
        if self.sizes:
            if sum(self.sizes) != shape[axis] or min(self.sizes) < 1:
                raise _misfit(self, shapes, f"sizes {list(self.sizes)} do not add up to "
                                            f"{shape[axis]}")
            return self.sizes
        if self.count < 1 or self.count > shape[axis] or shape[axis] % self.count:
            raise _misfit(self, shapes, f"{shape[axis]} does not split into {self.count} "
                                        "equal parts")
        return (shape[axis] // self.count,) * self.count

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The parts (views of the tensor)."""
        tensor = tensors[0]
        sizes = self._sizes(tuple(tensor.shape), [tuple(tensor.shape)])
        return list(torch.split(tensor, list(sizes), dim=self.dim))

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The parts' shapes."""
        shape = _one(self, shapes)
        axis = _axis(self.dim, len(shape), self, shapes)
        return [(*shape[:axis], size, *shape[axis + 1:]) for size in self._sizes(shape, shapes)]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Concatenate the parts."""
        self.shapes(shapes)
        return Concatenate(self.dim)

    def _into(self) -> str:
        return f"sizes {list(self.sizes)}" if self.sizes else f"{self.count} equal parts"

    def describe(self) -> str:
        """Text for reports."""
        return f"split along dim {self.dim} into {self._into()}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"split along dim {self.dim} into {self._into()}"


def _groups(op: TensorOp, shapes: Sequence[Shape], sizes: tuple[int, ...]) -> int:
    """How many groups parts of ``shapes`` hold, each part ``sizes[i]`` rows per group."""
    if len(shapes) != len(sizes) or min(sizes, default=0) < 1:
        raise _misfit(op, shapes, f"{len(shapes)} parts for {len(sizes)} sizes per group")
    _same_rank(op, shapes, 0)
    counts = {s[0] // size if s[0] % size == 0 else -1 for s, size in zip(shapes, sizes,
                                                                          strict=True)}
    if len(counts) != 1 or -1 in counts:
        raise _misfit(op, shapes, f"their rows are not the same number of groups of "
                                  f"{list(sizes)} rows")
    return counts.pop()


@dataclass(frozen=True)
class Interleave:
    """Parts joined group by group along rows: ``[groups, (part 0, part 1...), ...]``.

    GPT-NeoX's ``query_key_value`` (``sizes`` = head size, three times: each head's q, k, v
    rows), or a grouped-query layout (``sizes`` = q rows per kv group, then one head of k and
    one of v). Inverse: :class:`Deinterleave`.
    """

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        _positive(self, "sizes", self.sizes)

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The parts interleaved."""
        groups = _groups(self, [tuple(t.shape) for t in tensors], self.sizes)
        rest = tuple(tensors[0].shape[1:])
        grouped = [t.reshape(groups, size, *rest) for t, size in zip(tensors, self.sizes,
                                                                     strict=True)]
        return [torch.cat(grouped, dim=1).reshape(-1, *rest)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """One shape, the parts' rows summed."""
        _groups(self, shapes, self.sizes)
        return [(sum(s[0] for s in shapes), *shapes[0][1:])]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Take the parts out again."""
        _groups(self, shapes, self.sizes)
        return Deinterleave(self.sizes)

    def describe(self) -> str:
        """Text for reports."""
        return f"interleave group by group ({'+'.join(map(str, self.sizes))} rows per group)"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"interleaved group by group ({'+'.join(map(str, self.sizes))} rows per group)"


@dataclass(frozen=True)
class Deinterleave:
    """The parts of a tensor stored group by group (see :class:`Interleave`)."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        _positive(self, "sizes", self.sizes)

    def _count(self, shape: Shape, shapes: Sequence[Shape]) -> int:
        width = sum(self.sizes)
        if not shape or min(self.sizes, default=0) < 1 or shape[0] % width:
            raise _misfit(self, shapes, f"its rows are not groups of {width}")
        return shape[0] // width

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The parts."""
        tensor = tensors[0]
        groups = self._count(tuple(tensor.shape), [tuple(tensor.shape)])
        rest = tuple(tensor.shape[1:])
        grouped = tensor.reshape(groups, sum(self.sizes), *rest)
        return [part.reshape(-1, *rest) for part in torch.split(grouped, list(self.sizes), 1)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The parts' shapes."""
        shape = _one(self, shapes)
        groups = self._count(shape, shapes)
        return [(groups * size, *shape[1:]) for size in self.sizes]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Interleave the parts again."""
        self.shapes(shapes)
        return Interleave(self.sizes)

    def describe(self) -> str:
        """Text for reports."""
        return f"take out parts stored group by group ({'+'.join(map(str, self.sizes))} rows " \
               "per group)"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"taken out of parts stored group by group ({'+'.join(map(str, self.sizes))} " \
               "rows per group)"


@dataclass(frozen=True)
class Transpose:
    """Two axes swapped; its own inverse."""

    dim0: int = 0
    dim1: int = 1

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensor transposed (a view)."""
        return [tensors[0].transpose(self.dim0, self.dim1)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The shape with the two axes swapped."""
        shape = list(_one(self, shapes))
        a, b = (_axis(d, len(shape), self, shapes) for d in (self.dim0, self.dim1))
        shape[a], shape[b] = shape[b], shape[a]
        return [tuple(shape)]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """The same transpose."""
        self.shapes(shapes)
        return self

    def describe(self) -> str:
        """Text for reports."""
        return f"transpose dims {self.dim0} and {self.dim1}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return "transposed" if {self.dim0, self.dim1} == {0, 1} else (
            f"dims {self.dim0} and {self.dim1} transposed")


@dataclass(frozen=True)
class Permute:
    """Axes put in another order (``torch.permute``); inverse: the inverse order."""

    dims: tuple[int, ...]

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensor with its axes permuted (a view)."""
        return [tensors[0].permute(self.dims)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The shape with its axes permuted."""
        shape = _one(self, shapes)
        if sorted(self.dims) != list(range(len(shape))):
            raise _misfit(self, shapes, f"{list(self.dims)} is not an order of its "
                                        f"{len(shape)} axes")
        return [tuple(shape[d] for d in self.dims)]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """The inverse order."""
        self.shapes(shapes)
        return Permute(tuple(sorted(range(len(self.dims)), key=self.dims.__getitem__)))

    def describe(self) -> str:
        """Text for reports."""
        return f"permute axes to {list(self.dims)}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"axes permuted to {tuple(self.dims)}"


@dataclass(frozen=True)
class RotaryRows:
    """Each attention head's rows between the two rotary (RoPE) orders.

    Meta's reference Llama keeps each head's rotary pairs side by side (rows 0,1 are a pair);
    transformers' stores the two halves of each head apart (row i pairs with row i + d/2), as
    its conversion script's ``permute`` makes them. ``to_halves`` goes from pairs to halves
    (Meta's -> transformers'); the inverse goes back. ``rows``: only the first rows are heads
    with rotary (the q and k of a fused ``[Q; K; V]``); the rest (v) stay as they are.
    """

    head_dim: int
    to_halves: bool
    rows: int | None = None

    def __post_init__(self) -> None:
        _positive(self, "head_dim", [self.head_dim])  # even: checked with the shapes
        if self.rows is not None:
            _positive(self, "rows", [self.rows])

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The rows in the other order."""
        tensor = tensors[0]
        self.shapes([tuple(tensor.shape)])
        rows = tensor.shape[0] if self.rows is None else self.rows
        half = (self.head_dim // 2, 2) if self.to_halves else (2, self.head_dim // 2)
        rotary = tensor[:rows].reshape(rows // self.head_dim, *half, -1).transpose(1, 2)
        return [torch.cat([rotary.reshape(rows, *tensor.shape[1:]), tensor[rows:]])]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The same shape."""
        shape = _one(self, shapes)
        rows = shape[0] if shape and self.rows is None else self.rows
        if self.head_dim < 2 or self.head_dim % 2 or not shape or rows is None or \
                rows % self.head_dim or not 0 < rows <= shape[0]:
            raise _misfit(self, shapes, f"its rows are not heads of an even size "
                                        f"{self.head_dim}")
        return [shape]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """The other way."""
        self.shapes(shapes)
        return RotaryRows(self.head_dim, not self.to_halves, self.rows)

    def describe(self) -> str:
        """Text for reports."""
        way = "pairs -> halves" if self.to_halves else "halves -> pairs"
        which = "" if self.rows is None else f" of the first {self.rows} rows"
        return f"rotary rows of each head{which} reordered ({way}, head size {self.head_dim})"

    def done(self) -> str:
        """Text for reports: what was done to a tensor, in the two orders' usual names."""
        way = "Meta's -> transformers'" if self.to_halves else "transformers' -> Meta's"
        which = "" if self.rows is None else f", q and k: the first {self.rows} rows"
        return f"rotary rows permuted ({way} layout, head_dim {self.head_dim}{which})"


@dataclass(frozen=True)
class Stack:
    """Tensors of one shape stacked along a new axis ``dim``; inverse: :class:`Unstack`."""

    dim: int = 0

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The stacked tensor."""
        return [torch.stack(list(tensors), dim=self.dim)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """One shape with a new axis of ``len(shapes)``."""
        if not shapes or len({tuple(s) for s in shapes}) != 1:
            raise _misfit(self, shapes, "it takes tensors of one shape")
        first = tuple(shapes[0])
        axis = _axis(self.dim, len(first) + 1, self, shapes)
        return [(*first[:axis], len(shapes), *first[axis:])]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Unstack them."""
        self.shapes(shapes)
        return Unstack(self.dim)

    def describe(self) -> str:
        """Text for reports."""
        return f"stack along a new dim {self.dim}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"stacked along a new dim {self.dim}"


@dataclass(frozen=True)
class Unstack:
    """A tensor's slices along ``dim`` (``torch.unbind``); inverse: :class:`Stack`."""

    dim: int = 0

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The slices (views)."""
        return list(torch.unbind(tensors[0], dim=self.dim))

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The slices' shapes."""
        shape = _one(self, shapes)
        axis = _axis(self.dim, len(shape), self, shapes)
        return [(*shape[:axis], *shape[axis + 1:])] * shape[axis]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Stack them again."""
        self.shapes(shapes)
        return Stack(self.dim)

    def describe(self) -> str:
        """Text for reports."""
        return f"unstack along dim {self.dim}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"unstacked along dim {self.dim}"


@dataclass(frozen=True)
class Reshape:
    """A tensor given another shape of the same size (a 1x1 convolution as a Linear).

    Every size is a dimension: from 0 (an empty tensor's), never negative (no ``-1`` to infer).
    """

    shape: Shape

    def __post_init__(self) -> None:
        _positive(self, "shape", self.shape, zero=True, many=False)
        if len(self.shape) > MAX_NDIM:
            raise TorchgraftError(f"reshape: a shape of {len(self.shape)} dimensions is no "
                                  f"tensor's (at most {MAX_NDIM})")

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensor reshaped."""
        return [tensors[0].reshape(self.shape)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The new shape."""
        if math.prod(_one(self, shapes)) != math.prod(self.shape):
            raise _misfit(self, shapes, f"its size is not that of {tuple(self.shape)}")
        return [tuple(self.shape)]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Back to the input's shape."""
        self.shapes(shapes)
        return Reshape(tuple(shapes[0]))

    def describe(self) -> str:
        """Text for reports."""
        return f"reshape to {tuple(self.shape)}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return f"reshaped to {tuple(self.shape)}"


@dataclass(frozen=True)
class Reverse:
    """A tensor's ``parts`` equal parts along ``dim`` in reverse order; its own inverse.

    A gated projection's ``[gate; up]`` becomes ``[up; gate]``.
    """

    dim: int = 0
    parts: int = 2

    def __post_init__(self) -> None:
        _positive(self, "parts", [self.parts])

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensor with its parts reversed."""
        self.shapes([tuple(tensors[0].shape)])
        return [torch.cat(tensors[0].chunk(self.parts, dim=self.dim)[::-1], dim=self.dim)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The same shape."""
        shape = _one(self, shapes)
        axis = _axis(self.dim, len(shape), self, shapes)
        if self.parts < 1 or shape[axis] % self.parts:
            raise _misfit(self, shapes, f"{shape[axis]} does not split into {self.parts} "
                                        "equal parts")
        return [shape]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """The same reversal."""
        self.shapes(shapes)
        return self

    def describe(self) -> str:
        """Text for reports."""
        return f"reverse {self.parts} parts along dim {self.dim}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return "halves exchanged" if self.parts == 2 and self.dim == 0 else (
            f"{self.parts} parts reversed along dim {self.dim}")


@dataclass(frozen=True)
class Offset:
    """A constant added (a norm stored as ``gamma - 1`` read with ``delta=1``)."""

    delta: float

    def __post_init__(self) -> None:
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or \
                not math.isfinite(self.delta):
            raise TorchgraftError(f"offset: delta must be a finite number, not "
                                  f"{shown(self.delta, 40)} (NaN or infinity would overwrite "
                                  "every value)")

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensor plus ``delta``."""
        return [tensors[0] + self.delta]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The same shape."""
        return [_one(self, shapes)]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Subtract it again."""
        self.shapes(shapes)
        return Offset(-self.delta)

    def describe(self) -> str:
        """Text for reports."""
        return f"add {self.delta:g}"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        way = "added to" if self.delta > 0 else "taken from"
        return f"unit offset: {abs(self.delta):g} {way} the norm's weight"


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """A floating tensor in float32 at least (a norm in bfloat16 rounds)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _norm_dims(rank: int, dim: int) -> list[int]:
    """The dimensions a weight normalisation's norm runs over: all but ``dim`` (-1: all)."""
    return list(range(rank)) if dim == -1 else [d for d in range(rank) if d != dim % rank]


def _magnitude_shape(shape: Shape, dim: int) -> Shape:
    """The shape torch stores a weight normalisation's magnitude ``g`` with."""
    if dim == -1:
        return ()
    keep = dim % len(shape)
    return tuple(n if d == keep else 1 for d, n in enumerate(shape))


@dataclass(frozen=True)
class WeightNorm:
    """A weight from torch's weight normalisation: ``w = g * v / ||v||`` (inputs ``g``, ``v``).

    The norm runs over every dimension but ``dim`` (``-1``: over all of them, ``g`` a
    scalar), as ``torch.nn.utils.weight_norm`` and its parametrization compute it. Inverse:
    :class:`WeightNormSplit`, which gives back a magnitude and direction of the same weight
    (``g = ||w||``, ``v = w``): the same weight, the parametrization any trained one has
    after a step of its optimiser aside.
    """

    dim: int = 0

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The weight, computed in at least float32, in the direction's dtype."""
        g, v = (_wide(t) for t in tensors)
        norm = v.norm(2, dim=_norm_dims(v.dim(), self.dim), keepdim=self.dim != -1)
        return [(v * (g / norm)).to(tensors[1].dtype)]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The direction's shape."""
        if len(shapes) != 2 or not shapes[1]:
            raise _misfit(self, shapes, "it takes a magnitude and a direction")
        g, v = (tuple(s) for s in shapes)
        if self.dim != -1:
            _axis(self.dim, len(v), self, shapes)
        if g != _magnitude_shape(v, self.dim) and not (self.dim == -1 and g in ((), (1,))):
            raise _misfit(self, shapes, f"a magnitude of the direction's dim {self.dim} is "
                                        f"{_magnitude_shape(v, self.dim)}")
        return [v]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Split the weight into a magnitude of the given shape and a direction."""
        self.shapes(shapes)
        return WeightNormSplit(self.dim, tuple(shapes[0]))

    def describe(self) -> str:
        """Text for reports."""
        return f"fold a weight normalisation (norm over all dims but {self.dim})"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return "weight normalisation folded (g * v / ||v||)"


@dataclass(frozen=True)
class WeightNormSplit:
    """A weight as torch's weight normalisation stores it: ``g = ||w||`` (shape ``g``), ``v = w``.

    ``g`` is the norm over every dimension but ``dim`` (``-1``: all), kept as ``magnitude``
    (torch's shape for it). Inverse: :class:`WeightNorm`.
    """

    dim: int = 0
    magnitude: Shape = ()

    def __post_init__(self) -> None:
        _positive(self, "magnitude", self.magnitude, many=False)

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The magnitude (its norm computed in at least float32) and the direction."""
        w = tensors[0]
        g = _wide(w).norm(2, dim=_norm_dims(w.dim(), self.dim), keepdim=self.dim != -1)
        return [g.reshape(self.magnitude).to(w.dtype), w]

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The magnitude's shape and the weight's."""
        shape = _one(self, shapes)
        WeightNorm(self.dim).shapes([self.magnitude, shape])
        return [tuple(self.magnitude), shape]

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """Fold them again."""
        self.shapes(shapes)
        return WeightNorm(self.dim)

    def describe(self) -> str:
        """Text for reports."""
        return f"split into a weight normalisation's magnitude and direction (dim {self.dim})"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return "split into a weight normalisation's g = ||w|| and v = w"


@dataclass(frozen=True)
class Chain:
    """Operations applied one after the other, each to what the one before gave."""

    ops: tuple[TensorOp, ...]

    def apply(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The last operation's outputs."""
        out = list(tensors)
        for op in self.ops:
            out = op.apply(out)
        return out

    def shapes(self, shapes: Sequence[Shape]) -> list[Shape]:
        """The last operation's output shapes."""
        out = [tuple(s) for s in shapes]
        for op in self.ops:
            out = op.shapes(out)
        return out

    def inverse(self, shapes: Sequence[Shape]) -> TensorOp:
        """The inverses, in reverse order."""
        inverses: list[TensorOp] = []
        current = [tuple(s) for s in shapes]
        for op in self.ops:
            inverses.insert(0, op.inverse(current))
            current = op.shapes(current)
        return Chain(tuple(inverses))

    def describe(self) -> str:
        """Text for reports."""
        return ", then ".join(op.describe() for op in self.ops) or "nothing"

    def done(self) -> str:
        """Text for reports: what was done to a tensor."""
        return ", then ".join(op.done() for op in self.ops)


#: Every kind of operation, by the name rules files and reports use.
KINDS: dict[str, type] = {
    "concatenate": Concatenate, "split": Split, "interleave": Interleave,
    "deinterleave": Deinterleave, "transpose": Transpose, "permute": Permute,
    "rotary": RotaryRows, "stack": Stack, "unstack": Unstack, "reshape": Reshape,
    "offset": Offset, "reverse": Reverse, "weight_norm": WeightNorm,
    "weight_norm_split": WeightNormSplit, "chain": Chain,
}


def _output(op: TensorOp, refs: Sequence[TensorRef], index: int) -> torch.Tensor:
    return op.apply([ref.read() for ref in refs])[index].contiguous()


def _cat_box(refs: Sequence[TensorRef], start: tuple[int, ...], out: torch.Tensor) -> None:
    """A block of a concatenation along rows: from each part, the rows of the block it holds."""
    first = 0
    for ref in refs:
        rows = ref.meta.shape[0]
        low, high = max(first, start[0]), min(first + rows, start[0] + out.shape[0])
        if low < high:
            ref.read_box((low - first, *start[1:]), out.narrow(0, low - start[0], high - low))
        first += rows


def _shifted_box(ref: TensorRef, first: int, start: tuple[int, ...], out: torch.Tensor) -> None:
    """A block of a part cut by rows: the same block of the whole tensor, rows shifted."""
    ref.read_box((first + start[0], *start[1:]), out)


def _box(op: TensorOp, refs: Sequence[TensorRef],
         index: int) -> Callable[[tuple[int, ...], torch.Tensor], None] | None:
    """A block reader for outputs that are rows of their inputs, as stored."""
    if isinstance(op, Concatenate) and op.dim == 0:
        return functools.partial(_cat_box, list(refs))
    if isinstance(op, Split) and op.dim == 0:
        rows = [s[0] for s in op.shapes([refs[0].meta.shape])]
        return functools.partial(_shifted_box, refs[0], sum(rows[:index]))
    return None


def lazy(op: TensorOp, refs: Sequence[TensorRef]) -> list[TensorRef]:
    """The operation's outputs as lazy tensors: read (through the inputs) only when asked.

    Args:
        op: The operation.
        refs: Its inputs.

    Returns:
        One lazy tensor per output, of the inputs' dtype; concatenations and cuts along rows
        read blocks of their inputs without reading the rest.

    Raises:
        TorchgraftError: If the inputs' shapes do not fit the operation.
    """
    if not refs:
        raise _misfit(op, [], "it was given no tensor")
    shapes = op.shapes([ref.meta.shape for ref in refs])
    dtype = refs[0].meta.dtype
    return [TensorRef(TensorMeta.of(shape, dtype), functools.partial(_output, op, list(refs), k),
                      read_box=_box(op, refs, k))
            for k, shape in enumerate(shapes)]
