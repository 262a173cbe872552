"""Executing a plan: each source tensor is read, adapted, copied into its parameter, released."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection

import torch

from ...io.reads import plan_read, read_all
from ...io.staging import StagedFiller
from ...meta import TensorRef
from ..plan.adapt import Step, applied, fresh_values
from ..plan.steps import Plan, PlanStep

__all__ = ["READERS", "execute_plan"]

#: Threads reading plain copies at once.
READERS = min(4, os.cpu_count() or 1)

logger = logging.getLogger("torchgraft")


def execute_plan(plan: Plan, refs: dict[str, TensorRef], targets: dict[str, torch.Tensor], *,
                 progress: Callable[[int, int], None] | None = None,
                 assigned: Collection[str] = ()) -> None:
    """Fill the target tensors in place; give re-initialised ones fresh values.

    A plain copy into a contiguous CPU tensor of the same dtype reads the file straight into
    the parameter's memory, so no second copy of the weights ever exists. Plain copies are
    read in runs of neighbouring byte ranges, one ``preadv`` per run, dealt into batches for
    a few threads (:data:`READERS`; :mod:`~torchgraft.io.reads`): reads release the GIL,
    so tensors, and the shards of a sharded checkpoint, are read in parallel. Tensors on an
    accelerator go through pinned staging buffers, each read overlapping the previous
    copy (:class:`~torchgraft.io.staging.StagedFiller`). Adapted tensors are filled one at
    a time.

    Args:
        plan: The plan.
        refs: Source key to lazy tensor.
        targets: Target key to the model's parameter or buffer (filled in place).
        progress: Called with (tensors done, total) after each tensor.
        assigned: Target keys already holding their checkpoint values (on a meta model, or
            the shards of a sharded model); they are neither read nor re-initialised here.
    """
    done = 0

    def tick(count: int = 1) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, len(plan.steps))

    plain = [s for s in plan.steps if not s.ops and s.target not in assigned]
    with torch.no_grad():
        _fill_staged([s for s in plain if targets[s.target].device.type != "cpu"], refs,
                     targets, tick)
        _fill_adapted(plan, refs, targets, assigned, tick)
        read_all([plan_read(s.source, refs[s.source], targets[s.target]) for s in plain
                  if targets[s.target].device.type == "cpu"], threads=READERS,
                 done=tick)
        if plan.init != "keep":
            for key in [k for k in plan.reinitialised if k not in assigned]:
                out = targets[key]
                out.copy_(fresh_values(out.detach(), plan.init))


def _fill_staged(steps: list[PlanStep], refs: dict[str, TensorRef],
                 targets: dict[str, torch.Tensor], tick: Callable[[], None]) -> None:
    """Plain copies bound for an accelerator, through pinned staging buffers."""
    fillers: dict[torch.device, StagedFiller] = {}
    for step in steps:
        out = targets[step.target]
        if out.device not in fillers:
            fillers[out.device] = StagedFiller(out.device)
        fillers[out.device].fill(refs[step.source], out)
        tick()
    for filler in fillers.values():
        filler.finish()


def _widened(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A floating tensor in the target's dtype where that is wider, before any operation.

    Operations then compute at the target's precision: a bfloat16 ``gamma - 1`` plus 1 is
    exact in a float32 model, not rounded in bfloat16 first. Layout operations are the same
    either way; a narrower target rounds once, when the result is copied in.
    """
    if tensor.is_floating_point() and dtype.is_floating_point and \
            torch.promote_types(tensor.dtype, dtype) == dtype != tensor.dtype:
        return tensor.to(dtype)
    return tensor


def _fill_adapted(plan: Plan, refs: dict[str, TensorRef], targets: dict[str, torch.Tensor],
                  assigned: Collection[str], tick: Callable[[], None]) -> None:
    """Tensors with operations, one at a time; assigned ones only counted."""
    for step in plan.steps:
        if step.ops and step.target not in assigned:
            out = targets[step.target]
            if not step.cast and all(isinstance(op, Step) and op.identity for op in step.ops):
                refs[step.source].read_into(out)  # stacked experts: each into its slice
            else:
                tensor = _widened(refs[step.source].read(), out.dtype)
                for op in step.ops:
                    tensor = applied(op, tensor, out.detach())
                out.copy_(tensor)
            logger.debug("filled %s from %s (%s)", step.target, step.source, step.describe())
        if step.ops or step.target in assigned:
            tick()
