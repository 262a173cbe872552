"""tg.convert between formats, DCP in both directions, with rules, casts and extras."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import torchgraft as tg
from tests.dcp_writer import expected
from tests.helpers import SmallNet, assert_same_state


def test_training_checkpoint_to_safetensors(tmp_path: Path, model: SmallNet) -> None:
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    src = tmp_path / "ckpt.pth"
    torch.save({"epoch": 4, "config": {"lr": 1e-3, "layers": [1, 2]},
                "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, src)
    report = tg.convert(src, tmp_path / "out.safetensors", dtype="fp16",
                        rules=[(r"^fc\.", "head."), (r"^bn\.num_batches_tracked$", None)])
    assert report.renamed == {"fc.weight": "head.weight", "fc.bias": "head.bias"}
    assert report.dropped == ["bn.num_batches_tracked"]
    assert set(report.cast.values()) == {"float32->float16"} and len(report.cast) == 8
    assert report.extras_kept == ["epoch", "config"]
    assert "optimizer" in report.extras_dropped
    plain = load_file(tmp_path / "out.safetensors")
    assert torch.equal(plain["head.weight"], model.fc.weight.half())
    with tg.open(tmp_path / "out.safetensors") as ckpt:
        assert ckpt.extras == {"epoch": 4, "config": {"lr": 1e-3, "layers": [1, 2]}}


def test_round_trip_back_to_torch_keeps_the_container(tmp_path: Path, state: dict) -> None:
    src = tmp_path / "a.pth"
    torch.save({"epoch": 1, "state_dict": state}, src)
    tg.convert(src, tmp_path / "b.safetensors")
    tg.convert(tmp_path / "b.safetensors", tmp_path / "c.pt")
    tg.convert(tmp_path / "a.pth", tmp_path / "d.pt", legacy=True, drop_extras=True)
    assert_same_state(torch.load(tmp_path / "d.pt", weights_only=True), state)
    reloaded = torch.load(tmp_path / "c.pt", weights_only=True)
    assert reloaded["epoch"] == 1
    assert_same_state(reloaded["state_dict"], state)


def test_two_rank_dcp_to_single_file_and_back(tmp_path: Path, two_rank_dcp: Path) -> None:
    report = tg.convert(two_rank_dcp, tmp_path / "single.safetensors")
    assert report.source_format == "dcp" and report.extras_kept == ["epoch", "config"]
    assert_same_state(load_file(tmp_path / "single.safetensors"), expected(), ordered=False)
    tg.convert(tmp_path / "single.safetensors", tmp_path / "again")
    assert_same_state(tg.load(tmp_path / "again"), expected(), ordered=False)
    assert tg.open(tmp_path / "again").extras == {"epoch": 7, "config": {"lr": 0.1}}


def test_refuses_to_overwrite(tmp_path: Path, state: dict) -> None:
    torch.save(state, tmp_path / "a.pt")
    (tmp_path / "b.safetensors").write_bytes(b"keep")
    with pytest.raises(tg.TorchgraftError, match="already exists"):
        tg.convert(tmp_path / "a.pt", tmp_path / "b.safetensors")
    assert (tmp_path / "b.safetensors").read_bytes() == b"keep"
