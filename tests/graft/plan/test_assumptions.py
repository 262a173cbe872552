"""A bare state dict grafted across code bases: what it cannot confirm is an assumption.

nanoGPT's ``.pt`` (a hand-written GPT: plain Linear layers) into transformers' GPT-2 (Conv1D
layers, weights stored transposed): every value lands right, but the file does not state the
attention's head count, and a GPT-2 of another head count has the same shapes. The verdict is
unverified until outputs are compared or something states the count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.models import NanoGPT
from torchgraft.graft.sides.heads import Described, config_heads, head_assumption, model_heads

transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(0))


def _gpt2(n_head: int = 4) -> nn.Module:
    config = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=2,
                                     n_head=n_head)
    return transformers.GPT2LMHeadModel(config).eval()


def _nanogpt(folder: Path, config: dict[str, Any] | None = None) -> tuple[Path, torch.Tensor]:
    torch.manual_seed(0)
    source = NanoGPT(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=64).eval()
    torch.save(source.state_dict(), folder / "nanogpt.pt")
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        return folder / "nanogpt.pt", source(TOKENS)


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits


def test_the_head_count_of_a_bare_file_across_code_bases_is_assumed(tmp_path: Path) -> None:
    path, expected = _nanogpt(tmp_path)
    target = _gpt2()
    report = tg.graft(path, target)
    assert report.verdict == "unverified" and not report.ok and report.exit_code == 3
    assert not report.guesses and not report.missing  # every key by name, transposed
    (assumption,) = report.assumptions
    assert assumption.what == "attention head count"
    assert assumption.assumed == "the model's: 4 heads, head size 16"
    assert "source_model=" in assumption.settle and "config.json" in assumption.settle
    data = json.loads(report.to_json())
    assert data["verdict"] == "unverified"
    assert data["assumptions"][0]["what"] == "attention head count"
    assert "assumed   attention head count" in str(report)
    assert "attention head count was assumed" in report.settle()
    torch.testing.assert_close(_logits(target), expected, rtol=1e-4, atol=1e-5)


def test_the_heads_twin_is_never_ok(tmp_path: Path) -> None:
    """Another head count, the same shapes: outputs differ, and the verdict is not ok."""
    path, expected = _nanogpt(tmp_path)
    target = _gpt2(n_head=2)
    report = tg.graft(path, target)
    assert report.verdict == "unverified"
    assert report.assumptions[0].assumed == "the model's: 2 heads, head size 32"
    assert not torch.allclose(_logits(target), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(tg.GraftError, match="assumed the attention head count"):
        tg.graft(path, _gpt2(n_head=2), strict=True)


def test_outputs_compared_settle_the_assumption(tmp_path: Path) -> None:
    path, _expected = _nanogpt(tmp_path)
    report = tg.graft(path, _gpt2(), example_inputs=TOKENS,
                      source_model=lambda: NanoGPT(96, 32, 2, 4, 64))
    assert report.ok and not report.assumptions and report.max_abs_diff is not None
    twin = tg.graft(path, _gpt2(n_head=2), example_inputs=TOKENS,
                    source_model=lambda: NanoGPT(96, 32, 2, 4, 64))
    assert twin.verdict == "diverged"


def test_a_config_beside_the_file_states_the_head_count(tmp_path: Path) -> None:
    path, expected = _nanogpt(tmp_path, {"n_head": 4, "n_embd": 64})
    target = _gpt2()
    report = tg.graft(path, target)
    assert report.ok and not report.assumptions
    assert any("names no transformers class" in w for w in report.warnings)
    torch.testing.assert_close(_logits(target), expected, rtol=1e-4, atol=1e-5)
    twin = tg.graft(path, _gpt2(n_head=2))  # the config says 4, the model has 2
    assert twin.verdict == "unverified"
    assert "its config.json states 4 heads, not the model's" in twin.assumptions[0].why



def test_a_config_nested_too_deep_states_nothing(tmp_path: Path) -> None:
    """A config.json bomb beside the file: no raw RecursionError, and nothing it could state."""
    path, expected = _nanogpt(tmp_path)
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    target = _gpt2()
    report = tg.graft(path, target)
    assert report.verdict == "unverified" and report.assumptions
    assert any("nest deeper than" in w for w in report.warnings)
    torch.testing.assert_close(_logits(target), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(tg.TorchgraftError, match="nest deeper than"):  # verification asked for
        tg.graft(path, _gpt2(), verify=True)

def test_a_graft_within_one_code_base_stays_ok(tmp_path: Path) -> None:
    """Every key by name, no layout between code bases: as load_state_dict would."""
    torch.manual_seed(0)
    torch.save(_gpt2().state_dict(), tmp_path / "gpt2.pt")
    assert tg.graft(tmp_path / "gpt2.pt", _gpt2()).ok
    assert tg.graft(tmp_path / "gpt2.pt", _gpt2(n_head=2)).ok  # load_state_dict says no more


@dataclass
class _Args:
    n_head: int = 8
    n_local_heads: int = 2
    dim: int = 64


class _WithConfig(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Args()
        self.attn = nn.MultiheadAttention(64, 8)


def test_head_counts_are_read_through_one_table() -> None:
    assert model_heads(_WithConfig())[0] == {
        "heads": frozenset({8}), "kv heads": frozenset({2}), "head size": frozenset({8})}
    assert model_heads(nn.Linear(2, 2)) == ({}, False)
    assert config_heads({"architecture": "vit", "model_args": {"num_heads": 4}}) == {
        "heads": frozenset({4})}
    assert config_heads({"text_config": {"num_attention_heads": 8, "num_key_value_heads": 2},
                         "vision_config": {"num_attention_heads": 4}}) == {
        "heads": frozenset({4, 8}), "kv heads": frozenset({2})}


def test_stated_counts_confirm_or_not() -> None:
    model = {"heads": frozenset({4}), "head size": frozenset({16})}
    assert head_assumption(Described({"heads": frozenset({4})}, model), lambda: True) is None
    differ = head_assumption(Described({"heads": frozenset({2})}, model), lambda: False)
    assert differ is None  # a config's counts, no attention module: an MLP
    differ = head_assumption(Described({"heads": frozenset({2})}, model,
                                       target_attention=True), lambda: False)
    assert differ is not None and "states 2 heads, not the model's" in differ.why
    silent = head_assumption(Described({}, {}), lambda: True)
    assert silent is not None and silent.assumed == "the model's (its modules do not state it)"
    assert head_assumption(Described({}, {}), lambda: False) is None  # no attention
