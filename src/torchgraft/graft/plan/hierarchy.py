"""Modules paired by what they hold, from the root down: each side's tree of modules.

Two modules whose modules fill each other one to one (a decoder and a decoder, a level and a
level) are the same part of the model, whatever they are named and in whatever order their
code defines them. From the root down, a module's children pair with the other side's where
their shapes pair them one way only (each fills exactly one child of the other's); the
numbered children of two module lists pair in order where every level fits its like. What
this finds orders the source's children as the target's (:func:`sibling_order`), and scopes
the pairing of what is left inside each pair (:func:`aligned_subtrees`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .numbering import Whole, move

__all__ = ["MAX_CANDIDATES", "MAX_CHILDREN", "aligned_subtrees", "sibling_order"]

#: A source module's children are compared with those of at most this many of the model's
#: modules of its sizes, the nearest in depth first (a model of many alike blocks has as many
#: alike parents, and their children's order is their own).
MAX_CANDIDATES = 4
#: Children of two parents are compared each with each only up to this many on a side (a
#: list of experts, in order or not, is paired level by level, never each with each).
MAX_CHILDREN = 64


def _children(paths: Sequence[str]) -> dict[str, dict[str, list[int]]]:
    """Each module holding two or more others: its children and the groups in each."""
    found: dict[str, dict[str, list[int]]] = {}
    for k, path in enumerate(paths):
        parts = path.split(".")
        for depth in range(len(parts)):
            parent = ".".join(parts[:depth])
            found.setdefault(parent, {}).setdefault(parts[depth], []).append(k)
    return {parent: children for parent, children in found.items() if len(children) >= 2}


def _depth(path: str) -> int:
    """How deep a module is (the root: -1)."""
    return path.count(".") if path else -1


def _sizes(children: dict[str, list[int]]) -> tuple[int, ...]:
    """How many groups each child holds, largest first (parents that may pair have equal)."""
    return tuple(sorted((len(members) for members in children.values()), reverse=True))


def _one_way(own: list[list[int]], other: list[list[int]], whole: Whole) -> list[int] | None:
    """Each of ``own``'s children's partner among ``other``'s, where shapes pair all one way."""
    if len(own) != len(other) or len(own) > MAX_CHILDREN:
        return None
    taken: list[int] = []
    for mine in own:  # a child that fits two, or none, ends it
        fits = [k for k, theirs in enumerate(other) if whole(mine, theirs)]
        if len(fits) != 1 or fits[0] in taken:
            return None
        taken.append(fits[0])
    return taken


def sibling_order(target_paths: Sequence[str], source_paths: Sequence[str],
                  whole: Whole) -> list[int]:
    """The source groups with each module's children in the order the target's come in.

    Code bases define a module's children in their own order (diffusers' decoder defines its
    up-blocks before its mid-block, which runs first), and a file keeps it. Where a target
    module's children and a source module's pair one to one by their shapes alone (each
    child's modules fill exactly one child of the other's), the source's children take the
    target's order: shapes decide it, not names. Outer modules first; children that could
    pair more than one way keep their order.

    Args:
        target_paths: The target's module paths (groups), in order.
        source_paths: The source's module paths (groups), in order.
        whole: Whether target groups and source groups fill each other one to one.

    Returns:
        Source group indices in their new order (unchanged where nothing moved).
    """
    order = list(range(len(source_paths)))
    place = {k: k for k in order}
    targets = _children(target_paths)
    by_size: dict[tuple[int, ...], list[str]] = {}
    for parent, held in targets.items():
        by_size.setdefault(_sizes(held), []).append(parent)
    sources = _children(source_paths)
    for parent in sorted(sources, key=lambda path: (_depth(path), path)):
        children = list(sources[parent].values())
        alike = by_size.get(_sizes(sources[parent]), [])
        nearest = sorted(alike, key=lambda other: abs(_depth(other) - _depth(parent)))
        for other in nearest[:MAX_CANDIDATES]:
            taken = _one_way(list(targets[other].values()), children, whole)
            if taken is None:
                continue
            if taken != sorted(taken, key=lambda c: place[children[c][0]]):
                move(order, place, [sorted(children[c], key=place.__getitem__) for c in taken])
            break
    return order


def aligned_subtrees(target_paths: Sequence[str], source_paths: Sequence[str],
                     whole: Whole) -> list[tuple[list[int], list[int]]]:
    """Pairs of modules that hold each other's modules one to one, deepest first.

    From the roots down: children that only each other fit pair (order aside), and the levels
    of two module lists of as many levels pair in order where each fits its like; each pair
    is then looked into in turn.

    Args:
        target_paths: The target's module paths (groups).
        source_paths: The source's module paths (groups).
        whole: Whether target groups and source groups fill each other one to one.

    Returns:
        Each pair's target groups and source groups, inner pairs before the pairs holding them.
    """
    targets, sources = _children(target_paths), _children(source_paths)
    found: list[tuple[list[int], list[int]]] = []
    stack = [("", "")]
    while stack:
        own, other = stack.pop()
        mine, theirs = targets.get(own), sources.get(other)
        if mine is None or theirs is None:
            continue
        for name, partner in _partners(mine, theirs, whole):
            found.append((mine[name], theirs[partner]))
            stack.append((f"{own}.{name}" if own else name,
                          f"{other}.{partner}" if other else partner))
    found.sort(key=lambda pair: len(pair[0]))
    return found


def _partners(own: dict[str, list[int]], other: dict[str, list[int]],
              whole: Whole) -> list[tuple[str, str]]:
    """The children of two paired modules that pair: levels in order, else the only fits.

    Levels pair in the order they come in (a list numbered the other way comes turned,
    :func:`~torchgraft.graft.plan.numbering.turned_order`).
    """
    if len(own) == len(other) and all(name.isdigit() for name in [*own, *other]) and \
            all(whole(own[a], other[b]) for a, b in zip(own, other, strict=True)):
        return list(zip(own, other, strict=True))
    if max(len(own), len(other)) > MAX_CHILDREN:
        return []
    fits = {name: [partner for partner, theirs in other.items() if whole(mine, theirs)]
            for name, mine in own.items()}
    fitted: dict[str, int] = {}
    for partners in fits.values():
        for partner in partners:
            fitted[partner] = fitted.get(partner, 0) + 1
    return [(name, partners[0]) for name, partners in fits.items()
            if len(partners) == 1 and fitted[partners[0]] == 1]
