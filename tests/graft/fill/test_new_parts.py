"""``new=``: parts of the model declared new on purpose keep the model's own values (or
``init=``'s), are listed in ``report.new`` and leave the verdict ok; a pattern that names nothing
is refused. Each case with its control."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchgraft as tg


def _backbone() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.stem = nn.Linear(4, 4)
    return model


def _with_head() -> nn.Module:
    model = _backbone()
    model.head = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return model


def test_a_part_declared_new_keeps_the_models_values_and_the_verdict_ok() -> None:
    checkpoint = _backbone().state_dict()
    model = _with_head()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = tg.graft(checkpoint, model, new="head")
    assert report.ok and report.verdict == "ok" and not report.missing
    assert sorted(report.new) == ["head.0.bias", "head.0.weight", "head.2.bias", "head.2.weight"]
    assert "declared new (new='head')" in report.new["head.0.weight"]
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in report.new)
    assert "new       head.0 (2 keys)" in str(report) and "head.2.weight" in report.details()
    assert report.to_dict()["new"] == report.new
    plain = tg.graft(checkpoint, _with_head())  # the control: the same graft, nothing declared
    assert plain.verdict == "incomplete" and "head.0.weight" in plain.missing


def test_init_fills_parts_declared_new() -> None:
    model = _with_head()
    report = tg.graft(_backbone().state_dict(), model, new=["head.*"], init="zeros")
    assert report.ok and "init='zeros'" in report.new["head.2.weight"]
    assert not model.head[2].weight.any() and model.stem.weight.any()


def test_a_pattern_that_names_no_key_is_refused() -> None:
    model = _with_head()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tg.TorchgraftError, match=r"new='neck' \(CLI: --new\) names no key of"):
        tg.graft(_backbone().state_dict(), model, new="neck")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # untouched
    with pytest.raises(tg.TorchgraftError, match="each pattern is a glob"):
        tg.graft(_backbone().state_dict(), model, new=[""])


def test_a_pattern_naming_what_the_checkpoint_fills_fills_it_with_a_warning() -> None:
    checkpoint = _backbone().state_dict()
    report = tg.graft(checkpoint, _with_head(), new=["stem", "head"])
    assert report.ok and "stem.weight" in report.loaded and "stem.weight" not in report.new
    assert any("new='stem' names 2 keys the checkpoint fills" in w for w in report.warnings)
