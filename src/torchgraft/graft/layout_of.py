"""A model's weights in another checkpoint's names and layout (``tg.save(layout_of=...)``).

The graft that would fill the model from that checkpoint is planned (from metadata alone:
nothing of the checkpoint is read), then run backwards (:mod:`~torchgraft.graft.plan.reverse`).
A file is only written when it holds the whole model in the checkpoint's layout, with every
pairing known: a model of another configuration (a block more or less, another width) is an
error naming what does not fit, never a wrong file.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..errors import TorchgraftError
from .layouts.rules import RulesSpec
from .plan.build import plan_graft
from .plan.reverse import Reversed, reverse_plan
from .plan.steps import Plan
from .report.report import GraftReport
from .sides.model import module_side, state_tensors, unwrap
from .sides.source import SourceLike, open_source

__all__ = ["LayoutOf", "in_layout_of"]

logger = logging.getLogger("torchgraft")

#: What ``layout_of`` takes: a checkpoint (anything ``tg.graft`` reads), or a graft's plan.
LayoutOf = SourceLike | Plan | GraftReport

_SHOWN = 5


def _plan(model: nn.Module, layout_of: LayoutOf, rules: RulesSpec) -> tuple[Plan, list[str]]:
    """The plan of a graft from ``layout_of`` into ``model``, and its guesses left unsettled.

    A report's guesses are those its outputs did not settle (none once verified).
    """
    if isinstance(layout_of, GraftReport):
        if layout_of.plan is None:
            raise TorchgraftError("this report holds no plan: pass the checkpoint itself as "
                                  "layout_of")
        return layout_of.plan, list(layout_of.guesses)
    if not isinstance(layout_of, Plan):
        target = module_side(model, None)
        with open_source(layout_of) as opened:
            layout_of = plan_graft(opened, target, rules=rules).plan
    return layout_of, list(layout_of.guesses)


def _listed(problems: dict[str, str]) -> str:
    shown = [f"'{key}': {why}" for key, why in list(problems.items())[:_SHOWN]]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _check(reversed_: Reversed, plan: Plan, guesses: list[str], *,
           allow_incomplete: bool) -> None:
    """Refuse a file that would not hold the whole model, or rests on guesses."""
    problems = reversed_.problems()
    if problems and not allow_incomplete:
        raise TorchgraftError(f"the model does not fit the checkpoint's layout ({len(problems)} "
                              f"keys): {_listed(problems)}. A model of another configuration "
                              "(a block more or less, another width) cannot be written in its "
                              "layout; pass allow_incomplete=True (CLI: --allow-incomplete) to "
                              "write what fits")
    if guesses and not allow_incomplete:
        raise TorchgraftError(
            f"{len(guesses)} of the model's tensors were paired with the checkpoint's layout by "
            f"a guess ('{guesses[0]}': {plan.guesses[guesses[0]].why}): settle them with rules "
            "that name them (CLI: --layout-rules FILE), or, in Python, pass as layout_of the "
            "report of a graft whose outputs were compared; or pass allow_incomplete=True (CLI: "
            "--allow-incomplete) to write the file anyway")
    if problems:
        logger.warning("written without %d keys of the checkpoint's layout: %s", len(problems),
                       _listed(problems))


def in_layout_of(model: nn.Module, layout_of: LayoutOf, *, rules: RulesSpec = None,
                 allow_incomplete: bool = False) -> dict[str, torch.Tensor]:
    """A model's weights under the names, layouts and dtypes a checkpoint stores them with.

    Args:
        model: The model (wrappers are stripped).
        layout_of: The checkpoint whose layout to write (a path, a state dict, a module, a
            :func:`torchgraft.open` result), or the plan (or report) of a graft from it.
        rules: The rules a graft from that checkpoint into the model needs.
        allow_incomplete: Give what fits when the model does not fit the layout, or some
            pairings are guesses (logged as a warning) instead of raising.

    Returns:
        The checkpoint's keys, in its stored order, with the model's values.

    Raises:
        TorchgraftError: If the model does not fit the layout (naming the keys and why), a
            pairing is a guess, or the checkpoint cannot be read.
    """
    target = unwrap(model)
    plan, guesses = _plan(target, layout_of, rules)
    reversed_ = reverse_plan(plan, state_tensors(target))
    _check(reversed_, plan, guesses, allow_incomplete=allow_incomplete)
    bookkeeping = [k for k in reversed_.lacking if k not in reversed_.problems()]
    if bookkeeping:
        logger.info("bookkeeping buffers of the layout the model lacks, not written: %s",
                    ", ".join(bookkeeping))
    return reversed_.tensors
