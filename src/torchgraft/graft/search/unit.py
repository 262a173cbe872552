"""Searching one diverging unit: hypotheses tried on the unit alone until its output agrees.

The module whose activation first diverges (the watched module) is searched in widening scopes:
itself, then each module around it up to its block, each run alone on the inputs it was called
with in the model's forward (captured once). In each scope, the hypotheses of its keys
(:mod:`.vocabulary`) are tried, fewest changes first, each one forward pass of the scope;
the first that makes the watched module's output agree with the reference's is kept. At most
:data:`MAX_TRIALS` forward passes are spent on one unit.

A hypothesis kept for one unit is then applied to every unit of the same type (the other
blocks of its container, the same module inside each): a 32-layer model costs about one
layer's search, and one forward pass of the model to confirm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import TorchgraftError
from ..layouts.conventions import numbered
from ..plan.steps import PlanStep
from ..report.summary import KEPT
from .activations import Call, correspond, differ, run_alone
from .view import PlanView
from .vocabulary import Choice, Dimension, choices

__all__ = ["MAX_TRIALS", "Searched", "Unit", "apply_choice", "same_type", "search_unit"]

#: At most this many forward passes (of a unit alone) are spent searching one diverging unit.
MAX_TRIALS = 512


#: What the watched module must give, as its steps say where it is filled from (``None``:
#: nothing to compare with).
Expected = Callable[[Mapping[str, PlanStep]], "torch.Tensor | None"]


@dataclass(frozen=True)
class Unit:
    """Where outputs first diverge.

    Attributes:
        watched: The model's module whose output first diverges.
        expected: What the reference gives there, for the module's steps as a hypothesis has
            them: the output of the reference module that fills it (a hypothesis that fills
            it from another module is held to that one's output).
        scopes: The modules to search, innermost first, with their captured calls.
    """

    watched: str
    expected: Expected
    scopes: tuple[tuple[str, Call], ...]


@dataclass
class Searched:
    """What searching a unit found and tried.

    Attributes:
        choice: The hypothesis kept, or ``None``.
        scope: The scope it was found in.
        tried: Each hypothesis tried, with what came of it.
        trials: Forward passes spent.
    """

    choice: Choice | None = None
    scope: str = ""
    tried: list[str] = field(default_factory=list)
    trials: int = 0


def _agrees(expected: torch.Tensor | None, actual: torch.Tensor | None, rtol: float) -> bool:
    return actual is not None and expected is not None and correspond(expected, actual) and \
        differ(expected, actual, rtol) is None


def apply_choice(view: PlanView, state: Mapping[str, torch.Tensor], choice: Choice,
                 saved: dict[str, torch.Tensor]) -> dict[str, PlanStep]:
    """Fill the keys a hypothesis changes through its edited steps (keeping their old values).

    Returns:
        The edited steps (not yet the view's).

    Raises:
        TorchgraftError: If the hypothesis does not fit the tensors (nothing is changed then).
    """
    steps = {key: view.steps[key] for key in choice.keys}
    try:
        for edit in choice.edits:
            edit.apply(view, steps)
        values = {key: view.value(steps[key], state[key]) for key in steps}
    except Exception as exc:  # an edit whose shapes do not fit
        raise TorchgraftError(f"{type(exc).__name__}: {exc}") from exc
    misfit = [k for k, v in values.items() if tuple(v.shape) != tuple(state[k].shape)]
    if misfit:
        raise TorchgraftError(f"'{misfit[0]}' would take shape {tuple(values[misfit[0]].shape)}")
    with torch.no_grad():
        for key, value in values.items():
            saved.setdefault(key, state[key].detach().clone())
            state[key].copy_(value)
    return steps


def _restore(state: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
             keys: Sequence[str]) -> None:
    with torch.no_grad():
        for key in keys:
            if key in saved:
                state[key].copy_(saved[key])


def _trial(model: nn.Module, view: PlanView, state: Mapping[str, torch.Tensor],
           scope: tuple[str, Call], unit: Unit, choice: Choice, rtol: float) -> str:
    """Try one hypothesis on a scope; ``""`` when it makes the unit agree (and is kept)."""
    mark, saved = view.mark(), dict[str, torch.Tensor]()
    try:
        steps = apply_choice(view, state, choice, saved)
    except TorchgraftError as exc:
        view.rollback(mark)
        return f"could not be applied ({exc})"
    try:
        actual = run_alone(model, scope[0], scope[1], unit.watched)
        expected = unit.expected({**view.steps, **steps})
        outcome = "" if _agrees(expected, actual, rtol) else f"'{unit.watched}' still diverged"
    except TorchgraftError as exc:
        outcome = f"the model failed with it ({exc})"
    if outcome:
        _restore(state, saved, list(steps))
        view.rollback(mark)
    else:
        view.steps.update(steps)
    return outcome


def search_unit(model: nn.Module, view: PlanView, state: Mapping[str, torch.Tensor], unit: Unit,
                dimensions: Callable[[str], list[Dimension]], *, rtol: float,
                budget: int = MAX_TRIALS) -> Searched:
    """Search a diverging unit, scope by scope, until a hypothesis makes it agree.

    Args:
        model: The grafted model (changed in place where a hypothesis is kept).
        view: The plan's steps (edited where a hypothesis is kept).
        state: The model's tensors by key.
        unit: Where outputs diverge, and the scopes to search.
        dimensions: A scope's decision points.
        rtol: Tolerance relative to the reference's largest magnitude.
        budget: Forward passes to spend at most.

    Returns:
        What was kept (if anything) and tried.
    """
    found = Searched()
    seen: set[str] = set()  # a hypothesis gives the unit the same output in any scope
    for scope in unit.scopes:
        for choice in choices(dimensions(scope[0]), budget - found.trials):
            if choice.describe() in seen:
                continue
            seen.add(choice.describe())
            found.trials += 1
            outcome = _trial(model, view, state, scope, unit, choice, rtol)
            found.tried.append(f"{choice.describe()}: {outcome or KEPT}")
            if not outcome:
                found.choice, found.scope = choice, scope[0]
                return found
        if found.trials >= budget:
            break
    return found


def same_type(scope: str, modules: Mapping[str, nn.Module]) -> list[tuple[str, str]]:
    """The other units of a scope's type: its block's siblings in their container.

    Returns:
        (block, sibling block) pairs: the scope's nearest numbered ancestor (or itself), and
        each other numbered module of its container of the same class.
    """
    parts = scope.split(".")
    last = max((k for k, part in enumerate(parts) if numbered(part)), default=-1)
    if last < 0:
        return []
    block = ".".join(parts[: last + 1])
    container = ".".join(parts[:last])
    kind = type(modules[block]) if block in modules else None
    prefix = f"{container}." if container else ""
    return [(block, path) for path, module in modules.items()
            if path != block and path.startswith(prefix) and "." not in path[len(prefix):]
            and numbered(path[len(prefix):]) and type(module) is kind]
