"""tg.diff between paths, state dicts and modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.helpers import SmallNet, data_parallel_state


def test_diff_kinds(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    assert tg.diff(path, model).identical
    other = {k: v.clone() for k, v in model.state_dict().items()}
    other["fc.bias"] += 0.5
    other["conv.weight"] = other["conv.weight"].half()
    del other["bn.bias"]
    other["extra"] = torch.ones(1)
    other["fc.weight"] = torch.ones(2)
    report = tg.diff(path, other)
    assert not report.identical
    assert report.values["fc.bias"] == pytest.approx(0.5)
    assert 0 < report.values["conv.weight"] < 1e-3  # rounding to float16
    assert report.dtypes == {"conv.weight": ("float32", "float16")}
    assert report.only_in_a == ["bn.bias"] and report.only_in_b == ["extra"]
    assert report.shapes == {"fc.weight": ((5, 8), (2,))}
    assert "values     fc.bias  max |a - b| = 0.5" in str(report)


def test_nan_equals_nan() -> None:
    a = {"x": torch.tensor([float("nan"), 1.0])}
    assert tg.diff(a, {"x": a["x"].clone()}).identical
    assert tg.diff(a, {"x": torch.tensor([0.0, 1.0])}).values == {"x": float("inf")}


def test_diff_compares_names_without_wrappers(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 3)
    torch.save(data_parallel_state(model), tmp_path / "dp.pt")
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    report = tg.diff(tmp_path / "dp.pt", tmp_path / "bare.pt")
    assert report.identical and report.wrappers == {"a": "module.", "b": ""}
    assert "'module.' removed from A's names" in str(report)
    strict = tg.diff(tmp_path / "dp.pt", tmp_path / "bare.pt", keep_wrappers=True)
    assert not strict.identical and strict.only_in_a == ["module.weight", "module.bias"]
