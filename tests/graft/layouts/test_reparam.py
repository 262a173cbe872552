"""Weight normalisation in torch's two namings, or folded: grafted between any two, both ways.

Audio codecs and vocoders hold every convolution weight-normalised; the same model may be
built with ``torch.nn.utils.weight_norm`` (``weight_g``, ``weight_v``), its parametrization
(``parametrizations.weight.original0``/``1``) or neither (a plain ``weight``). Every pair of
these fills the model with the source's outputs, from a module and from a file, and writes
back in the checkpoint's own layout.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import torchgraft as tg
from torchgraft.graft.layouts.reparam import weight_norms
from torchgraft.graft.sides.model import module_side

STYLES = ("old", "new", "plain")
X = torch.randn(1, 2, 16, generator=torch.Generator().manual_seed(0))


def _normed(module: nn.Module, style: str, dim: int = 0) -> nn.Module:
    if style == "old":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's deprecation of the old
            return nn.utils.weight_norm(module, dim=dim)
    if style == "new":
        return parametrizations.weight_norm(module, dim=dim)
    return module


class Codec(nn.Module):
    """Weight-normalised 1-D convolutions, a transposed one (normalised on dim 1), a plain one."""

    def __init__(self, style: str, depth: int = 2) -> None:
        super().__init__()
        self.convs = nn.ModuleList([_normed(nn.Conv1d(2, 8, 3, padding=1), style)] + [
            _normed(nn.Conv1d(8, 8, 3, padding=1), style) for _ in range(depth - 1)])
        self.up = _normed(nn.ConvTranspose1d(8, 4, 4, stride=2), style, dim=1)
        self.out = nn.Conv1d(4, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.tanh(conv(x))
        return self.out(torch.tanh(self.up(x)))  # type: ignore[no-any-return]


def _source(style: str, depth: int = 2) -> nn.Module:
    torch.manual_seed(0)
    model = Codec(style, depth).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5).add_(0.1)  # a magnitude that is not the direction's norm
    return model


@pytest.mark.parametrize(("a", "b"), list(itertools.product(STYLES, STYLES)))
@pytest.mark.parametrize("flavour", ["module", "pt"])
def test_every_naming_fills_every_other(a: str, b: str, flavour: str, tmp_path: Path) -> None:
    source, target = _source(a), Codec(b).eval()
    if flavour == "pt":
        torch.save(source.state_dict(), tmp_path / "codec.pt")
        report = tg.graft(tmp_path / "codec.pt", target)
    else:
        report = tg.graft(source, target, example_inputs=X)
    assert report.ok, report
    with torch.no_grad():
        assert torch.allclose(target(X), source(X), atol=1e-5)
    if a != b:
        assert any("weight normalisation" in why for why in report.adapted.values())


@pytest.mark.parametrize(("a", "b"), [("old", "plain"), ("plain", "new"), ("new", "old")])
def test_written_back_in_the_checkpoints_own_layout(a: str, b: str, tmp_path: Path) -> None:
    source = _source(a)
    torch.save(source.state_dict(), tmp_path / "codec.pt")
    target = Codec(b).eval()
    tg.graft(tmp_path / "codec.pt", target)
    tg.save(target, tmp_path / "back.safetensors", layout_of=tmp_path / "codec.pt")
    again = Codec(a).eval()
    again.load_state_dict(tg.load(tmp_path / "back.safetensors"))  # strict: the same keys
    with torch.no_grad():
        assert torch.allclose(again(X), source(X), atol=1e-5)


def test_the_kept_dimension_is_read_from_the_magnitude() -> None:
    found = weight_norms(module_side(Codec("new")))
    assert {k: v.dim for k, v in found.items()} == {
        "convs.0.weight": 0, "convs.1.weight": 0, "up.weight": 1}
    spectral = nn.utils.spectral_norm(nn.Linear(4, 4))  # weight_orig, weight_u, weight_v
    assert weight_norms(module_side(spectral)) == {}


def test_a_deeper_checkpoint_is_never_ok(tmp_path: Path) -> None:
    """The twin: one normalised convolution more than the model has."""
    torch.save(_source("old", depth=3).state_dict(), tmp_path / "deeper.pt")
    target = Codec("plain").eval()
    report = tg.graft(tmp_path / "deeper.pt", target)
    assert not report.ok
    with torch.no_grad():
        assert not torch.allclose(target(X), _source("old", depth=3)(X), atol=1e-3)
