"""New heads in one step: what the checkpoint lacks or cannot fill is proposed for ``new=`` when
it is a whole module named like a head or at the model's end; ``new=`` covers heads whose rows
differ; a pattern that names nothing is answered with the model's nearest module names. Each
case with its control (a twin that must behave the other way)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.report.heads import new_parts


def _backbone() -> nn.Module:
    model = nn.Module()
    model.stem = nn.Linear(4, 8)
    model.body = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    return model


def _with(name: str, head: nn.Module, *, after: nn.Module | None = None) -> nn.Module:
    model = _backbone()
    setattr(model, name, head)
    if after is not None:
        model.tail = after
    return model


def test_a_whole_module_named_like_a_head_is_proposed_with_its_exact_name() -> None:
    checkpoint = _backbone().state_dict()
    report = tg.graft(checkpoint, _with("classifier", nn.Linear(8, 3)))
    assert report.verdict == "incomplete" and report.proposed_new() == ["classifier"]
    assert "new='classifier' (CLI: --new classifier)" in str(report)
    assert report.settle_call() == "tg.graft(checkpoint, model, new='classifier')"
    declared = tg.graft(checkpoint, _with("classifier", nn.Linear(8, 3)), new="classifier")
    assert declared.ok and sorted(declared.new) == ["classifier.bias", "classifier.weight"]
    assert not declared.proposed_new() and "  declare " not in str(declared)
    # the control: a module whose own checkpoint keys are partly there is not a new part
    partial = {**checkpoint, "classifier.weight": torch.zeros(3, 8)}
    half = tg.graft(partial, _with("classifier", nn.Linear(8, 3)))
    assert half.missing == ["classifier.bias"] and not half.proposed_new()
    assert "  declare " not in str(half)


def test_the_highest_whole_module_is_proposed_not_its_parts() -> None:
    head = nn.Sequential()
    head.norm, head.fc = nn.LayerNorm(8), nn.Linear(8, 3)
    report = tg.graft(_backbone().state_dict(), _with("head", head))
    assert report.proposed_new() == ["head"]


def test_a_module_at_the_models_end_is_proposed_whatever_its_name() -> None:
    checkpoint = _backbone().state_dict()
    report = tg.graft(checkpoint, _with("qa_outputs", nn.Linear(8, 2)))
    assert report.proposed_new() == ["qa_outputs"]
    # the control: the same module with a loaded one after it, and no head's name
    inner = _with("qa_outputs", nn.Linear(8, 2), after=nn.Linear(8, 8))
    checkpoint = {**checkpoint, "tail.weight": torch.zeros(8, 8), "tail.bias": torch.zeros(8)}
    middle = tg.graft(checkpoint, inner)
    assert middle.missing == ["qa_outputs.weight", "qa_outputs.bias"]
    assert not middle.proposed_new()
    assert "new=" in str(middle) and "new='qa_outputs'" not in str(middle)  # the general way


@pytest.mark.parametrize("name", ["classifier", "head", "fc", "lm_head", "score", "cls_score"])
def test_head_names(name: str) -> None:
    targets = ["body.weight", f"{name}.weight", "tail.weight"]
    assert new_parts(targets, {f"{name}.weight"}) == [name]
    assert new_parts(targets, {"body.weight"}) == []  # the control: named like no head


def test_new_covers_a_head_whose_rows_differ_and_lists_it() -> None:
    torch.manual_seed(0)
    trained = _with("fc", nn.Linear(8, 10))
    report = tg.graft(trained.state_dict(), _with("fc", nn.Linear(8, 3)), new="fc")
    assert report.ok and sorted(report.new) == ["fc.bias", "fc.weight"]
    assert not report.reinitialised and "reinit" not in str(report)
    assert "declared new (new='fc')" in report.new["fc.weight"]
    assert "is declared new (new='fc')" in report.reasons["fc.weight"]  # the checkpoint's head
    assert report.unused == ["fc.weight", "fc.bias"]
    # the control: without new=, the head is re-initialised and new= proposed for it
    plain = tg.graft(trained.state_dict(), _with("fc", nn.Linear(8, 3)))
    assert sorted(plain.reinitialised) == ["fc.bias", "fc.weight"] and not plain.new
    assert plain.proposed_new() == ["fc"] and "new='fc' (CLI: --new fc)" in str(plain)


def test_new_covers_a_head_behind_a_wrapper_prefix() -> None:
    trained = nn.DataParallel(_with("fc", nn.Linear(8, 10)))
    report = tg.graft(trained.state_dict(), _with("fc", nn.Linear(8, 3)), new="fc")
    assert report.ok and sorted(report.new) == ["fc.bias", "fc.weight"]
    assert "'fc.weight' is declared new" in report.reasons["module.fc.weight"]


def test_a_pattern_naming_nothing_names_the_nearest_modules() -> None:
    model = _with("classifier", nn.Linear(8, 3))
    for pattern, nearest in (("head.*", "'classifier'"), ("clasifier", "'classifier'"),
                             ("bodi", "'body'")):
        with pytest.raises(tg.TorchgraftError, match="names no key of the model") as caught:
            tg.graft(_backbone().state_dict(), model, new=pattern)
        message = str(caught.value)
        assert f"the nearest names in it are {nearest}" in message, message
        assert "stem.weight" not in message  # not the first keys
    assert tg.graft(_backbone().state_dict(), model, new="classifier").ok  # the control


def test_the_last_of_many_numbered_blocks_is_no_head() -> None:
    targets = [f"blocks.{i}.weight" for i in range(6)]
    assert new_parts(targets, {f"blocks.{i}.weight" for i in range(2, 6)}) == []
    assert new_parts(targets, {"blocks.5.weight"}) == ["blocks.5"]  # the control: one block
