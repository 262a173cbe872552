"""Executing a plan: each source tensor is read, adapted, copied into its parameter, released."""

from __future__ import annotations

import logging

import torch

from ..meta import TensorRef
from .plan import Plan

__all__ = ["execute_plan"]

logger = logging.getLogger("torchgraft")


def execute_plan(plan: Plan, refs: dict[str, TensorRef], targets: dict[str, torch.Tensor]) -> None:
    """Fill the target tensors in place, one at a time.

    A plain copy into a contiguous CPU tensor of the same dtype reads the file straight into
    the parameter's memory, so no second copy of the weights ever exists.

    Args:
        plan: The plan.
        refs: Source key to lazy tensor.
        targets: Target key to the model's parameter or buffer (filled in place).
    """
    with torch.no_grad():
        for step in plan.steps:
            ref, out = refs[step.source], targets[step.target]
            if not step.ops:
                ref.read_into(out)
                continue
            tensor = ref.read()
            for op in step.ops:
                tensor = op.apply(tensor, out.detach().cpu())
            out.copy_(tensor)
            logger.debug("filled %s from %s (%s)", step.target, step.source, step.describe())
