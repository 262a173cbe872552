"""The caller's modules are never changed: ``source_model=`` is filled as a copy, and a module
given as the source is only read (run in its own mode, its running statistics put back)."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Verdict

X = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _unchanged(module: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = module.state_dict()
    return after.keys() == before.keys() and all(torch.equal(after[k], v)
                                                  for k, v in before.items())


def test_source_model_is_filled_as_a_copy(tmp_path: Path) -> None:
    torch.manual_seed(1)
    torch.save(_net().state_dict(), tmp_path / "net.pt")
    torch.manual_seed(2)
    mine = _net().eval()  # the caller's own weights, not the file's
    before, objects = _snapshot(mine), list(mine.parameters())
    report = tg.graft(tmp_path / "net.pt", _net(), source_model=mine, example_inputs=(X,))
    assert report.verdict is Verdict.OK and report.max_abs_diff is not None
    assert _unchanged(mine, before) and list(mine.parameters()) == objects


def test_a_source_module_in_training_mode_keeps_its_statistics_and_mode() -> None:
    torch.manual_seed(3)
    source = _net().train()
    before = _snapshot(source)
    report = tg.graft(source, _net(), example_inputs=(X,), verify=True)
    assert report.verdict is Verdict.OK
    assert source.training and _unchanged(source, before)  # running mean and var as they were


class Locked(nn.Module):
    """A module that holds a lock: it cannot be copied."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()
        self.lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_twin_a_source_model_that_cannot_be_copied_is_never_filled_in_place(
        tmp_path: Path) -> None:
    torch.manual_seed(1)
    torch.save(Locked().state_dict(), tmp_path / "locked.pt")
    mine = Locked()
    before = _snapshot(mine)
    report = tg.graft(tmp_path / "locked.pt", Locked(), source_model=mine,
                      example_inputs=(X,))
    assert report.max_abs_diff is None and _unchanged(mine, before)
    assert any("could not be copied" in w for w in report.warnings)
