"""Files written live by accelerate and peft: opened, loaded, grafted and converted.

(transformers' and huggingface_hub's writers and loaders are exercised in the graft pair,
sharded and save tests; the heavy libraries' files are fixtures, see test_real_writers.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import assert_same_state

accelerate = pytest.importorskip("accelerate")
peft = pytest.importorskip("peft")


def _net(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 2))


def test_accelerate_save_state_and_save_model(tmp_path: Path) -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    model = _net(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.save_state(tmp_path / "state")
    accelerator.save_model(model, tmp_path / "model", max_shard_size="1KB")
    assert len(list((tmp_path / "model").glob("*.safetensors"))) > 1
    for folder, fmt in ((tmp_path / "state", "safetensors"), (tmp_path / "model", "sharded")):
        assert tg.inspect(folder).format == fmt
        assert_same_state(tg.load(folder), model.state_dict(), ordered=False)
        fresh = _net(1)
        assert tg.graft(folder, fresh, strict=True).ok
        x = torch.randn(3, 64)
        assert torch.equal(fresh(x), model(x))
        tg.convert(folder, tmp_path / f"{fmt}.pt")
        assert_same_state(tg.load(tmp_path / f"{fmt}.pt"), model.state_dict(), ordered=False)


def _lora(seed: int) -> nn.Module:
    config = peft.LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False)
    torch.manual_seed(seed)
    return peft.get_peft_model(_net(0), config)


def test_peft_adapter_grafts_into_a_peft_model(tmp_path: Path) -> None:
    trained = _lora(seed=0)
    trained.save_pretrained(tmp_path / "adapter")
    with tg.open(tmp_path / "adapter") as ckpt:
        assert list(ckpt) == ["base_model.model.0.lora_A.weight",
                              "base_model.model.0.lora_B.weight",
                              "base_model.model.2.lora_A.weight",
                              "base_model.model.2.lora_B.weight"]
    fresh = _lora(seed=1)  # the same base weights, other LoRA weights
    report = tg.graft(tmp_path / "adapter", fresh)
    assert sorted(report.loaded) == sorted(k for k in fresh.state_dict() if ".lora_" in k)
    # the adapter file holds no base weights: not part of the adapter, neither claimed nor missing
    assert report.ok and not report.missing
    assert set(report.not_in_adapter) == {k for k in fresh.state_dict() if "base_layer" in k}
    x = torch.randn(3, 64)
    assert torch.equal(fresh(x), trained(x))


def test_peft_adapter_into_a_model_without_lora_is_refused(tmp_path: Path) -> None:
    _lora(seed=0).save_pretrained(tmp_path / "adapter")
    with pytest.raises(tg.TorchgraftError, match="PEFT adapter.*get_peft_model"):
        tg.graft(tmp_path / "adapter", _net(2))
