"""A value one side keeps once and the other once per block (rotary frequencies): its copies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg

DIM, LAYERS = 8, 3


def _freqs() -> torch.Tensor:
    return 1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM)


class PerBlock(nn.Module):
    """Each block keeps its own (persistent) ``inv_freq``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Module() for _ in range(LAYERS))
        for layer in self.layers:
            layer.proj = nn.Linear(DIM, DIM)
            layer.rotary = nn.Module()
            layer.rotary.register_buffer("inv_freq", torch.zeros(DIM // 2))


class Once(nn.Module):
    """The model keeps ``inv_freq`` once."""

    def __init__(self) -> None:
        super().__init__()
        self.rotary = nn.Module()
        self.rotary.register_buffer("inv_freq", _freqs())
        self.blocks = nn.ModuleList(nn.Module() for _ in range(LAYERS))
        for block in self.blocks:
            block.fc = nn.Linear(DIM, DIM)


@pytest.mark.parametrize("flavour", ["module", "pt"])
def test_one_value_fills_every_blocks_copy(flavour: str, tmp_path: Path) -> None:
    source, target = Once(), PerBlock()
    if flavour == "pt":
        torch.save(source.state_dict(), tmp_path / "once.pt")
        report = tg.graft(tmp_path / "once.pt", target)
    else:
        report = tg.graft(source, target)
    assert report.complete and not report.missing, report
    for layer in target.layers:
        assert torch.equal(layer.rotary.inv_freq, _freqs())


def test_the_first_of_the_copies_fills_the_one_and_it_is_a_guess(tmp_path: Path) -> None:
    source = PerBlock()
    for layer in source.layers:
        layer.rotary.inv_freq.copy_(_freqs())
    torch.save(source.state_dict(), tmp_path / "per_block.pt")
    target = Once()
    target.rotary.inv_freq.zero_()
    report = tg.graft(tmp_path / "per_block.pt", target)
    assert report.complete and "rotary.inv_freq" in report.guesses, report
    assert report.verdict == "unverified"  # nothing but their values says the copies are equal
    assert torch.equal(target.rotary.inv_freq, _freqs())
