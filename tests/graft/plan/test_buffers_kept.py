"""A persistent buffer the checkpoint lacks keeps the model's value, as an assumption."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Verdict
from torchgraft.graft.plan.passes import KEPT_VALUES

X = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))


class Rotating(nn.Module):
    """A projection scaled by frequencies its code computes (a persistent buffer)."""

    def __init__(self, *, keep: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("inv_freq", 1.0 / 10_000 ** (torch.arange(8) / 8), persistent=keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.inv_freq


class Codebook(nn.Module):
    """A projection read through a learned buffer (a codebook updated by moving averages)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("embed", torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.embed


def _without(model: nn.Module, key: str, path: Path) -> Path:
    state = {k: v for k, v in model.state_dict().items() if k != key}
    torch.save(state, path)
    return path


def test_a_computed_buffer_is_kept_and_unverified_from_a_file(tmp_path: Path) -> None:
    source = Rotating(keep=False)  # the checkpoint's code base computes it, never saves it
    torch.save(source.state_dict(), tmp_path / "s.pt")
    target = Rotating()
    report = tg.graft(tmp_path / "s.pt", target)
    assert report.verdict is Verdict.UNVERIFIED and not report.missing
    assert "inv_freq" in report.initialised
    assert any(a.what == KEPT_VALUES for a in report.assumptions)
    assert torch.equal(target(X), source(X))


def test_a_computed_buffer_compared_with_the_source_is_ok() -> None:
    source = Rotating(keep=False)
    report = tg.graft(source, Rotating(), example_inputs=(X,))
    assert report.ok, report


def test_a_learned_buffer_kept_is_never_ok(tmp_path: Path) -> None:
    """The twin: the codebook the checkpoint lacks was learned; kept, the outputs differ, and
    nothing says ok (the source's own model lacks it from the file too: nothing to compare)."""
    torch.manual_seed(0)
    source = Codebook()
    path = _without(source, "embed", tmp_path / "s.pt")
    torch.manual_seed(1)
    target = Codebook()
    assert tg.graft(path, target).verdict is Verdict.UNVERIFIED
    assert not torch.allclose(target(X), source(X))
    report = tg.graft(path, Codebook(), source_model=source, example_inputs=(X,))
    assert report.verdict is Verdict.UNVERIFIED and "not compared" in report.warnings[-1]


def test_running_statistics_the_checkpoint_lacks_stay_missing(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    path = _without(model, "1.running_mean", tmp_path / "s.pt")
    report = tg.graft(path, nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)))
    assert report.verdict is Verdict.INCOMPLETE and "1.running_mean" in report.missing
