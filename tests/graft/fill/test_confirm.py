"""Every write confirmed: keys read back through the model's own state_dict().

A model whose attention keeps one fused parameter and hands out ``wq``/``wk``/``wv`` through
state-dict hooks (training frameworks keep a checkpoint's layout apart from their fused kernels
this way) is filled through its own ``load_state_dict``; its twin whose writes are discarded
(no load hook) is reported missing, never loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Verdict
from torchgraft.graft.fill.confirm import differs

DIM = 8
PARTS = ("wq", "wk", "wv")


class FusedAttention(nn.Module):
    """One fused ``wqkv`` parameter, saved and loaded as ``wq``, ``wk``, ``wv`` by hooks."""

    def __init__(self, *, load_hook: bool = True, failing: bool = False) -> None:
        super().__init__()
        self.wqkv = nn.Parameter(torch.randn(3 * DIM, DIM))
        self.wo = nn.Linear(DIM, DIM)
        self._register_state_dict_hook(FusedAttention._split)
        if load_hook:
            self._register_load_state_dict_pre_hook(
                FusedAttention._refuse if failing else FusedAttention._fuse)

    @staticmethod
    def _split(module: nn.Module, state: dict[str, Any], prefix: str, _meta: Any) -> None:
        fused = state.pop(prefix + "wqkv")
        for name, part in zip(PARTS, fused.chunk(3), strict=True):
            state[prefix + name] = part.clone()  # copies: writing into them changes nothing

    @staticmethod
    def _fuse(state: dict[str, Any], prefix: str, *_args: Any) -> None:
        if all(prefix + n in state for n in PARTS):
            state[prefix + "wqkv"] = torch.cat([state.pop(prefix + n) for n in PARTS])

    @staticmethod
    def _refuse(state: dict[str, Any], prefix: str, *_args: Any) -> None:
        raise RuntimeError("this checkpoint layout is not supported")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (x @ self.wqkv.T).chunk(3, -1)
        return self.wo(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


def _model(device: str = "cpu", **kwargs: Any) -> nn.Module:
    with torch.device(device):
        return nn.Sequential(FusedAttention(**kwargs), FusedAttention(**kwargs))


X = torch.randn(2, 3, DIM, generator=torch.Generator().manual_seed(1))


def _same(model: nn.Module, source: nn.Module) -> bool:
    with torch.no_grad():
        return torch.allclose(model.eval()(X), source.eval()(X))


@pytest.fixture
def saved(tmp_path: Path) -> tuple[nn.Module, Path]:
    torch.manual_seed(0)
    source = _model()
    torch.save(source.state_dict(), tmp_path / "fused.pt")
    return source, tmp_path / "fused.pt"


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_hook_fused_model_is_filled_through_its_own_load_and_confirmed(
        saved: tuple[nn.Module, Path], device: str) -> None:
    source, path = saved
    model = _model(device)
    report = tg.graft(path, model)
    assert report.verdict is Verdict.OK, str(report)
    assert sorted(report.loaded) == sorted(source.state_dict())
    assert _same(model, source)
    assert any("'0' hands out copies" in w and "load_state_dict" in w for w in report.warnings)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_twin_whose_writes_are_discarded_is_reported_missing(
        saved: tuple[nn.Module, Path], device: str) -> None:
    source, path = saved
    model = _model(device, load_hook=False)  # hands out copies, and nothing takes them back
    report = tg.graft(path, model)
    assert report.verdict is Verdict.INCOMPLETE
    for index in range(2):
        for part in PARTS:
            key = f"{index}.{part}"
            assert key in report.missing and key not in report.loaded
            assert "does not show it" in report.reasons[key]
            assert f"module '{index}'" in report.reasons[key]
    assert {f"{i}.wo.weight" for i in range(2)} <= set(report.loaded)
    if device == "cpu":
        assert not _same(model, source)


def test_hooks_that_fail_on_load_are_named_and_nothing_is_claimed(
        saved: tuple[nn.Module, Path]) -> None:
    _source, path = saved
    model = _model(failing=True)
    report = tg.graft(path, model)
    assert report.verdict is Verdict.INCOMPLETE
    reason = report.reasons["0.wq"]
    assert "module '0'" in reason and "RuntimeError" in reason and "not supported" in reason
    assert not any(k.endswith(PARTS) for k in report.loaded)


def test_a_plain_model_is_confirmed_without_reading_its_bytes() -> None:
    """The tensor read back is the one written: no sample taken (its values do not matter)."""
    weight = torch.randn(4, 4)
    assert differs(weight, weight) is None
    assert differs(weight.detach(), weight) is None  # the same memory
    assert differs(weight.clone(), weight) is None  # a copy of the same values
    other = weight.clone()
    other[3, 3] += 1  # the last element is always in the sample
    assert differs(other, weight) is not None
    assert "meta" in str(differs(torch.empty(4, 4, device="meta"), weight))
    assert "not in it" in str(differs(None, weight))
    assert differs(torch.zeros(2, 8), weight) is not None  # another shape


def test_read_back_samples_a_bounded_number_of_elements() -> None:
    """A copy of a large tensor is compared on a few elements, spread from first to last."""
    from torchgraft.graft.fill.confirm import SAMPLE, _spread

    index = _spread((1000, 1000), 1_000_000)
    assert all(len(i) == SAMPLE for i in index)
    assert (int(index[0][0]), int(index[1][0])) == (0, 0)
    assert (int(index[0][-1]), int(index[1][-1])) == (999, 999)
