"""tg.convert between formats, DCP in both directions, with rules, casts and extras."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import torchgraft as tg
from tests.dcp_writer import expected
from tests.helpers import SmallNet, assert_same_state, calls, data_parallel_state
from torchgraft.bounds import MAX_RANKS


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


def test_wrappers_are_removed_unless_kept(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    wrapped = tmp_path / "dp.pt"
    torch.save(data_parallel_state(model), wrapped)
    report = tg.convert(wrapped, tmp_path / "bare.safetensors")
    assert report.wrappers_removed == "module." and not report.renamed
    assert "'module.' removed from every key" in str(report)
    with tg.open(tmp_path / "bare.safetensors") as ckpt:
        assert ckpt.keys() == ["0.weight", "0.bias"]
    kept = tg.convert(wrapped, tmp_path / "kept.safetensors", keep_wrappers=True)
    assert not kept.wrappers_removed
    with tg.open(tmp_path / "kept.safetensors") as ckpt:
        assert ckpt.keys() == ["module.0.weight", "module.0.bias"]


def test_written_files_follow_the_umask_and_carry_format_pt(tmp_path: Path) -> None:
    import os

    from safetensors import safe_open

    model = torch.nn.Linear(2, 3)
    old = os.umask(0o022)
    try:
        tg.save(model, tmp_path / "m.safetensors")
        torch.save(model.state_dict(), tmp_path / "reference.pt")
    finally:
        os.umask(old)
    mode = (tmp_path / "m.safetensors").stat().st_mode & 0o777
    assert mode == (tmp_path / "reference.pt").stat().st_mode & 0o777 == 0o644
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}


@pytest.mark.parametrize("ranks", [2**31, MAX_RANKS + 1, 0, -1, True, 2.0, "2"])
def test_a_number_of_ranks_no_checkpoint_has_is_refused_before_anything(
        tmp_path: Path, state: dict, ranks: object) -> None:
    src = tmp_path / "m.safetensors"
    tg.save(state, src)
    def refused() -> None:
        with pytest.raises(tg.TorchgraftError, match=f"to {MAX_RANKS} ranks"):
            tg.convert(src, tmp_path / "dcp", format="dcp", ranks=ranks)  # type: ignore[arg-type]

    assert calls(refused) < 10_000  # 2**31 was a list per rank; 3 ranks take 380,000
    assert not (tmp_path / "dcp").exists()
    tg.convert(src, tmp_path / "three", format="dcp", ranks=3)  # the control
    assert sorted(p.name for p in (tmp_path / "three").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
