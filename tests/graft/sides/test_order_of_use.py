"""A model's keys in the order its forward uses them, found on meta: nothing read, nothing left.

Code defines modules in its own order (a head first, a mid-block after the levels it runs
before); structural matching pairs by order of use. A forward on the meta device finds it for
any model that runs there, and leaves the model as it was: what the forward caches on its
modules is put back.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.sides.model import module_side, order_of_use

model_sides = importlib.import_module("torchgraft.graft.sides.model")


class HeadFirst(nn.Module):
    """Defines its head first, runs it last; caches a tensor on its first call."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 2)
        self.embed = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.cache = torch.zeros(1, device=ids.device)  # made on meta in the meta run
        return self.head(self.norm(self.embed(ids)))


class ReadsAValue(HeadFirst):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed(ids).sum().item() > 0:  # no value to read on meta
            return self.head(self.norm(self.embed(ids)))
        return self.head(self.embed(ids))


def test_keys_come_in_the_order_the_forward_uses_them() -> None:
    model = HeadFirst()
    names = list(model.state_dict())
    assert names[0] == "head.weight"
    assert order_of_use(model, names) == ["embed.weight", "norm.weight", "norm.bias",
                                          "head.weight", "head.bias"]


def test_the_meta_run_leaves_the_model_as_it_was() -> None:
    model = HeadFirst()
    tensors = {name: (t, t.clone()) for name, t in model.state_dict(keep_vars=True).items()}
    parameters = model._parameters
    order_of_use(model, list(tensors))
    assert not hasattr(model, "cache")  # set by the forward, on meta: taken back
    assert model._parameters is parameters
    for name, (tensor, value) in tensors.items():
        now = model.state_dict(keep_vars=True)[name]
        assert now is tensor and torch.equal(now, value)


def test_a_model_that_cannot_run_on_meta_keeps_its_order_of_definition() -> None:
    model = ReadsAValue()
    names = list(model.state_dict())
    assert order_of_use(model, names) is None
    side = module_side(model)
    assert side.order == names and side.ordered
    assert not hasattr(model, "cache")


def test_a_module_side_asks_only_when_its_order_is_wanted() -> None:
    """Pairing every key by name never asks for the order; asked, it runs none of the model's
    own hooks (they would see meta tensors), which stay registered."""
    runs: list[int] = []
    model = HeadFirst()
    model.register_forward_pre_hook(lambda *_: runs.append(1))
    side = module_side(model)
    assert side.given_order == []
    assert side.order[0] == "embed.weight"
    assert runs == []
    model(torch.tensor([[1, 2]]))
    assert runs == [1]


def test_a_graft_by_names_never_runs_the_model_for_its_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key paired by name: no order of use is asked (a 100k-tensor model would pay a
    forward for nothing). Other names ask it once: the control."""
    asked: list[int] = []
    found = model_sides.order_of_use

    def counted(model: nn.Module, names: Sequence[str]) -> list[str] | None:
        asked.append(1)
        return found(model, names)

    monkeypatch.setattr(model_sides, "order_of_use", counted)
    source = HeadFirst()
    torch.save(source.state_dict(), tmp_path / "same.pt")
    assert tg.graft(tmp_path / "same.pt", HeadFirst()).ok
    assert asked == []
    renamed = {key.replace("embed.", "tokens."): value
               for key, value in source.state_dict().items()}
    torch.save(renamed, tmp_path / "other.pt")
    tg.graft(tmp_path / "other.pt", HeadFirst())
    assert asked == [1]
