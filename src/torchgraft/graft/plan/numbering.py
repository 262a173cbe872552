"""Numbered containers whose numbers run the other way on the two sides.

One code base numbers a decoder's levels in the order they run (diffusers' ``up_blocks.0``
runs first), another after the encoder's levels they mirror (latent diffusion's ``up.0`` runs
last). Module lists run in the order of their numbers on both sides everywhere else, so the
order of a file, or of a model's definition, pairs such levels the wrong way round, and where
two levels have one shape, with nothing to say so.

The levels' shapes tell: a source container is *turned* when its levels fit a target
container's only in the other order (the last level's modules are the first's), and fit no
target container in their own order. Its levels are then aligned the other way
(:func:`turned_order`). A level that only one level of the other side fits is known by its
shape; levels of one shape follow the order the others show, an assumption (a code base may
number its levels in any order), so their pairs are guesses (:attr:`Turn.forced`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Level", "Turn", "Whole", "containers", "move", "turned", "turned_order"]

#: Whether target groups (rows) and source groups (cols) fill each other one to one.
Whole = Callable[[list[int], list[int]], bool]


@dataclass(frozen=True)
class Turn:
    """A source container whose levels pair a target container's the other way.

    Attributes:
        source: The source container's path (``decoder.up``).
        target: The target container's path (``decoder.up_blocks``).
        size: How many levels each holds.
        forced: The target levels (by place in the target's order) that only one source level
            fits (the shape says).
    """

    source: str
    target: str
    size: int
    forced: frozenset[int]


def containers(paths: Sequence[str]) -> dict[str, list[Level]]:
    """Every module list among module paths, its levels in the order the paths come in.

    A level is a part of a path that is only digits (``decoder.up.0``); a list inside a level
    is a container of its own (``decoder.up.0.block``).

    Args:
        paths: Module paths, one per group, in order (of use, of definition or of the file).

    Returns:
        Container path to its levels in order of their first module, for containers numbered
        0 to n - 1 with n >= 2.
    """
    found: dict[str, dict[int, list[int]]] = {}
    for k, path in enumerate(paths):
        parts = path.split(".")
        for depth, part in enumerate(parts[:-1]):
            if part.isdigit():
                levels = found.setdefault(".".join(parts[:depth]), {})
                levels.setdefault(int(part), []).append(k)
    return {path: sorted((Level(f"{path}.{number}", members)
                          for number, members in levels.items()), key=lambda x: x.members[0])
            for path, levels in found.items()
            if len(levels) >= 2 and set(levels) == set(range(len(levels)))}


@dataclass(frozen=True)
class Level:
    """One numbered module of a list: its path and the indices of the groups inside it."""

    path: str
    members: list[int]


def _alike_levels(levels: list[Level], classes: Sequence[int]) -> bool:
    """Whether every level holds modules of the same shape classes (none can be told apart)."""
    kinds = {tuple(sorted(classes[k] for k in level.members)) for level in levels}
    return len(kinds) == 1


def turned(target_paths: Sequence[str], source_paths: Sequence[str],
           classes: tuple[Sequence[int], Sequence[int]], whole: Whole) -> list[Turn]:
    """The source containers whose levels fit a target container's only the other way round.

    Levels are compared in the order each side gives them (of use, of definition, of the
    file), whatever their numbers.

    Args:
        target_paths: The target's module paths (groups), in order.
        source_paths: The source's module paths (groups), in order.
        classes: Each group's shape class on each side (containers whose levels are all
            alike are not looked at: no order of theirs can be told).
        whole: Whether target groups and source groups fill each other one to one.

    Returns:
        One turn per source container turned, with a target container it pairs.
    """
    targets = {path: levels for path, levels in containers(target_paths).items()
               if not _alike_levels(levels, classes[0])}
    found = []
    for source, levels in containers(source_paths).items():
        if _alike_levels(levels, classes[1]):
            continue
        size = len(levels)
        backward = []
        for target, own in targets.items():
            if len(own) != size:
                continue
            if all(whole(own[t].members, levels[t].members) for t in range(size)):
                break  # a container it fits in its own order
            if all(whole(own[t].members, levels[size - 1 - t].members) for t in range(size)):
                backward.append((target, own))
        else:
            if backward:
                target, own = backward[0]
                forced = frozenset(
                    t for t in range(size)
                    if sum(whole(own[t].members, level.members) for level in levels) == 1)
                found.append(Turn(source, target, size, forced))
    return found


def turned_order(paths: Sequence[str], turns: Sequence[Turn]) -> list[int]:
    """The source groups in order, each turned container's levels the other way round.

    The groups of a turned container keep the places they hold in the order; its last level's
    groups take the first of those places.

    Args:
        paths: The source's module paths (groups), in order.
        turns: The turned containers.

    Returns:
        Group indices in their new order.
    """
    order = list(range(len(paths)))
    place = {k: k for k in order}
    found = containers(paths)
    for turn in turns:
        move(order, place, [level.members for level in reversed(found[turn.source])])
    return order



def move(order: list[int], place: dict[int, int], parts: list[list[int]]) -> None:
    """Put groups in the places they hold together, in the order given.

    Args:
        order: Group indices in order, changed in place.
        place: Each group's place in ``order``, kept up to date.
        parts: The groups to move, part by part, in their new order.
    """
    moved = [k for part in parts for k in part]
    for spot, k in zip(sorted(place[k] for k in moved), moved, strict=True):
        order[spot] = k
        place[k] = spot
