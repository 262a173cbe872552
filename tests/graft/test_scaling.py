"""Cost linear in the number of tensors: 4x the tensors make at most 6x the calls.

A quadratic step (a loop over the keys for each key) makes 16x the calls at 4x the tensors.
The calls are counted (:func:`tests.helpers.calls`), not timed: a count is the same on a busy
machine (a timed ratio here once failed, 6.5x against 6x, under another suite's load); the
times are ``bench/plan.py``'s and ``bench/tensor_count.py``'s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from tests.helpers import assert_scales_linearly, calls
from torchgraft.graft import Side, TensorInfo, build_plan


def moe_names(experts: int, prefix: str = "") -> dict[str, TensorInfo]:
    names = [f"{prefix}layers.{layer}.mlp.experts.{e}.{proj}.weight" for layer in range(4)
             for e in range(experts) for proj in ("gate_proj", "up_proj", "down_proj")]
    return {n: TensorInfo(n, (4, 8), torch.float32, "linear") for n in names}


def plan_calls(experts: int, prefix: str) -> int:
    src = Side(moe_names(experts))
    dst = Side(moe_names(experts, prefix))
    return calls(lambda: build_plan(src, dst, match="name"))


@pytest.mark.parametrize("prefix", ["", "backbone."])  # exact names; a prefix only the model has
def test_planning_is_linear_by_name_and_by_prefix(prefix: str) -> None:
    assert_scales_linearly(lambda experts: plan_calls(experts, prefix), 100)  # 1.2k, 4.8k


def test_a_quadratic_step_would_be_caught() -> None:
    """The control: the same measure shows a step that loops over the keys for each key."""
    def quadratic(count: int) -> int:
        keys = list(moe_names(count))
        return calls(lambda: [sum(1 for other in keys if other == key) for key in keys])

    with pytest.raises(AssertionError):
        assert_scales_linearly(quadratic, 20)


def test_planning_pairs_every_tensor_through_a_prefix() -> None:
    plan = build_plan(Side(moe_names(10)), Side(moe_names(10, "backbone.")), match="name")
    assert len(plan.steps) == 120 and not plan.missing and not plan.unused
    assert {s.matched_by for s in plan.steps} == {"prefix"}


class Experts(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4, bias=False) for _ in range(count))


def graft_calls(tmp_path: Path, count: int, stored: int | None = None) -> int:
    """Calls to graft ``stored`` experts of ``count`` (all by default) into a meta model."""
    stored = count if stored is None else stored
    path = tmp_path / f"{count}-{stored}.safetensors"
    save_file({f"experts.{i}.weight": torch.full((4, 4), float(i)) for i in range(stored)}, path)
    with torch.device("meta"):
        model = Experts(count)
    return calls(lambda: tg.graft(path, model, strict=stored == count))


@pytest.mark.slow
def test_grafting_many_tensors_into_a_meta_model_is_linear(tmp_path: Path) -> None:
    assert_scales_linearly(lambda count: graft_calls(tmp_path, count), 250)


@pytest.mark.slow
def test_a_meta_model_mostly_left_on_meta_is_reported_in_linear_time(tmp_path: Path) -> None:
    assert_scales_linearly(lambda count: graft_calls(tmp_path, count, count // 10), 500)


def test_keys_left_on_meta_are_missing_and_the_rest_loaded(tmp_path: Path) -> None:
    save_file({f"experts.{i}.weight": torch.full((4, 4), float(i)) for i in range(3)},
              tmp_path / "three.safetensors")
    with torch.device("meta"):
        model = Experts(10)
    report = tg.graft(tmp_path / "three.safetensors", model)
    assert report.loaded == [f"experts.{i}.weight" for i in range(3)]
    assert report.missing == [f"experts.{i}.weight" for i in range(3, 10)]
    assert report.reasons["experts.9.weight"].endswith(
        "computed by the model's code (Linear.reset_parameters)")
    assert torch.equal(model.experts[2].weight, torch.full((4, 4), 2.0))


def test_grafting_inside_a_meta_device_context(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"weight": torch.ones(2, 2)}, path)
    with torch.device("meta"):
        model = nn.Linear(2, 2, bias=False)
        assert tg.graft(path, model).ok
    assert torch.equal(model.weight, torch.ones(2, 2))


def test_meta_fill_views_each_tensor_alone_so_it_saves_alone(tmp_path: Path) -> None:
    from safetensors.torch import save_model

    torch.save(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).state_dict(), tmp_path / "s.pt")
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    assert tg.graft(tmp_path / "s.pt", model).ok
    weight = model[0].weight
    assert weight.untyped_storage().nbytes() == weight.nbytes  # not the whole file mapped
    save_model(model, str(tmp_path / "again.safetensors"))  # no "tensors share memory"
    torch.save(weight, tmp_path / "w.pt")
    assert torch.equal(torch.load(tmp_path / "w.pt"), weight)
