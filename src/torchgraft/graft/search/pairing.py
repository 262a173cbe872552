"""Pairing what the plan left missing by what it computes: a module's input names its source.

Where names and shapes could not decide (two modules of the checkpoint fit, or none by name),
both models are run on the same inputs: a module of the model whose input is the input of a
module of the source's code, upstream of both filled alike, sits where that module sits, and
is filled from its tensors. A source module whose rows are the rows of several such modules
together (a fused ``[q; k; v]`` under a name no table knows) is cut into them, in blocks, in the
model's order: its layout is a guess that the search of the unit settles
(:mod:`~torchgraft.graft.search.unit`). What no input tells is left to elimination: the only
module of the source, nearest to where its siblings' sources are, whose tensors have its shapes.
Every pair made here is a guess until outputs compare equal.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..evidence import Evidence, MatchStep
from ..layouts import ops
from ..plan.adapt import Step
from ..plan.steps import PlanStep
from .activations import Run, correspond, differ
from .view import PlanView

__all__ = ["BY_INPUT", "Missing", "pair_missing"]

#: How a pair made by its input is said.
BY_INPUT = "its input is the input of the source module's (found by comparing activations)"
#: At most this many modules of the model, fed one input, are cut from one source module.
_MOST_PARTS = 4


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _leaf(key: str) -> str:
    return key.rpartition(".")[2]


@dataclass(frozen=True)
class Missing:
    """What the plan left: target keys no checkpoint tensor fills, source keys nothing read.

    Attributes:
        targets: Missing target keys (bookkeeping buffers aside), in the model's order.
        sources: Unused stored source keys.
        names: Source key to the reference model's key (where the reference renames).
        shapes: Every key's shape: the model's, and the source's as ``source:`` keys.
    """

    targets: tuple[str, ...]
    sources: tuple[str, ...]
    names: Mapping[str, str]
    shapes: Mapping[str, tuple[int, ...]]


def _by_module(keys: Iterable[str]) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for key in keys:
        found.setdefault(_module(key), {})[_leaf(key)] = key
    return found


def _same_input(a: torch.Tensor | None, b: torch.Tensor | None, rtol: float) -> bool:
    return a is not None and b is not None and correspond(a, b) and \
        differ(a, b, rtol) is None


def _split(view: PlanView, targets: Sequence[dict[str, str]], source: dict[str, str],
           shapes: Mapping[str, tuple[int, ...]]) -> dict[str, PlanStep] | None:
    """Target modules cut, in blocks, from one source module whose rows are theirs together."""
    found: dict[str, PlanStep] = {}
    for leaf, stored in source.items():
        keys = [module.get(leaf) for module in targets]
        if None in keys or any(len(shapes[k]) != len(shapes[f"source:{stored}"])  # type: ignore[index]
                               for k in keys):
            return None
        rows = tuple(shapes[k][0] for k in keys if k is not None)
        whole = shapes[f"source:{stored}"]
        if sum(rows) != whole[0] or any(shapes[k][1:] != whole[1:] for k in keys if k):
            return None
        if len(keys) == 1:
            found[str(keys[0])] = PlanStep(str(keys[0]), stored, MatchStep.STRUCTURE,
                                           evidence=Evidence.GUESS)
            continue
        parts = view.derive(ops.Split(0, rows), [stored])
        starts = list(itertools.accumulate((0, *rows)))
        for k, (key, part) in enumerate(zip(keys, parts, strict=True)):
            why = f"split from {stored} (rows {starts[k]}:{starts[k + 1]}), {BY_INPUT}"
            found[str(key)] = PlanStep(str(key), part, MatchStep.STRUCTURE,
                                       (Step(ops.Chain(()), why),), evidence=Evidence.GUESS)
    covered = {leaf for module in targets for leaf in module}
    return found if covered <= set(source) else None


def _cut(view: PlanView, fed: Sequence[dict[str, str]], source: dict[str, str],
         shapes: Mapping[str, tuple[int, ...]]) -> dict[str, PlanStep]:
    """The largest set of modules fed one input whose rows a source module holds, in order."""
    for size in range(min(len(fed), _MOST_PARTS), 0, -1):
        for chosen in itertools.combinations(fed, size):
            found = _split(view, chosen, source, shapes)
            if found is not None:
                return found
    return {}


def pair_missing(view: PlanView, missing: Missing, target: Run, source: Run,
                 rtol: float) -> dict[str, PlanStep]:
    """Steps for missing keys whose modules' inputs say their source (made in ``view``).

    Args:
        view: The plan's steps (derivations for cut modules are made in it).
        missing: What the plan left.
        target: The model's forward pass (its modules' inputs).
        source: The reference's forward pass on the same inputs.
        rtol: Tolerance relative to the reference input's largest magnitude.

    Returns:
        Target key to its new step (a guess), for what activations or elimination paired.
    """
    wanted = _by_module(missing.targets)
    offered = _by_module(missing.sources)
    module_of = {m: _module(missing.names.get(next(iter(k.values())), next(iter(k.values()))))
                 for m, k in offered.items()}
    fed: dict[str, list[str]] = {}
    for path in target.entered:
        if path not in wanted:
            continue
        matches = [m for m in offered if _same_input(target.entered[path],
                                                     source.entered.get(module_of[m]), rtol)]
        if len(matches) == 1:
            fed.setdefault(matches[0], []).append(path)
    found: dict[str, PlanStep] = {}
    for module, paths in fed.items():
        made = _cut(view, [wanted[p] for p in paths], offered[module], missing.shapes)
        if made:
            found.update(made)
            offered.pop(module)
    found.update(_eliminated(wanted, offered, found, view, missing.shapes))
    return found


def _eliminated(wanted: Mapping[str, dict[str, str]], offered: Mapping[str, dict[str, str]],
                found: Mapping[str, PlanStep], view: PlanView,
                shapes: Mapping[str, tuple[int, ...]]) -> dict[str, PlanStep]:
    """Missing modules left, each filled from the only fitting source module nearest its kin.

    Its kin: the modules under its parent, whose sources (found now, or the plan's) say where
    in the source it sits; the source module sharing the longest path with theirs, alone.
    """
    steps = {**view.steps, **found}
    made: dict[str, PlanStep] = {}
    taken: set[str] = set()
    for path, leaves in wanted.items():
        if any(key in found for key in leaves.values()):
            continue
        kin = [s.source for k, s in steps.items() if _module(_module(k)) == _module(path)]
        fitting = [m for m, keys in offered.items() if m not in taken and set(keys) == set(leaves)
                   and all(shapes[f"source:{keys[leaf]}"] == shapes[leaves[leaf]]
                           for leaf in leaves)]
        nearest = _nearest(fitting, kin)
        if nearest is None:
            continue
        taken.add(nearest)
        for leaf, key in leaves.items():
            made[key] = PlanStep(key, offered[nearest][leaf], MatchStep.STRUCTURE,
                                 evidence=Evidence.GUESS)
    return made


def _shared(a: str, b: str) -> int:
    return sum(1 for _ in itertools.takewhile(lambda p: p[0] == p[1],
                                              zip(a.split("."), b.split("."), strict=False)))


def _nearest(candidates: Sequence[str], kin: Sequence[str]) -> str | None:
    """The one candidate sharing the longest path with the kin's sources, if one does."""
    if not candidates or not kin:
        return None
    score = {c: max(_shared(c, k) for k in kin) for c in candidates}
    best = max(score.values())
    top = [c for c, s in score.items() if s == best]
    return top[0] if len(top) == 1 else None

