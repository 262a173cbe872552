"""Executing a plan: each source tensor is read, adapted, copied into its parameter, released."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import torch

from ..meta import TensorRef
from .adapt import fresh_values
from .plan import Plan

__all__ = ["execute_plan"]

logger = logging.getLogger("torchgraft")


def execute_plan(plan: Plan, refs: dict[str, TensorRef], targets: dict[str, torch.Tensor], *,
                 progress: Callable[[int, int], None] | None = None,
                 assigned: Collection[str] = ()) -> None:
    """Fill the target tensors in place, one at a time; give re-initialised ones fresh values.

    A plain copy into a contiguous CPU tensor of the same dtype reads the file straight into
    the parameter's memory, so no second copy of the weights ever exists.

    Args:
        plan: The plan.
        refs: Source key to lazy tensor.
        targets: Target key to the model's parameter or buffer (filled in place).
        progress: Called with (tensors done, total) after each tensor.
        assigned: Target keys already holding their checkpoint values (on a meta model).
    """
    with torch.no_grad():
        for done, step in enumerate(plan.steps, start=1):
            ref, out = refs[step.source], targets[step.target]
            if step.target in assigned:
                pass
            elif step.ops:
                tensor = ref.read()
                for op in step.ops:
                    tensor = op.apply(tensor, out.detach().cpu())
                out.copy_(tensor)
                logger.debug("filled %s from %s (%s)", step.target, step.source, step.describe())
            else:
                ref.read_into(out)
            if progress is not None:
                progress(done, len(plan.steps))
        if plan.init != "keep":
            for key in plan.reinitialised:
                out = targets[key]
                out.copy_(fresh_values(out.detach(), plan.init))
