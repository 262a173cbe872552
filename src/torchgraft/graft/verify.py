"""Verification: run source and target on the same inputs and compare their outputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import TorchgraftError
from .sides import run_model

__all__ = ["first_tensor", "max_abs_diff"]


def first_tensor(output: Any) -> torch.Tensor:
    """The output to compare: a tensor, a mapping's (ModelOutput's) first tensor, a tuple's first.

    Args:
        output: What a module returned.

    Returns:
        The first tensor found.

    Raises:
        TorchgraftError: If the output holds no tensor.
    """
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, Mapping) else output
    if isinstance(values, (list, tuple)) or isinstance(output, Mapping):
        for value in values:
            if value is not None:
                try:
                    return first_tensor(value)
                except TorchgraftError:
                    continue
    raise TorchgraftError(f"the module's output ({type(output).__name__}) holds no tensor")


def max_abs_diff(source: nn.Module, target: nn.Module, example_inputs: Any) -> float:
    """Largest absolute difference between two modules' outputs, both in eval mode.

    Args:
        source: The source module.
        target: The grafted model.
        example_inputs: Positional inputs (a tuple, or a lone tensor).

    Returns:
        The maximum absolute difference of the first output tensors.

    Raises:
        TorchgraftError: If the outputs' shapes differ.
    """
    modes = [(m, m.training) for m in (source, target)]
    try:
        source.eval()
        target.eval()
        a = first_tensor(run_model(source, example_inputs))
        b = first_tensor(run_model(target, example_inputs))
    finally:
        for module, training in modes:
            module.train(training)
    if a.shape != b.shape:
        raise TorchgraftError(f"cannot compare outputs of shapes {tuple(a.shape)} and "
                              f"{tuple(b.shape)}")
    return float((a.double() - b.double().to(a.device)).abs().max()) if a.numel() else 0.0
