"""Experts stacked along a leading dimension, or kept apart, under names no table lists."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchgraft as tg
from tests.graft.pairs.values import drawn
from torchgraft.graft.layouts import experts as expert_tables

E, HIDDEN, INNER = 4, 8, 12
X = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(0))


class Apart(nn.Module):
    """Each expert numbered, its gate and up named ``a`` and ``b``, its down ``c``."""

    def __init__(self, experts: int = E) -> None:
        super().__init__()
        self.bank = nn.ModuleList(nn.Module() for _ in range(experts))
        for expert in self.bank:
            expert.a = nn.Linear(HIDDEN, INNER, bias=False)
            expert.b = nn.Linear(HIDDEN, INNER, bias=False)
            expert.c = nn.Linear(INNER, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(e.c(F.silu(e.a(x)) * e.b(x)) for e in self.bank)  # type: ignore[return-value]


class Stacked(nn.Module):
    """One ``[E, 2I, H]`` tensor for every expert's gate and up, one ``[E, H, I]`` for down."""

    def __init__(self) -> None:
        super().__init__()
        self.bank = nn.Module()
        self.bank.ab = nn.Parameter(torch.zeros(E, 2 * INNER, HIDDEN))
        self.bank.c = nn.Parameter(torch.zeros(E, HIDDEN, INNER))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in range(E):
            gate, up = (x @ self.bank.ab[e].T).chunk(2, -1)
            out = out + (F.silu(gate) * up) @ self.bank.c[e].T
        return out


def test_the_names_are_in_no_table() -> None:
    named = {n for names in expert_tables.ROLES.values() for n in names} | set(
        expert_tables.STACKED)
    assert not {"a", "b", "c", "ab", "bank"} & named


@pytest.mark.parametrize("stacked_source", [False, True], ids=["stack", "unstack"])
@pytest.mark.parametrize("flavour", ["module", "pt"])
def test_experts_stacked_or_apart_fill_each_other(stacked_source: bool, flavour: str,
                                                  tmp_path: Path) -> None:
    source = drawn(Stacked() if stacked_source else Apart())
    target = (Apart() if stacked_source else Stacked()).eval()
    if flavour == "module":
        report = tg.graft(source, target, example_inputs=(X,))
        assert report.ok, report
    else:
        torch.save(source.state_dict(), tmp_path / "s.pt")
        report = tg.graft(tmp_path / "s.pt", target)
        assert report.complete, report  # the halves' order no name states: a guess
    with torch.no_grad():
        assert torch.allclose(target(X), source(X), atol=1e-5)


def test_another_number_of_experts_is_never_ok(tmp_path: Path) -> None:
    """The twin: the checkpoint has five experts apart, the model stacks four."""
    torch.save(drawn(Apart(experts=5)).state_dict(), tmp_path / "five.pt")
    report = tg.graft(tmp_path / "five.pt", Stacked())
    assert not report.ok
