"""torch.distributed.checkpoint directories written by 2 gloo processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.dcp_writer import expected
from tests.helpers import assert_same_state


@pytest.mark.slow
def test_two_rank_checkpoint_reads_in_one_process(two_rank_dcp: Path) -> None:
    assert sorted(p.name for p in two_rank_dcp.glob("*.distcp")) == ["__0_0.distcp",
                                                                     "__1_0.distcp"]
    with tg.open(two_rank_dcp) as ckpt:
        assert ckpt.format == "dcp"
        assert ckpt.weights_key == "model"
        assert ckpt.meta("rows").shape == (8, 6)
        assert ckpt.meta("cols").dtype == torch.float64
        assert ckpt.extras == {"epoch": 7, "config": {"lr": 0.1}}
        loaded = {k: ckpt.get(k) for k in ckpt.keys()}
    assert_same_state(loaded, expected(), ordered=False)


def test_missing_data_file_is_reported(two_rank_dcp: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(two_rank_dcp, broken)
    (broken / "__1_0.distcp").unlink()
    with pytest.raises(tg.CorruptCheckpointError, match="__1_0.distcp"):
        tg.open(broken)


@pytest.mark.slow
def test_fsdp2_training_checkpoint_loads_and_grafts(tmp_path: Path) -> None:
    from tests.dcp_writer import fsdp2_model, write_fsdp2

    path = write_fsdp2(tmp_path / "ckpt")
    reference = torch.load(tmp_path / "reference.pt", weights_only=True)
    with tg.open(path) as ckpt:
        assert ckpt.weights_key == "model"
        assert_same_state({k: ckpt.get(k) for k in ckpt.keys()}, reference)
    model = fsdp2_model()
    torch.nn.init.zeros_(model[0].weight)
    assert tg.graft(path, model, strict=True).ok
    assert_same_state(model.state_dict(), reference)
