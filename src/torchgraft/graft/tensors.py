"""What planning knows of a tensor and of a side of a graft: names, shapes, dtypes, kinds, order.

The leaf of the graft package: every stage describes a source or a target with these, and
they import nothing of the package.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

__all__ = ["Side", "TensorInfo", "looks_sorted", "natural_key", "numbers_ascend", "owner"]


class TensorInfo(NamedTuple):
    """One tensor of a side, as planning sees it.

    A named tuple: planning a model of 100k tensors builds hundreds of thousands of them.

    Attributes:
        name: Its key.
        shape: Its shape.
        dtype: Its dtype.
        kind: Its module's kind (``"linear"``, ``"conv"``, ``"norm"``...), if known.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str | None = None

    @property
    def module(self) -> str:
        """The owning module's path: the key without its last part (see :func:`owner`)."""
        return owner(self.name)


#: Where torch's parametrizations keep a parametrized module's tensors.
_PARAMETRIZED = ".parametrizations."


def owner(key: str) -> str:
    """The module a tensor belongs to: its key without the last part.

    A parametrized tensor (``conv.parametrizations.weight.original0``: torch's weight norm)
    belongs to the module it parametrizes (``conv``), beside that module's own bias.

    Args:
        key: A tensor's key.

    Returns:
        The module's path.
    """
    if _PARAMETRIZED in key:
        return key.partition(_PARAMETRIZED)[0]
    return key.rpartition(".")[0]


@dataclass
class Side:
    """A source or target, by metadata only.

    Attributes:
        tensors: Key to info, in definition (or stored) order.
        given_order: Keys in order of use (forward hooks) where known, else definition order. A
            file whose names are stored sorted (safetensors sorts by dtype, then name) says
            nothing of its order of definition: its order is recovered from the names
            (:func:`natural_key`), and ``ordered`` is False.
        format: The checkpoint format of a source read from a file.
        ties: Key to the first key holding the very same tensor (tied weights), for keys
            after the first.
        head_dims: Module path to its attention ``head_dim``, for modules that say it.
        head_counts: Module path to its attention's (query heads, key/value heads), for
            modules that say them (:data:`~torchgraft.graft.sides.heads.HEAD_ATTRIBUTES`).
        given_ordered: Whether ``order`` is a real order of definition or use, for a given
            order.
        buffers: The model's persistent buffers' keys (what its code computes or gathers,
            not its parameters); none for a file.
        numbers: Key to the file's own name of its module, its number apart, and that number,
            where a file numbers its modules itself in their order (Keras 3 keys the layers of
            one class in a list ``dense``, ``dense_1``... in the model's order, whatever the
            layers' own names): its modules' numbers, as a module side's names give them.
        facts: What was derived from the names once and is asked again (the naming family):
            scanning 100k names per question would cost seconds.
        order_of_use: Finds the keys in order of use where none was given (a forward on
            meta of the module, or of the file's own code base's model), or None where it
            cannot; asked on first use of :attr:`order`. Where it says nothing, the stored
            order is kept as above.
    """

    tensors: dict[str, TensorInfo]
    given_order: list[str] = field(default_factory=list)
    format: str | None = None
    ties: dict[str, str] = field(default_factory=dict)
    head_dims: dict[str, int] = field(default_factory=dict)
    head_counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    given_ordered: bool = True
    buffers: frozenset[str] = frozenset()
    numbers: dict[str, tuple[str, int]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    order_of_use: Callable[[], list[str] | None] | None = field(default=None, repr=False,
                                                                 compare=False)

    @property
    def order(self) -> list[str]:
        """Keys in order of use where known, else of definition (see the class's attributes).

        Found on first use where not given: a graft whose keys all pair by name never asks,
        and sorting 100k names naturally costs a tenth of a second.
        """
        self._find_order()
        return self.given_order

    @property
    def order_at_hand(self) -> list[str]:
        """Keys in the order known so far: of use where it was found, else as stored.

        Never runs a model: for what any order serves (a model's first and last modules),
        where finding the order of use would cost more than what it tells.
        """
        return self.given_order or list(self.tensors)

    @property
    def ordered(self) -> bool:
        """Whether :attr:`order` is a real order of definition or use."""
        self._find_order()
        return self.given_ordered

    def with_tensors(self, tensors: dict[str, TensorInfo], order: list[str]) -> Side:
        """The same side with other tensors (made, fused, split or stacked ones), in ``order``.

        Every other field is kept (head sizes and counts, facts found of the stored names,
        ties among the tensors still there); an order that was not real stays so.

        Args:
            tensors: Key to info.
            order: The keys in order.

        Returns:
            A new side; this one is unchanged.
        """
        ties = {k: v for k, v in self.ties.items() if k in tensors and v in tensors}
        numbers = {k: v for k, v in self.numbers.items() if k in tensors}
        return dataclasses.replace(self, tensors=tensors, given_order=order, ties=ties,
                                   given_ordered=self.ordered, numbers=numbers,
                                   facts=dict(self.facts))

    def _find_order(self) -> None:
        """The order of use where :attr:`order_of_use` finds it, else of the stored names.

        Recovered from the names where they say nothing of an order (then not ``ordered``):
        stored names are an order of definition unless they are sorted, or their numbered
        blocks do not come in the order of their numbers (MLX writes its files in a hash
        order: ``blocks.1`` before ``blocks.0``), which no module list is defined in.
        """
        if self.given_order or not self.tensors:
            return
        found = self.order_of_use() if self.order_of_use is not None else None
        if found:
            self.given_order, self.given_ordered = found, True
        else:
            self.given_order = list(self.tensors)
            if looks_sorted(self.given_order, self.tensors) or \
                    not numbers_ascend(self.given_order):
                self.given_order = sorted(self.given_order, key=natural_key)
                self.given_ordered = False


_NUMBER = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[int | str, ...]:
    """Sort key for tensor names: numeric parts as numbers (``h.2`` before ``h.10``).

    Text and numbers alternate in the key (text first, ``""`` where a name starts or ends
    with a number), so each position compares text with text or numbers with numbers.

    Args:
        name: A tensor name.

    Returns:
        The key.
    """
    parts: list[int | str] = list(_NUMBER.split(name))
    parts[1::2] = map(int, parts[1::2])
    return tuple(parts)


def numbers_ascend(order: Sequence[str]) -> bool:
    """Whether every numbered container's children first appear in the order of their numbers.

    A module list is defined (and a file that keeps definition order stores it) ``0``, ``1``,
    ``2``...: ``layers.2`` before ``layers.1`` says the order is another one.

    Args:
        order: Names as stored.

    Returns:
        False where some container's child appears first after a child of a higher number.
    """
    highest: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    for name in order:
        prefix = ""
        for part in name.split("."):
            if part.isdigit():
                number = int(part)
                if (prefix, number) not in seen:
                    seen.add((prefix, number))
                    if number < highest.get(prefix, -1):
                        return False
                    highest[prefix] = number
            prefix = f"{prefix}.{part}" if prefix else part
    return True


def looks_sorted(order: Sequence[str], infos: dict[str, TensorInfo]) -> bool:
    """Whether names are stored sorted (by name, or by dtype then name), not as defined.

    Args:
        order: Names as stored.
        infos: Their metadata.

    Returns:
        True for at least three names in sorted order, which says nothing of definition order.
    """
    if len(order) < 3:
        return False
    if list(order) == sorted(order):
        return True
    runs = [infos[n].dtype for k, n in enumerate(order) if not k or infos[order[k - 1]].dtype
            != infos[n].dtype]
    if len(runs) != len(set(runs)):
        return False  # one dtype in several places: not grouped by dtype
    return all(list(names) == sorted(names) for names in (
        [n for n in order if infos[n].dtype == dtype] for dtype in runs))
