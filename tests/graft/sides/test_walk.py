"""One walk of a model stands for torch's own walks: ``named_modules()`` and ``state_dict()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from torchgraft.graft.sides.model import state_tensors
from torchgraft.graft.sides.walk import walk_model


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        self.register_parameter("absent", None)
        self.empty = None  # a child slot left empty


def plain() -> nn.Module:
    model = nn.Sequential(Block(), nn.ModuleDict({"a": Block(), "b": nn.ModuleList([Block()])}),
                          nn.Linear(4, 8, bias=False))
    model[2].weight = nn.Parameter(torch.ones(8, 4))
    model.add_module("head", nn.Linear(4, 8, bias=False))
    model.head.weight = model[2].weight  # tied: two keys, one parameter
    return model


def same_as_torch(model: nn.Module) -> None:
    modules, tensors = walk_model(model)
    assert modules == list(model.named_modules())
    expected = state_tensors(model)
    assert list(tensors.state) == list(expected)
    assert all(tensors.state[k] is v for k, v in expected.items())


def test_a_plain_model_is_walked_as_torch_walks_it() -> None:
    model = plain()
    same_as_torch(model)
    _, tensors = walk_model(model)
    assert "0.cache" not in tensors.state and "0.absent" not in tensors.state
    assert tensors.state["head.weight"] is tensors.state["2.weight"]
    assert not tensors.on_meta and tensors.device == torch.device("cpu")


class Extra(nn.Linear):
    def get_extra_state(self) -> Any:
        return {"note": 1}

    def set_extra_state(self, state: Any) -> None:
        pass


class OwnSave(nn.Linear):
    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        destination[prefix + "renamed"] = self.weight


def shared() -> nn.Module:
    model = plain()
    model.add_module("again", model[0])  # one module in two places: its keys under both
    return model


def hooked() -> nn.Module:
    model = plain()

    def rename(module: nn.Module, state: dict[str, Any], prefix: str, local: Any) -> None:
        state[prefix + "moved"] = state.pop(prefix + "weight")

    model[2]._register_state_dict_hook(rename)
    return model


def own_instance_save() -> nn.Module:
    model = plain()
    model[2]._save_to_state_dict = lambda destination, prefix, keep_vars: None  # type: ignore[method-assign]
    return model


@pytest.mark.parametrize("build", [
    shared, hooked, own_instance_save,
    lambda: nn.Sequential(Extra(2, 2), nn.Linear(2, 2)),
    lambda: nn.Sequential(OwnSave(2, 2), nn.Linear(2, 2)),
], ids=["shared module", "state-dict hook", "an instance's own _save_to_state_dict",
        "extra state", "own _save_to_state_dict"])
def test_what_the_walk_cannot_stand_for_is_torch_s_own(build: Any) -> None:
    model = build()
    same_as_torch(model)


def test_a_shared_module_s_keys_are_under_both_paths() -> None:
    modules, tensors = walk_model(shared())
    assert "again.proj.weight" in tensors.state and "0.proj.weight" in tensors.state
    assert [p for p, _ in modules].count("again") == 0  # named_modules lists it once


class MakesACache(nn.Linear):
    """Registers a buffer on its first call, as some attention caches do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "cache"):
            self.register_buffer("cache", torch.zeros(2, device=x.device), persistent=False)
        return super().forward(x)


def test_a_buffer_a_meta_forward_makes_is_still_reported_on_meta(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    import torchgraft as tg

    save_file({"weight": torch.ones(2, 2), "bias": torch.ones(2)}, tmp_path / "w.safetensors")
    with torch.device("meta"):
        model = MakesACache(2, 2)
    report = tg.graft(tmp_path / "w.safetensors", model, example_inputs=(torch.ones(1, 2),),
                      verify=False)
    assert report.missing == ["cache"] and report.loaded == ["weight", "bias"]


def test_a_meta_model_says_so_and_which_tensors_stay_there() -> None:
    with torch.device("meta"):
        model = plain()
    _, tensors = walk_model(model)
    assert tensors.on_meta and tensors.device is None
    left = [key for key, _name in tensors.meta_left()]
    assert "0.proj.weight" in left and "0.cache" in left  # non-persistent buffers too
    assert ("0.proj.weight", "weight") in tensors.meta_left()  # with its name in its module
    assert "head.weight" not in left  # tied: once, under its first name
