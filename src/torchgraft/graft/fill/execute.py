"""Executing a plan: each source tensor is read, adapted, copied into its parameter, released."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator

import torch

from ...io.reads import READERS, plan_read, read_all
from ...meta import TensorRef
from ..plan.adapt import Step, applied, fresh_values
from ..plan.steps import Plan, PlanStep

__all__ = ["ADAPTED_BYTES", "execute_plan"]

#: Bytes of source tensors held on an accelerator at once while their adaptations run there.
ADAPTED_BYTES = 256 * 1024 * 1024

logger = logging.getLogger("torchgraft")


def execute_plan(plan: Plan, refs: dict[str, TensorRef], targets: dict[str, torch.Tensor], *,
                 progress: Callable[[int, int], None] | None = None,
                 assigned: Collection[str] = ()) -> None:
    """Fill the target tensors in place; give re-initialised ones fresh values.

    Every tensor copied as it is stored (a cast aside) goes through one pipeline
    (:func:`~torchgraft.io.reads.read_all`): a pool of readers (:data:`READERS`) reads the
    files in pieces, several shards and several regions of one file at once; into a
    contiguous CPU tensor of the same dtype the bytes go straight into the parameter's memory
    (no second copy), and towards an accelerator through a ring of staging buffers (pinned
    for CUDA), each copy to the device issued on the reader's own stream while the next piece
    is read. Adapted tensors bound for an accelerator are read onto it through the
    same pipeline, a group at a time (:data:`ADAPTED_BYTES`), and adapted there; on the CPU
    they are adapted one at a time.

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

    plain = [s for s in plan.steps if s.target not in assigned and _stored(s)]
    tick(sum(1 for s in plan.steps if s.target in assigned))
    with torch.no_grad():
        _fill_adapted([s for s in plan.steps if s.target not in assigned and not _stored(s)],
                      refs, targets, tick)
        read_all([plan_read(s.source, refs[s.source], targets[s.target]) for s in plain],
                 threads=READERS, done=tick)
        if plan.init != "keep":
            for key in [k for k in plan.reinitialised if k not in assigned]:
                out = targets[key]
                out.copy_(fresh_values(out.detach(), plan.init))


def _stored(step: PlanStep) -> bool:
    """Whether the step copies the source as it is (a cast aside): no operation but identities.

    A virtual source, such as stacked experts, fills each part into its slice.
    """
    return all(isinstance(op, Step) and op.identity for op in step.ops)


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


def _adapt(step: PlanStep, tensor: torch.Tensor, out: torch.Tensor) -> None:
    """Apply the step's operations to the source tensor (on its device); copy the result in."""
    tensor = _widened(tensor, out.dtype)
    for op in step.ops:
        tensor = applied(op, tensor, out.detach())
    out.copy_(tensor)
    logger.debug("filled %s from %s (%s)", step.target, step.source, step.describe())


def _fill_adapted(steps: list[PlanStep], refs: dict[str, TensorRef],
                  targets: dict[str, torch.Tensor], tick: Callable[[int], None]) -> None:
    """Tensors with operations: on the CPU one at a time; on an accelerator, where they run."""
    far = [s for s in steps if targets[s.target].device.type not in ("cpu", "meta")]
    for step in steps:
        if targets[step.target].device.type in ("cpu", "meta"):
            _adapt(step, refs[step.source].read(), targets[step.target])
            tick(1)
    for group in _groups(far, refs):
        sources = [torch.empty(refs[s.source].meta.shape, dtype=refs[s.source].meta.dtype,
                               device=targets[s.target].device) for s in group]
        read_all([plan_read(s.source, refs[s.source], source)
                  for s, source in zip(group, sources, strict=True)], threads=READERS)
        for step, source in zip(group, sources, strict=True):
            _adapt(step, source, targets[step.target])
            tick(1)


def _groups(steps: list[PlanStep], refs: dict[str, TensorRef]) -> Iterator[list[PlanStep]]:
    """Steps in groups whose sources hold at most :data:`ADAPTED_BYTES` (or one tensor)."""
    group: list[PlanStep] = []
    size = 0
    for step in steps:
        nbytes = refs[step.source].meta.nbytes
        if group and size + nbytes > ADAPTED_BYTES:
            yield group
            group, size = [], 0
        group.append(step)
        size += nbytes
    if group:
        yield group
