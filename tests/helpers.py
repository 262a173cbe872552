"""Reference models and checks shared by the tests."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
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


#: The most operations (:func:`calls`) a refusal of a hostile file may take: a bound, not a
#: walk of what the file claims (a 2^40-element tensor, 100,000 levels of nesting, 9^9 strings).
BOUNDED = 500_000
#: The most operations reading a hostile file may take per byte of it, after a first
#: :data:`BOUNDED`: linear in what the file holds (a pickle of 100,000 levels is 100,000
#: opcodes to read), never in what it claims.
PER_BYTE = 64


def linear_in_file(path: Path) -> int:
    """The most operations reading ``path`` (a file, or a folder's files) may take."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return BOUNDED + PER_BYTE * sum(p.stat().st_size for p in files)
#: How much more 4x the items may cost: linear is 4x, a quadratic step 16x.
SCALING_LIMIT = 6.0


#: Where the code whose lines are counted one by one lives: torchgraft's and the tests'.
_COUNTED = tuple(str(Path(__file__).resolve().parents[1] / part) for part in ("src", "tests"))


def calls(work: Callable[[], object]) -> int:
    """The operations ``work`` runs: its cost, counted, not timed.

    Every function call anywhere, Python's and builtins' (a regular expression, the C
    unpickler: one each), and every line of this checkout's code (torchgraft's and the
    tests') that runs, so a loop over keys counts once per key and a loop inside it once per
    pair. A count does not change with the machine's load (a timed ratio here once failed
    under another suite's load), so the suite asserts on counts and ``bench/`` keeps the
    times. A scan inside one builtin (``key in a_list``) counts once: tests of such steps
    count what they visit instead.
    """
    count = 0

    def line(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        count += event == "line"
        return line

    def traced(frame: FrameType, event: str, arg: object) -> Any:
        return line if frame.f_code.co_filename.startswith(_COUNTED) else None

    def profile(_frame: object, event: str, _arg: object) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    previous = sys.gettrace(), sys.getprofile()
    sys.settrace(traced)
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.settrace(previous[0])
        sys.setprofile(previous[1])
    return count


def assert_scales_linearly(cost: Callable[[int], int], items: int) -> None:
    """4x the items cost at most :data:`SCALING_LIMIT` times the calls of ``items``.

    ``cost(n)`` counts the operations of the work on ``n`` items (:func:`calls`); a first, smaller
    run is made and not counted, so what runs once (an import, a cache filled) is not counted
    against the small run.
    """
    cost(max(items // 4, 1))
    small, large = cost(items), cost(4 * items)
    assert large <= SCALING_LIMIT * small, (items, small, large)
