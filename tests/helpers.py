"""Reference models and checks shared by the tests."""

from __future__ import annotations

import copy
import gc
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn


class SmallNet(nn.Module):
    """Conv + BatchNorm + Linear: parameters, running statistics and an integer buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def small_net(seed: int = 0) -> SmallNet:
    """A SmallNet with random weights and random BatchNorm statistics."""
    torch.manual_seed(seed)
    model = SmallNet()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    model.bn.num_batches_tracked.fill_(17)
    return model


def assert_same_tensor(actual: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    """Same dtype, shape and bytes (bit for bit, NaNs included)."""
    assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    a = actual.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    e = expected.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(a, e), f"values of '{name}' differ"


def assert_same_state(actual: Mapping[str, torch.Tensor],
                      expected: Mapping[str, torch.Tensor], *, ordered: bool = True) -> None:
    """Same names (in the same order when ``ordered``) and bit-identical tensors."""
    if ordered:
        assert list(actual) == list(expected)
    else:
        assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert_same_tensor(actual[name], tensor, name)


def data_parallel_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``nn.DataParallel(model).state_dict()`` on the CPU, ``model`` left where it is.

    On a machine with a GPU, ``nn.DataParallel`` moves the module it wraps to ``cuda:0``: it
    wraps a copy here, and the state dict's tensors come back to the CPU.
    """
    state = nn.DataParallel(copy.deepcopy(model)).state_dict()
    return {key: tensor.cpu() for key, tensor in state.items()}


def paddle_resnet18() -> Any:
    """paddle.vision's ResNet-18 (10 classes, seeded) with running statistics away from 0 and
    1, in eval mode: a real Paddle model to save with ``paddle.save``."""
    import paddle
    from paddle.vision.models import resnet18

    paddle.seed(0)
    model = resnet18(num_classes=10)
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer._mean.set_value(paddle.rand(layer._mean.shape) * 0.2 - 0.1)
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
    model.eval()
    return model


def save_on(device: str, obj: object, path: Path, **kwargs: object) -> None:
    """torch.save as if every tensor lived on ``device``: no GPU needed."""
    with mock.patch("torch.serialization.location_tag", return_value=device):
        torch.save(obj, path, **kwargs)  # type: ignore[arg-type]


class Payload:
    """A pickle payload that creates a marker file when unpickled by a naive loader."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


#: How much more 4x the items may cost: linear is 4x, a quadratic step 16x.
SCALING_LIMIT = 6.0


def cpu_seconds(work: Callable[[], object], repeat: int = 3) -> float:
    """The CPU seconds of this process ``work`` takes, the best of ``repeat`` runs.

    What the process held before is frozen out of the garbage collector's view, so a full
    collection during ``work`` costs what ``work`` made, not the million objects torch and
    the test session keep (a step that would look like a quadratic cost).
    """
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.freeze()
        try:
            start = time.process_time()
            work()
            best = min(best, time.process_time() - start)
        finally:
            gc.unfreeze()
    return best


def assert_scales_linearly(seconds: Callable[[int], float], items: int) -> None:
    """4x the items cost at most :data:`SCALING_LIMIT` times the time of ``items``."""
    small, large = seconds(items), seconds(4 * items)
    assert large <= SCALING_LIMIT * small, (items, small, large)


def operations(work: Callable[[], object]) -> int:
    """How many Python functions and builtins ``work`` calls: its work, counted, not timed.

    Deterministic, so a test of how work grows holds on a loaded machine; work inside one
    builtin (a regular expression, the C unpickler) counts once, as its caller's step.
    """
    count = 0

    def profile(_frame: object, event: str, _arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


#: How many more operations 4x the items may make: linear is 4x (less, with a fixed part), a
#: quadratic step 16x.
OPERATIONS_LIMIT = 4.5


def assert_operations_scale_linearly(operations_of: Callable[[int], int], items: int) -> None:
    """4x the items make at most :data:`OPERATIONS_LIMIT` times the operations of ``items``."""
    small, large = operations_of(items), operations_of(4 * items)
    assert large <= OPERATIONS_LIMIT * small, (items, small, large)
