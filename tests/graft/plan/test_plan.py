"""build_plan on metadata alone: matching steps, layouts, adaptations, reasons."""

from __future__ import annotations

import pytest
import torch

from torchgraft.graft import Side, TensorInfo, build_plan, parse_rules
from torchgraft.graft.layouts import ops
from torchgraft.graft.layouts.catalogue import GPT2_CONV1D, PADDLE
from torchgraft.graft.plan.adapt import InputChannels, Rows, reversible
from torchgraft.graft.sides.heads import Described


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
    assert isinstance(reversible(steps["fc.weight"].ops[0]), ops.Transpose)
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
        " Without adapt=False (CLI: --no-adapt) it is re-initialised; or add a rule that drops it.")
    odd = build_plan(side({"fc.weight": (5, 9)}), side({"fc.weight": (6, 8)}))
    assert "another configuration" in odd.missing["fc.weight"]  # its input width differs


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


def test_structure_voids_only_a_local_conflict() -> None:
    # The source defines a block's shortcut first, the target its downsample last.
    src = side({"stem.weight": (8, 3, 3, 3), "block.shortcut.weight": (16, 8, 1, 1),
                "block.a.weight": (16, 8, 3, 3), "block.b.weight": (16, 16, 3, 3),
                "head.weight": (5, 16)})
    dst = side({"conv1.weight": (8, 3, 3, 3), "layer.conv1.weight": (16, 8, 3, 3),
                "layer.conv2.weight": (16, 16, 3, 3), "layer.downsample.weight": (16, 8, 1, 1),
                "fc.weight": (5, 16)})
    plan = build_plan(src, dst)
    assert {s.target: s.source for s in plan.steps} == {
        "conv1.weight": "stem.weight", "layer.conv1.weight": "block.a.weight",
        "layer.conv2.weight": "block.b.weight", "layer.downsample.weight": "block.shortcut.weight",
        "fc.weight": "head.weight"}


def test_structure_names_what_stayed_ambiguous() -> None:
    src = side({"x.weight": (4, 4), "a.weight": (4, 4), "b.weight": (4, 4), "y.weight": (2, 4)})
    dst = side({"p.weight": (4, 4), "q.weight": (4, 4), "z.weight": (2, 4)})
    plan = build_plan(src, dst)
    assert {s.target: s.source for s in plan.steps} == {"z.weight": "y.weight"}
    assert "structure is ambiguous" in plan.missing["p.weight"]
    assert "'x', 'a', 'b'" in plan.missing["p.weight"]


def test_bookkeeping_never_changes_a_group_size() -> None:
    paddle_bn = {"bn._mean": (8,), "bn._variance": (8,), "bn.weight": (8,), "bn.bias": (8,)}
    src = side({"c.weight": (8, 3, 3, 3), **paddle_bn}, fmt="paddle")
    dst = side({"conv.weight": (8, 3, 3, 3), "norm.weight": (8,), "norm.bias": (8,),
                "norm.running_mean": (8,), "norm.running_var": (8,),
                "norm.num_batches_tracked": ()}, kinds={"conv": "conv", "norm": "norm"})
    plan = build_plan(src, dst, layouts=[PADDLE])
    pairs = {s.target: s.source for s in plan.steps}
    assert pairs["norm.running_var"] == "bn._variance" and pairs["norm.weight"] == "bn.weight"
    assert list(plan.missing) == ["norm.num_batches_tracked"]


def test_sorted_file_order_is_recovered_from_names() -> None:
    dims = {i: (i + 2, i + 1) for i in range(12)}
    sorted_names = sorted(f"h.{i}.w.weight" for i in dims)  # h.10 sorts before h.2
    src_side = side({n: dims[int(n.split(".")[1])] for n in sorted_names})
    assert not src_side.ordered and src_side.order[2] == "h.2.w.weight"
    dst = side({f"blocks.{i}.proj.weight": dims[i] for i in dims})
    plan = build_plan(src_side, dst, match="structure")
    assert all(s.source == s.target.replace("blocks", "h").replace("proj", "w")
               for s in plan.steps) and len(plan.steps) == 12


def test_gpt2_conv1d_recognised_from_a_file_either_side() -> None:
    from torchgraft.graft.layouts.catalogue import layouts_for, mark_file_kinds

    names = {"h.0.attn.c_attn.weight": (4, 12), "h.0.attn.c_attn.bias": (12,),
             "h.0.attn.c_proj.weight": (4, 4), "h.0.attn.c_proj.bias": (4,)}
    hf_file = mark_file_kinds(side(names))
    nano = side({k: (v[1], v[0]) if len(v) == 2 else v for k, v in names.items()},
                kinds={"h.0.attn.c_attn": "linear", "h.0.attn.c_proj": "linear"})
    for src, dst in ((hf_file, nano), (nano, side(names, kinds={
            "h.0.attn.c_attn": "gpt2_conv1d", "h.0.attn.c_proj": "gpt2_conv1d"}))):
        steps = {s.target: s for s in build_plan(src, dst, layouts=layouts_for(src, dst)).steps}
        proj = steps["h.0.attn.c_proj.weight"]
        assert isinstance(reversible(proj.ops[0]), ops.Transpose)  # square too
        assert not steps["h.0.attn.c_proj.bias"].ops
    assert mark_file_kinds(nano).tensors["h.0.attn.c_attn.weight"].kind == "linear"


def test_conv1d_bias_pairs_with_linear_bias_by_structure() -> None:
    src = side({"a.c_fc.weight": (4, 16), "a.c_fc.bias": (16,)}, kinds={"a.c_fc": "gpt2_conv1d"})
    dst = side({"mlp.up.weight": (16, 4), "mlp.up.bias": (16,)}, kinds={"mlp.up": "linear"})
    plan = build_plan(src, dst, layouts=[GPT2_CONV1D])
    assert {s.target: s.source for s in plan.steps} == {"mlp.up.weight": "a.c_fc.weight",
                                                        "mlp.up.bias": "a.c_fc.bias"}


def test_tied_target_filled_once() -> None:
    src = side({"wte.weight": (10, 4), "ln.weight": (4,)})
    dst = side({"wte.weight": (10, 4), "ln.weight": (4,), "lm_head.weight": (10, 4)})
    dst.ties = {"lm_head.weight": "wte.weight"}
    plan = build_plan(src, dst)
    assert plan.tied == {"lm_head.weight": "wte.weight"} and not plan.missing
    assert [s.target for s in plan.steps] == ["wte.weight", "ln.weight"]
    untied = side({"wte.weight": (10, 4), "ln.weight": (4,), "lm_head.weight": (10, 4)})
    plan = build_plan(untied, dst)
    assert plan.tied == {"lm_head.weight": "wte.weight"}
    assert "one tensor in the model but two in the checkpoint" in plan.warnings[0]
    assert "tied to 'wte.weight'" in plan.unused["lm_head.weight"]


def test_rotary_layout_needs_a_head_dim() -> None:
    from torchgraft.graft.layouts.catalogue import layouts_for

    hf = side({"model.layers.0.self_attn.q_proj.weight": (8, 8)})
    meta = side({"layers.0.attention.wq.weight": (8, 8)})
    plan = build_plan(hf, meta, layouts=layouts_for(hf, meta))
    assert "no head_dim" in plan.missing["layers.0.attention.wq.weight"]
    meta.head_dims = {"layers.0.attention": 4}
    (step,) = build_plan(hf, meta, layouts=layouts_for(hf, meta)).steps
    assert step.matched_by == "layout" and step.describe().startswith("rotary rows permuted")


def test_planning_a_70b_layout_from_metadata() -> None:
    """2,000+ tensors (Llama-2-70B's widths, 240 layers), through the transformers->Meta names."""
    layers, dim, kv, hidden = 240, 8192, 1024, 28672
    hf: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (32000, dim)}
    meta: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (32000, dim)}
    for i in range(layers):
        for hf_name, meta_name, shape in (
                ("self_attn.q_proj", "attention.wq", (dim, dim)),
                ("self_attn.k_proj", "attention.wk", (kv, dim)),
                ("self_attn.v_proj", "attention.wv", (kv, dim)),
                ("self_attn.o_proj", "attention.wo", (dim, dim)),
                ("mlp.gate_proj", "feed_forward.w1", (hidden, dim)),
                ("mlp.down_proj", "feed_forward.w2", (dim, hidden)),
                ("mlp.up_proj", "feed_forward.w3", (hidden, dim)),
                ("input_layernorm", "attention_norm", (dim,)),
                ("post_attention_layernorm", "ffn_norm", (dim,))):
            hf[f"model.layers.{i}.{hf_name}.weight"] = shape
            meta[f"layers.{i}.{meta_name}.weight"] = shape
    hf |= {"model.norm.weight": (dim,), "lm_head.weight": (32000, dim)}
    meta |= {"norm.weight": (dim,), "output.weight": (32000, dim)}
    from torchgraft.graft.layouts.catalogue import layouts_for

    src = side(dict(sorted(hf.items())))
    dst = side(meta)
    dst.head_dims = {f"layers.{i}.attention": 128 for i in range(layers)}
    plan = build_plan(src, dst, layouts=layouts_for(src, dst))
    assert len(plan.steps) == len(meta) > 2000 and not plan.missing and not plan.unused
    by_structure = build_plan(src, dst, match="structure",  # sorted names, as from a module
                              described=Described(source_is_module=True))
    assert {s.target: s.source for s in by_structure.steps} == {
        s.target: s.source for s in plan.steps}  # roles pair them: wq is q_proj, w1 gate_proj
    assert not by_structure.guesses and not by_structure.missing


def test_rotary_family_against_an_unknown_one_warns() -> None:
    hf = side({"model.layers.0.self_attn.q_proj.weight": (8, 4),
               "model.layers.0.self_attn.o_proj.weight": (4, 8),
               "model.layers.0.mlp.gate_proj.weight": (6, 4)})
    custom = side({"blocks.0.attn.query.weight": (8, 4), "blocks.0.attn.out.weight": (4, 8),
                   "blocks.0.ff.gate.weight": (6, 4)})
    plan = build_plan(hf, custom)
    assert len(plan.steps) == 3 and all(s.matched_by == "structure" for s in plan.steps)
    assert "rotary (RoPE) order" in plan.warnings[0]
    assert set(plan.guesses) == {"blocks.0.attn.query.weight"}  # q/k rows: which order?
    whisper = side({"model.layers.0.self_attn.q_proj.weight": (8, 4),
                    "model.layers.0.fc1.weight": (6, 4)})  # same attention names, no RoPE
    assert not build_plan(whisper, custom).warnings
