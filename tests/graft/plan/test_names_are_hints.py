"""Names rank candidates; shapes decide. A name met by accident never blocks a graft."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg

X = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


class Encoder(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(4, width)
        self.norm = nn.LayerNorm(width)


class Source(nn.Module):
    """``a.b.norm`` (width 8) loses ``a.b.`` to meet the model's final ``norm`` (width 16)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.a = nn.Module()
        self.a.b = Encoder(width)
        self.proj = nn.Linear(width, 16)
        self.final = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a.b.norm(self.a.b.fc(x))
        return self.final(self.proj(torch.relu(h)))  # type: ignore[no-any-return]


class Target(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Module()
        self.enc.fc = nn.Linear(4, 8)
        self.enc.ln = nn.LayerNorm(8)
        self.out = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc.ln(self.enc.fc(x))
        return self.norm(self.out(torch.relu(h)))  # type: ignore[no-any-return]


def _randomised(model: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model.eval()


@pytest.mark.parametrize("flavour", ["module", "pt"])
def test_a_prefix_one_key_loses_is_no_wrapper(flavour: str, tmp_path: Path) -> None:
    source, target = _randomised(Source()), Target().eval()
    if flavour == "pt":
        torch.save(source.state_dict(), tmp_path / "s.pt")
        report = tg.graft(tmp_path / "s.pt", target)
    else:
        report = tg.graft(source, target, example_inputs=X)
    assert report.complete, report
    assert report.mapping["norm.weight"] == "final.weight"
    assert "prefix" not in report.matched_by.values()
    with torch.no_grad():
        assert torch.allclose(target(X), source(X), atol=1e-5)


def test_a_wrapped_backbone_still_pairs_through_its_prefix() -> None:
    """The control: a prefix over a whole subtree, with a new head beside it."""
    source = _randomised(Encoder())

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = Encoder()
            self.head = nn.Linear(8, 3)

    report = tg.graft(source, Wrapped())
    assert report.mapping == {"backbone.fc.weight": "fc.weight", "backbone.fc.bias": "fc.bias",
                              "backbone.norm.weight": "norm.weight",
                              "backbone.norm.bias": "norm.bias"}
    assert set(report.matched_by.values()) == {"prefix"}


def test_another_width_is_never_ok(tmp_path: Path) -> None:
    """The twin: the source's encoder is wider; nothing fits it."""
    torch.save(_randomised(Source(width=12)).state_dict(), tmp_path / "wide.pt")
    report = tg.graft(tmp_path / "wide.pt", Target())
    assert not report.ok


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.ln = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.fc(x))  # type: ignore[no-any-return]


def test_unit_dimensions_are_a_layout_shapes_decide(tmp_path: Path) -> None:
    """A file keeps biases and norms as ``[1, n]`` (TF's GPT-2 does): the same values."""
    source = _randomised(TinyGPT())
    stored = {k: (v.reshape(1, -1) if v.dim() == 1 else v).contiguous()
              for k, v in source.state_dict().items()}
    save_file(stored, str(tmp_path / "unit.safetensors"))
    target = TinyGPT().eval()
    report = tg.graft(tmp_path / "unit.safetensors", target)
    assert report.ok and report.adapted["fc.bias"].startswith("reshaped to (6,)"), report
    with torch.no_grad():
        assert torch.equal(target(X), source(X))
    twin = {k: v.reshape(2, -1) if v.dim() == 1 else v for k, v in source.state_dict().items()}
    save_file({k: v.contiguous() for k, v in twin.items()}, str(tmp_path / "folded.safetensors"))
    assert not tg.graft(tmp_path / "folded.safetensors", TinyGPT()).ok  # [2, 3] is no bias
