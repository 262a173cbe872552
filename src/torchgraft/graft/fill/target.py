"""Filling a model from a plan: storage, shards, every step; writes read back; the rest computed.

Storage for a meta model, each rank's shards, every step of the plan; then every write read
back through the model's state dict, and what no checkpoint holds computed by the model's own
code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...meta import TensorRef
from ..plan.steps import Plan
from ..sides.model import state_tensors
from ..sides.walk import ModelTensors
from .confirm import Confirmed, confirm_writes
from .dtensor import agree_on_ranks, fill_sharded, materialise_sharded
from .execute import execute_plan
from .initialise import Initialised, initialise_left
from .materialise import META_DEFAULTS, materialise

__all__ = ["Filled", "Filling", "fill_model"]


@dataclass(frozen=True)
class Filling:
    """How a model is filled: where a meta model's storage goes, with what progress.

    Attributes:
        tensors: The model's tensors, walked once (whether any is on meta, who holds each).
        device: Where tensors of a meta model get their storage; by default where its other
            tensors are, else the CPU.
        progress: Called with (tensors done, total) as tensors are filled.
        sharded: The model's DTensor tensors by key (FSDP2, tensor parallel): each rank fills
            its own shards.
        assign: Whether a meta model's tensors stored as they are may become the checkpoint's
            own (memory-mapped) tensors; else each gets storage of its own.
    """

    tensors: ModelTensors
    device: str | torch.device | None = None
    progress: Callable[[int, int], None] | None = None
    sharded: dict[str, Any] | None = None
    assign: bool = True


@dataclass
class Filled:
    """What a fill did beyond the plan's steps.

    Attributes:
        confirmed: What reading the state dict back found: keys filled again through a
            module's own ``load_state_dict``, keys whose writes do not show.
        initialised: What the model's own code computed (on a meta model), and what it could
            not.
    """

    confirmed: Confirmed = field(default_factory=Confirmed)
    initialised: Initialised = field(default_factory=Initialised)


def fill_model(plan: Plan, refs: dict[str, TensorRef], model: nn.Module,
               filling: Filling) -> Filled:
    """Give a meta model storage, fill sharded tensors, run the plan, and confirm every write.

    Every key written (and every tie) is read back through the model's own ``state_dict()``
    (:mod:`.confirm`); then, on a meta model, what is still on meta is computed by the model's
    own code (:mod:`.initialise`).

    Args:
        plan: The plan.
        refs: Source key to lazy tensor (virtual ones included).
        model: The unwrapped model, filled in place.
        filling: How.

    Returns:
        What confirming and initialising found.
    """
    sharded = filling.sharded or {}
    state = filling.tensors.state
    assigned: set[str] = set()
    where = (torch.device(filling.device) if filling.device is not None
             else filling.tensors.device or torch.device("cpu"))
    if filling.tensors.on_meta:
        assigned = _materialise(plan, refs, model, filling, where)
    if sharded:
        fill_sharded(plan, refs, sharded)
        state = state_tensors(model)  # materialise updated ``state``; DTensors anew
    execute_plan(plan, refs, state, progress=filling.progress, assigned=assigned | set(sharded))
    written = {s.target: state[s.target] for s in plan.steps if s.target in state}
    written.update({key: written[other] for key, other in plan.tied.items()
                    if other in written and key in state})
    confirmed = confirm_writes(model, written, refill=not sharded,
                               held=filling.tensors.modules if filling.tensors.plain else None)
    if sharded:  # every rank reports the same keys
        confirmed.unconfirmed = agree_on_ranks(confirmed.unconfirmed)
    filled = Filled(confirmed)
    if filling.tensors.on_meta:
        filled.initialised = initialise_left(model, filling.tensors, where, skip=set(sharded))
    return filled


def _materialise(plan: Plan, refs: dict[str, TensorRef], model: nn.Module,
                 filling: Filling, where: torch.device) -> set[str]:
    """Storage for a meta model's filled tensors, read straight into it where stored as is.

    They go where ``device=`` says, else where the model's real tensors are, else the CPU.
    """
    device, sharded = filling.device, filling.sharded or {}
    filled = [s.target for s in plan.steps]
    zeroed = _zeroed(plan)
    assigned = materialise(model, [k for k in filled if k not in sharded], where,
                           zeroed=[k for k in zeroed if k not in sharded],
                           values=_as_stored(plan, refs) if where.type == "cpu" and
                           filling.assign else {},
                           state=filling.tensors.state, tensors=filling.tensors)
    if sharded:
        materialise_sharded(model, sharded, [*filled, *zeroed],
                            where if device is not None else None)
    return assigned


def _zeroed(plan: Plan) -> list[str]:
    """Keys whose new storage starts as zeros: adapted, re-initialised or defaulted tensors."""
    return [s.target for s in plan.steps if s.ops] + list(plan.reinitialised) + [
        k for k in plan.missing if any(p.search(k) for p in META_DEFAULTS)]


def _as_stored(plan: Plan, refs: dict[str, TensorRef]) -> dict[str, TensorRef]:
    """Keys copied as stored, to the lazy tensor whose read is the checkpoint's own tensor."""
    return {s.target: refs[s.source] for s in plan.steps if not s.ops and not s.cast}
