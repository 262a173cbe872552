"""build_plan on metadata alone: matching steps, layouts, adaptations, reasons."""

from __future__ import annotations

import pytest
import torch

from torchgraft.graft import Side, TensorInfo, build_plan, parse_rules
from torchgraft.graft.adapt import InputChannels, Rows, Transpose
from torchgraft.graft.layouts import GPT2_CONV1D, PADDLE


def side(spec: dict[str, tuple[int, ...]], kinds: dict[str, str] | None = None,
         fmt: str | None = None, order: list[str] | None = None) -> Side:
    kinds = kinds or {}
    infos = {n: TensorInfo(n, s, torch.float32, kinds.get(n.rpartition(".")[0])) for n, s in
             spec.items()}
    return Side(infos, order or [], fmt)


NET = {"conv.weight": (8, 3, 3, 3), "conv.bias": (8,), "fc.weight": (5, 8), "fc.bias": (5,)}
KINDS = {"conv": "conv", "fc": "linear"}


def test_exact_and_wrappers_in_both_directions() -> None:
    plan = build_plan(side({f"module.{k}": v for k, v in NET.items()}), side(NET))
    assert {s.target: s.matched_by for s in plan.steps} == dict.fromkeys(NET, "wrapper")
    plan = build_plan(side(NET), side({f"model.{k}": v for k, v in NET.items()}))
    assert [s.source for s in plan.steps] == list(NET)
    plan = build_plan(side({f"module._orig_mod.{k}": v for k, v in NET.items()}), side(NET))
    assert not plan.missing and not plan.unused


def test_common_prefix_either_side() -> None:
    src = side({f"backbone.{k}": v for k, v in NET.items()} | {"head.weight": (3, 8)})
    plan = build_plan(src, side(NET), match="name")
    assert {s.matched_by for s in plan.steps} == {"prefix"}
    assert plan.unused == {"head.weight": "not in the model"}
    plan = build_plan(side(NET), side({f"encoder.{k}": v for k, v in NET.items()}))
    assert {s.target: s.source for s in plan.steps}["encoder.fc.bias"] == "fc.bias"


def test_rules_rename_and_drop() -> None:
    src = side({"features.0.weight": (8, 3, 3, 3), "features.0.bias": (8,),
                "classifier.weight": (1000, 8), "classifier.bias": (1000,)})
    rules = parse_rules([(r"^features\.0\.", "conv."), (r"^classifier\.", None)])
    plan = build_plan(src, side(NET), rules=rules, match="name")
    assert {s.target: s.matched_by for s in plan.steps} == {"conv.weight": "rule",
                                                            "conv.bias": "rule"}
    assert plan.unused["classifier.weight"].startswith("dropped by rule")
    assert plan.missing["fc.weight"] == "no checkpoint tensor matches it by name"


def test_paddle_layout_transposes_square_linear_weights() -> None:
    src = side({"fc.weight": (8, 8), "fc.bias": (8,), "bn._mean": (8,), "bn._variance": (8,),
                "emb.weight": (8, 8)}, fmt="paddle")
    dst = side({"fc.weight": (8, 8), "fc.bias": (8,), "bn.running_mean": (8,),
                "bn.running_var": (8,), "emb.weight": (8, 8)},
               kinds={"fc": "linear", "bn": "norm", "emb": "embedding"})
    steps = {s.target: s for s in build_plan(src, dst, layouts=[PADDLE]).steps}
    assert isinstance(steps["fc.weight"].ops[0], Transpose)
    assert steps["fc.bias"].ops == () and steps["emb.weight"].ops == ()
    assert steps["bn.running_mean"].matched_by == "layout"


def test_gpt2_conv1d_transposes_only_conv1d() -> None:
    src = side({"attn.c_proj.weight": (8, 8), "ln.weight": (8,)},
               kinds={"attn.c_proj": "gpt2_conv1d", "ln": "norm"})
    dst = side({"attn.c_proj.weight": (8, 8), "ln.weight": (8,)},
               kinds={"attn.c_proj": "linear", "ln": "norm"})
    steps = {s.target: s for s in build_plan(src, dst, layouts=[GPT2_CONV1D]).steps}
    assert steps["attn.c_proj.weight"].describe() == \
        "transposed (GPT-2's Conv1D stores weights as [in, out])"
    assert steps["ln.weight"].ops == ()


def test_adaptations_and_their_messages() -> None:
    src = side(NET | {"fc.weight": (1000, 8), "fc.bias": (1000,)})
    dst = side(NET | {"conv.weight": (8, 4, 3, 3), "fc.weight": (21, 8), "fc.bias": (21,)},
               kinds=KINDS)
    steps = {s.target: s for s in build_plan(src, dst).steps}
    assert steps["conv.weight"].ops == (InputChannels(3, 4),)
    plan = build_plan(src, dst)
    assert "a new head, re-initialised (init='keep')" in plan.reinitialised["fc.weight"]
    kept = {s.target: s for s in build_plan(src, dst, label_map=range(21)).steps}
    assert kept["fc.weight"].ops == (Rows(1000, 21, "keep", tuple((i, i) for i in range(21))),)
    assert kept["fc.weight"].describe() == "rows 1000->21: 21 kept chosen by label_map"
    vocab = build_plan(side({"emb.weight": (10, 8)}), side({"emb.weight": (12, 8)},
                                                            kinds={"emb": "embedding"}))
    assert vocab.steps[0].ops == (Rows(10, 12),)
    strict = build_plan(src, dst, adapt=False)
    assert strict.missing["fc.weight"] == (
        "Cannot load 'fc.weight': checkpoint has (1000, 8) ('fc.weight'), model expects (21, 8)."
        " Pass adapt=True to re-initialise it, or a rule that drops it.")
    odd = build_plan(side({"fc.weight": (5, 9)}), side({"fc.weight": (6, 8)}))
    assert "Only a leading dimension" in odd.missing["fc.weight"]


def test_label_map_rows() -> None:
    src = side({"fc.weight": (10, 8)})
    dst = side({"fc.weight": (3, 8)})
    (step,) = build_plan(src, dst, label_map=[7, None, 2]).steps
    assert step.ops == (Rows(10, 3, "keep", ((0, 7), (2, 2))),)
    assert step.describe() == "rows 10->3: 2 kept chosen by label_map, 1 new (init=keep)"
    with pytest.raises(ValueError, match="outside"):
        build_plan(src, dst, label_map={0: 11})


def test_structure_matches_when_names_share_nothing() -> None:
    src = side({"features.0.weight": (8, 3, 3, 3), "features.0.bias": (8,),
                "features.3.weight": (5, 8), "features.3.bias": (5,)})
    plan = build_plan(src, side(NET, kinds=KINDS))
    assert {s.target: (s.source, s.matched_by) for s in plan.steps} == {
        "conv.weight": ("features.0.weight", "structure"),
        "conv.bias": ("features.0.bias", "structure"),
        "fc.weight": ("features.3.weight", "structure"),
        "fc.bias": ("features.3.bias", "structure")}
    assert not build_plan(src, side(NET), match="name").steps


def test_structure_refuses_ambiguity() -> None:
    src = side({"a.weight": (4, 4), "b.weight": (4, 4)})
    dst = side({"x.weight": (4, 4)})
    plan = build_plan(src, dst)
    assert not plan.steps
    assert "structure is ambiguous: checkpoint modules 'a', 'b' fit it" in plan.missing["x.weight"]


def test_structure_skips_an_inserted_module() -> None:
    src = side({"s1.weight": (4, 3), "s2.weight": (5, 4), "s3.weight": (6, 5)})
    dst = side({"t1.weight": (4, 3), "extra.weight": (9, 9), "t2.weight": (5, 4),
                "t3.weight": (6, 5)})
    plan = build_plan(src, dst)
    assert {s.target: s.source for s in plan.steps} == {
        "t1.weight": "s1.weight", "t2.weight": "s2.weight", "t3.weight": "s3.weight"}
    assert list(plan.missing) == ["extra.weight"]
