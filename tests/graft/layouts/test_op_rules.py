"""Rules that name an operation: a gpt-fast ``wqkv`` from a transformers Llama's q, k, v."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests.graft.pairs import references as ref
from tests.graft.pairs.codebases import ARCHS, HEADS, KV_HEADS
from tests.graft.pairs.pairs import outputs_equal, run
from tests.graft.pairs.values import randomise

HF, FAST = ARCHS["transformers Llama"], ARCHS["gpt-fast Llama"]
Q, K, V = (rf"model\.layers\.(\d+)\.self_attn\.{p}_proj\.weight" for p in "qkv")
FUSED = r"layers\.(\d+)\.attention\.wqkv\.weight"
LAYER = r"^model\.layers\.(\d+)\."

#: transformers' Llama names to gpt-fast's, for what only changes its name.
RENAMES: list[Any] = [
    [r"^model\.embed_tokens\.", "tok_embeddings."], [r"^model\.norm\.", "norm."],
    [r"^lm_head\.", "output."],
    [LAYER + r"self_attn\.o_proj\.", r"layers.\1.attention.wo."],
    [LAYER + r"mlp\.gate_proj\.", r"layers.\1.feed_forward.w1."],
    [LAYER + r"mlp\.down_proj\.", r"layers.\1.feed_forward.w2."],
    [LAYER + r"mlp\.up_proj\.", r"layers.\1.feed_forward.w3."],
    [LAYER + r"input_layernorm\.", r"layers.\1.attention_norm."],
    [LAYER + r"post_attention_layernorm\.", r"layers.\1.ffn_norm."],
]

#: transformers' Llama -> gpt-fast: Meta's rotary order, then q, k, v concatenated.
TO_FAST: list[Any] = [
    {"op": "rotary", "from": Q, "n_heads": HEADS, "to_halves": False},
    {"op": "rotary", "from": K, "n_heads": KV_HEADS, "to_halves": False},
    {"op": "concatenate", "from": [Q, K, V], "to": r"layers.\1.attention.wqkv.weight", "dim": 0},
    *RENAMES,
]

SIZES = [64, 32, 32]  # q rows, then k and v rows (fewer kv heads)

#: gpt-fast -> transformers' Llama: the reverse, rotary rows back in halves.
TO_HF: list[Any] = [
    {"op": "split", "from": FUSED, "sizes": SIZES,
     "to": [rf"model.layers.\1.self_attn.{p}_proj.weight" for p in "qkv"]},
    {"op": "rotary", "from": Q, "n_heads": HEADS, "to_halves": True},
    {"op": "rotary", "from": K, "n_heads": KV_HEADS, "to_halves": True},
    [r"^tok_embeddings\.", "model.embed_tokens."], [r"^norm\.", "model.norm."],
    [r"^output\.", "lm_head."],
    [r"^layers\.(\d+)\.attention\.wo\.", r"model.layers.\1.self_attn.o_proj."],
    [r"^layers\.(\d+)\.feed_forward\.w1\.", r"model.layers.\1.mlp.gate_proj."],
    [r"^layers\.(\d+)\.feed_forward\.w2\.", r"model.layers.\1.mlp.down_proj."],
    [r"^layers\.(\d+)\.feed_forward\.w3\.", r"model.layers.\1.mlp.up_proj."],
    [r"^layers\.(\d+)\.attention_norm\.", r"model.layers.\1.input_layernorm."],
    [r"^layers\.(\d+)\.ffn_norm\.", r"model.layers.\1.post_attention_layernorm."],
]


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return randomise(HF.build(), seed=1).eval()


@pytest.fixture(scope="module")
def fast(hf: torch.nn.Module) -> torch.nn.Module:
    model = FAST.build().eval()
    model.load_state_dict(ref.hf_llama_to_gpt_fast(hf.state_dict()))
    return model


def _file(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_a_fused_wqkv_is_filled_from_q_k_v_by_a_rule(hf: torch.nn.Module, fast: torch.nn.Module,
                                                     tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": TO_FAST}))
    model = FAST.build()
    report = tg.graft(_file(hf, tmp_path / "hf.safetensors"), model, rules=rules)
    assert report.ok and report.complete, report
    assert report.matched_by["layers.0.attention.wqkv.weight"] == "rule"
    assert report.evidence["layers.0.attention.wqkv.weight"] == "name"
    assert report.adapted["layers.1.attention.wqkv.weight"].startswith(
        "by rule 3: concatenate along dim 0 of model.layers.1.self_attn.q_proj.weight, ")
    for key, value in fast.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert outputs_equal(run(FAST, model), run(HF, hf))


def test_without_the_rules_the_graft_is_not_ok(hf: torch.nn.Module, tmp_path: Path) -> None:
    report = tg.graft(_file(hf, tmp_path / "hf.safetensors"), FAST.build())
    assert not report.ok


def test_the_reverse_split_fills_transformers_llama(hf: torch.nn.Module, fast: torch.nn.Module,
                                                    tmp_path: Path) -> None:
    model = HF.build()
    report = tg.graft(_file(fast, tmp_path / "fast.safetensors"), model, rules=TO_HF)
    assert report.ok and report.complete, report
    assert report.matched_by["model.layers.1.self_attn.k_proj.weight"] == "rule"
    for key, value in hf.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert outputs_equal(run(HF, model), run(FAST, fast))


def test_a_rule_with_the_wrong_head_count_diverges(hf: torch.nn.Module, tmp_path: Path) -> None:
    """The broken twin: a folder says its config, so outputs are compared and differ."""
    hf.save_pretrained(tmp_path / "hf")
    wrong = [dict(TO_FAST[0], n_heads=HEADS // 2), *TO_FAST[1:]]
    report = tg.graft(tmp_path / "hf", FAST.build(), rules=wrong)
    assert not report.ok
    assert report.verdict == "diverged"


def _error(hf: torch.nn.Module, tmp_path: Path, rules: list[Any]) -> str:
    with pytest.raises(tg.TorchgraftError) as caught:
        tg.graft(_file(hf, tmp_path / "hf.safetensors"), FAST.build(), rules=rules)
    return str(caught.value)


@pytest.mark.parametrize(("rule", "says"), [
    ({"op": "split", "from": Q, "sizes": [32, 16, 8], "to": ["a", "b", "c"]},
     "sizes [32, 16, 8] do not add up to 64"),
    ({"op": "fuse", "from": [Q, K]}, "unknown operation 'fuse'; use one of concatenate"),
    ({"op": "concatenate", "from": [r"model\.wq\.(\d+)", K], "to": "x"},
     r"'model\.wq\.(\d+)' matches no checkpoint key"),
    ({"op": "rotary", "from": Q, "to_halves": True, "n_heads": 5}, "64 rows are not 5 heads"),
    ({"op": "rotary", "from": Q, "to_halves": True}, "rotary takes one of head_dim and n_heads"),
    ({"op": "split", "from": Q, "count": "two", "to": ["a", "b"]},
     "split's count must be a whole number"),
    ({"op": "transpose", "from": Q, "axis": 1}, "transpose takes no field 'axis'"),
    ({"op": "split", "from": Q, "count": 2, "to": ["a"]}, "give one 'to' template per part"),
    ({"op": "concatenate", "from": [Q, r"model\.norm\.weight"], "to": "x"},
     "no key matches"),
    ({"op": "concatenate", "from": [r".*q_proj\.weight", r".*k_proj\.weight"], "to": "x"},
     "with the same groups: capture what tells them apart"),
    ({"op": "concatenate", "from": [Q, K], "to": "lm_head.weight"},
     "it would make 'lm_head.weight' twice"),
    # sizes are checked one by one as the rule is read (products and sums alone accept these)
    ({"op": "reshape", "from": Q, "shape": [-64, -64]}, "reshape: shape must be whole numbers "
                                                         "from 0, not [-64, -64]"),
    ({"op": "split", "from": Q, "sizes": [-32, 96], "to": ["a", "b"]},
     "split: sizes must be whole numbers from 1"),
    ({"op": "split", "from": Q, "count": -2, "to": ["a", "b"]}, "count must be whole numbers"),
    ({"op": "interleave", "from": [Q, K], "sizes": [0, 8], "to": "x"}, "interleave: sizes"),
    ({"op": "deinterleave", "from": Q, "sizes": [], "to": ["a", "b"]}, "deinterleave: sizes"),
    ({"op": "rotary", "from": Q, "to_halves": True, "head_dim": -2}, "rotary: head_dim"),
    ({"op": "reverse", "from": Q, "parts": -2}, "reverse: parts"),
    ({"op": "offset", "from": Q, "delta": float("nan")}, "delta must be a finite number"),
    ({"op": "weight_norm_split", "from": Q, "magnitude": [-64, 1], "to": ["g", "v"]},
     "weight_norm_split: magnitude"),
])
def test_bad_rules_name_the_rule(hf: torch.nn.Module, tmp_path: Path, rule: dict[str, Any],
                                 says: str) -> None:
    message = _error(hf, tmp_path, [[r"^x$", "y"], rule])
    assert message.startswith("rule 2"), message
    assert says in message, message


def test_convert_renames_only_and_says_so(hf: torch.nn.Module, tmp_path: Path) -> None:
    source = _file(hf, tmp_path / "hf.safetensors")
    with pytest.raises(tg.TorchgraftError, match="rule 1 .*only renaming rules apply here"):
        tg.convert(source, tmp_path / "out.safetensors", rules=TO_FAST)


def test_a_rule_of_one_input_applies_to_every_key_it_matches(hf: torch.nn.Module,
                                                              tmp_path: Path) -> None:
    """Patterns without groups: each q of every layer gets its rotary rows reordered."""
    rules = [dict(TO_FAST[0], **{"from": r".*\.q_proj\.weight"}), *TO_FAST[1:]]
    model = FAST.build()
    assert tg.graft(_file(hf, tmp_path / "hf.safetensors"), model, rules=rules).ok
    assert outputs_equal(run(FAST, model), run(HF, hf))
