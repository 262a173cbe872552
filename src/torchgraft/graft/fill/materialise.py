"""Real storage for targets built on the meta device, like ``load_state_dict(assign=True)``.

A model built under ``with torch.device("meta")`` has shapes but no memory; copying into a
meta tensor does nothing. Each tensor a graft fills gets new storage on the chosen device,
installed in every module that holds it (ties stay tied), as an ``nn.Parameter`` with its
``requires_grad`` where it was one. A tensor copied as it is stored becomes the checkpoint's
own (memory-mapped where the format allows); the others are read into new storage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ...meta import TensorRef
from ..sides.model import tied_keys
from ..sides.walk import ModelTensors

__all__ = ["META_DEFAULTS", "materialise"]

#: Bookkeeping buffers a checkpoint may lack, with the value a fresh module gives them.
META_DEFAULTS = {re.compile(r"(^|\.)num_batches_tracked$"): 0}


def materialise(model: nn.Module, keys: Iterable[str], device: torch.device, *,
                zeroed: Iterable[str] = (),
                values: Mapping[str, TensorRef] | None = None,
                state: dict[str, torch.Tensor] | None = None,
                tensors: ModelTensors | None = None) -> set[str]:
    """Give real storage to the meta tensors among ``keys`` (state-dict names).

    Args:
        model: The unwrapped target.
        keys: The state-dict keys a graft fills; those on meta get uninitialised storage.
        device: Where the new storage goes.
        zeroed: Keys whose new storage starts as zeros (adapted or defaulted tensors).
        values: Keys whose storage is the checkpoint's own tensor, as read (a memory-mapped
            view of the file where the format allows: no copy at all), like
            ``load_state_dict(assign=True)``.
        state: The model's ``state_dict(keep_vars=True)`` tensors, if already known; a dict
            is updated in place with the new tensors.
        tensors: Its tensors, if already walked.

    Returns:
        The keys given their checkpoint values: nothing more to read for them.
    """
    state = model.state_dict(keep_vars=True) if state is None else state
    others: dict[int, list[str]] = {}  # a tied tensor's keys (several names, one tensor)
    for later, first in tied_keys(state).items():
        others.setdefault(id(state[first]), [first]).append(later)
    holders = (ModelTensors(model.named_modules()) if tensors is None else tensors).holders
    zero = set(zeroed)
    values = values or {}
    assigned: set[str] = set()
    for key in [*keys, *zero]:  # tens of thousands of small tensors: a tight loop
        old = state.get(key)
        if old is None or not old.is_meta:  # done already (under a tied name too)
            continue
        ref = values.get(key)
        if ref is not None:
            new = ref.read()
            assigned.add(key)
        else:
            new = (torch.zeros if key in zero else torch.empty)(old.shape, dtype=old.dtype,
                                                                  device=device)
        if isinstance(old, nn.Parameter):
            new = nn.Parameter(new, requires_grad=old.requires_grad)
        ident = id(old)
        for store, name in holders.get(ident, ()):
            store[name] = new
        tied = others.get(ident)
        if tied is None:
            state[key] = new
        else:
            for name in tied:
                state[name] = new
    return assigned
