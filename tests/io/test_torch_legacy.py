"""torch.save legacy (non-zip) files, as PyTorch < 1.6 wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.helpers import assert_same_state, save_on


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_file_round_trip(tmp_path: Path, state: dict[str, torch.Tensor],
                                protocol: int) -> None:
    path = tmp_path / "old.pth"
    torch.save(state, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert not path.read_bytes().startswith(b"PK")
    with tg.open(path) as ckpt:
        assert ckpt.format == "torch-legacy"
    # torch.load(weights_only=True) itself fails on protocol 4+ legacy files; we compare to
    # the saved state.
    assert_same_state(tg.load(path), state)


def test_legacy_views_and_shared_storages(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    state = {"base": base, "view": base[1:, 2:], "t": base.t(), "half": torch.ones(3).half()}
    path = tmp_path / "views.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    assert_same_state(tg.load(path), state)


def test_legacy_file_saved_on_gpu(tmp_path: Path, state: dict[str, torch.Tensor]) -> None:
    path = tmp_path / "gpu.pth"
    save_on("cuda:1", state, path, _use_new_zipfile_serialization=False)
    with tg.open(path) as ckpt:
        assert ckpt.saved_devices == {"cuda:1"}
    assert_same_state(tg.load(path), state)
