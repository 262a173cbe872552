"""MLX's channels-last convolutions, known by shapes alone (graft/layouts/frameworks.py).

Files written by MLX's own ``save_weights`` (``scripts/make_framework_fixtures.py
mlx-convs``: plain safetensors, no marker), MLX's outputs beside them. A convolution weight is
permuted wherever the permutation is the only reading that fits, a transposed convolution's
too; a file whose weights all fit either way is a guess, never ok.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import torchgraft as tg

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "frameworks" / "mlx"


class Ambiguous(nn.Module):
    """Conv2d(3, 16, 3): MLX's [16, 3, 3, 3] and PyTorch's read the same size."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3)
        self.norm = nn.LayerNorm(16, eps=1e-5)
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(torch.relu(self.stem(x.permute(0, 3, 1, 2))).mean((2, 3)))
        return self.fc2(torch.relu(self.fc1(x)))  # type: ignore[no-any-return]


class Transposed(nn.Module):
    """Conv1d(4, 8, 3) and ConvTranspose1d(8, 4, 4): MLX keeps [out, k, in] for both."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.enc = nn.Conv1d(4, width, 3, padding=1)
        self.dec = nn.ConvTranspose1d(width, 4, 4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.relu(self.enc(x.transpose(1, 2)))).transpose(1, 2)  # type: ignore[no-any-return]


class Transposed2d(nn.Module):
    """Conv2d(3, 6, 3) (either way) and ConvTranspose2d(6, 5, 2) (channels last only)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(3, 6, 3, padding=1)
        self.up = nn.ConvTranspose2d(6, 5, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(torch.relu(self.enc(x.permute(0, 3, 1, 2)))).permute(0, 2, 3, 1)  # type: ignore[no-any-return]


def _equal(model: nn.Module, name: str) -> bool:
    io = np.load(FIXTURES / f"{name}_io.npz")
    with torch.no_grad():
        out = model.eval()(torch.from_numpy(io["x"])).numpy()
    return bool(np.allclose(out, io["y"], rtol=1e-5, atol=1e-5))


def test_transposed_convolutions_are_permuted_from_channels_last() -> None:
    """Before: the ConvTranspose1d's [4, 4, 8] was refused (INCOMPLETE)."""
    model = Transposed()
    report = tg.graft(FIXTURES / "convs_transposed.safetensors", model, strict=False)
    assert report.ok, report
    assert report.adapted["dec.weight"].startswith("axes permuted to (2, 0, 1)")
    assert _equal(model, "convs_transposed")


def test_a_weight_either_way_follows_the_file_its_other_convolutions_show() -> None:
    """The Conv2d(3, 6, 3)'s weight fits both ways; the ConvTranspose2d's only permuted: one
    file, one layout. Before: nothing was permuted (INCOMPLETE)."""
    model = Transposed2d()
    report = tg.graft(FIXTURES / "convs_transposed2d.safetensors", model, strict=False)
    assert report.ok, report
    assert set(report.adapted) == {"enc.weight", "up.weight"}
    assert _equal(model, "convs_transposed2d")


def test_a_file_whose_weights_read_both_ways_is_a_guess_never_ok() -> None:
    """MLX's [16, 3, 3, 3] alone: no shape tells channels last from PyTorch's layout. The
    data's order is no safetensors library's: read channels last, a guess with the stored
    reading as its alternative, right values. Before: ok, with the wrong values."""
    model = Ambiguous()
    report = tg.graft(FIXTURES / "convs_ambiguous.safetensors", model, strict=False)
    assert report.verdict == "unverified"
    assert report.guesses["stem.weight"].alternatives == (
        "stem.weight (as stored)", "stem.weight (axes permuted to (0, 3, 1, 2))")
    assert _equal(model, "convs_ambiguous")


def test_an_npz_whose_weights_read_both_ways_is_a_guess_as_stored(tmp_path: Path) -> None:
    """Any code writes an npz in any order: read as stored, a guess all the same."""
    state = load_file(FIXTURES / "convs_ambiguous.safetensors")
    path = tmp_path / "ambiguous.npz"
    arrays: dict[str, Any] = {name: value.numpy() for name, value in state.items()}
    np.savez(path, **arrays)
    model = Ambiguous()
    report = tg.graft(path, model, strict=False)
    assert report.verdict == "unverified" and "stem.weight" in report.guesses
    assert torch.equal(model.stem.weight, state["stem.weight"])


def test_a_file_mixing_layouts_or_of_other_widths_is_never_ok(tmp_path: Path) -> None:
    """The Conv1d's weight written in PyTorch's layout beside MLX's ConvTranspose1d: the file
    shows both layouts, so it is taken as stored and the transposed one does not fit."""
    state = load_file(FIXTURES / "convs_transposed.safetensors")
    state["enc.weight"] = state["enc.weight"].transpose(1, 2).contiguous()
    mixed = tmp_path / "mixed.safetensors"
    save_file(state, mixed)
    assert not tg.graft(mixed, Transposed(), strict=False).ok
    assert not tg.graft(FIXTURES / "convs_transposed.safetensors", Transposed(width=6),
                        strict=False).ok


def test_the_same_shapes_from_the_safetensors_library_are_read_as_pytorch_s(
        tmp_path: Path) -> None:
    """The control: a PyTorch model of those shapes saved by safetensors (data sorted by
    name): PyTorch's layout, ok as before."""
    source = Ambiguous()
    path = tmp_path / "torch.safetensors"
    save_file(source.state_dict(), path)
    model = Ambiguous()
    assert tg.graft(path, model).ok
    assert torch.equal(model.stem.weight, source.stem.weight)
