"""Weights found inside training checkpoints; extras kept as plain data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.helpers import SmallNet, assert_same_state


def test_lightning_checkpoint(tmp_path: Path, model: SmallNet) -> None:
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "epoch=3.ckpt"
    torch.save({"epoch": 3, "global_step": 900, "pytorch-lightning_version": "2.4.0",
                "state_dict": state, "optimizer_states": [optimizer.state_dict()],
                "lr_schedulers": [], "hyper_parameters": {"lr": 0.1, "layers": [64, 64]}},
               path)
    info = tg.inspect(path)
    assert info.weights_key == "state_dict"
    assert [w.source for w in info.wrappers] == ["PyTorch Lightning"]
    assert info.extras["hyper_parameters"] == {"lr": 0.1, "layers": [64, 64]}
    assert info.extras["optimizer_states"][0]["param_groups"][0]["momentum"] == 0.9
    json.dumps(info.to_dict())
    assert_same_state(tg.load(path), state)


def test_ema_weights_are_reported_and_selectable(tmp_path: Path) -> None:
    main, ema = SmallNet().state_dict(), SmallNet().state_dict()
    path = tmp_path / "timm.pth.tar"
    torch.save({"epoch": 9, "state_dict": main, "state_dict_ema": ema}, path)
    with tg.open(path) as ckpt:
        assert ckpt.weights_key == "state_dict"
        assert ckpt.weight_sets == {"state_dict": len(main), "state_dict_ema": len(ema)}
        assert ckpt.extras == {
            "epoch": 9,
            "state_dict_ema": f"<weights: {len(ema)} tensors; open with weights_key="
                              "'state_dict_ema'>"}
    assert_same_state(tg.load(path, weights_key="state_dict_ema"), ema)
    with pytest.raises(tg.TorchgraftError, match="'epoch' does not hold weights"):
        tg.open(path, weights_key="epoch")


def test_state_dict_with_stray_non_tensor_entries(tmp_path: Path, state: dict) -> None:
    path = tmp_path / "sd.pt"
    torch.save({**state, "version": 2}, path)
    with tg.open(path) as ckpt:
        assert ckpt.keys() == list(state)
        assert ckpt.extras == {"version": 2}


def test_bare_tensor_and_empty_checkpoint(tmp_path: Path) -> None:
    torch.save(torch.arange(3), tmp_path / "t.pt")
    assert torch.equal(tg.load(tmp_path / "t.pt")["tensor"], torch.arange(3))
    torch.save({"epoch": 1}, tmp_path / "e.pt")
    with tg.open(tmp_path / "e.pt") as ckpt:
        assert ckpt.keys() == [] and ckpt.extras == {"epoch": 1}


def test_missing_name_suggests_close_matches(tmp_path: Path, state: dict) -> None:
    path = tmp_path / "sd.pt"
    torch.save({f"module.{k}": v for k, v in state.items()}, path)
    with tg.open(path) as ckpt, pytest.raises(tg.TensorNotFoundError) as info:
        ckpt.get("conv.weight")
    assert "Did you mean 'module.conv.weight'" in str(info.value)
    assert isinstance(info.value, KeyError)
