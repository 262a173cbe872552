"""Verification across output structures: what corresponds is compared, and it always answers.

Packed ``(B*T, V)`` logits against ``(B, T, V)``; pooled features against the token sequence
(the last paired module's activations); losses and integer outputs never compared; nothing
comparable, or a model that fails on the inputs, is a warning and the verdict the file earned.
Each "it works" case has a twin that computes something else and is not ok.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Evidence, Verdict

VOCAB, DIM, T = 11, 8, 5
IDS = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))


class Tower(nn.Module):
    """Embedding, a block, a norm, a head; what it returns is up to its subclasses."""

    def __init__(self, act: str = "gelu") -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.block = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU()

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.block(self.embed(ids))))


class Sequence(Tower):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(input_ids))  # (B, T, V)


class Packed(Tower):
    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.features(idx)).reshape(-1, VOCAB)  # (B*T, V)
        return {"loss": logits.sum() * torch.rand(()), "logits": logits, "codes": idx}


class Pooled(Tower):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.features(input_ids).mean(1)  # (B, DIM): no output corresponds


class Features(Tower):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.features(input_ids)  # (B, T, DIM)


class Codes(Tower):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.features(input_ids[:, :1]).argmax(-1)  # integers only, first token only


def _source(cls: type[Tower]) -> Tower:
    torch.manual_seed(1)
    return cls().eval()


def test_packed_logits_are_compared_with_the_sequence_by_flattening() -> None:
    source = _source(Packed)  # a loss (random) and integer codes beside: never compared
    target = Sequence()
    report = tg.graft(source, target, example_inputs={"input_ids": IDS}, verify=True)
    assert report.verdict is Verdict.OK, str(report)
    assert report.max_abs_diff is not None and report.max_abs_diff < 1e-6
    assert set(report.evidence.values()) == {Evidence.VERIFIED}


def test_twin_packed_logits_that_differ_diverge() -> None:
    source = _source(Packed)
    target = Sequence(act="relu")  # the same weights, another computation
    report = tg.graft(source, target, example_inputs={"input_ids": IDS}, verify=True)
    assert report.verdict is Verdict.DIVERGED
    assert "'norm'" in str(report.divergence)


def test_pooled_against_the_sequence_compares_the_last_paired_module() -> None:
    source = _source(Pooled)
    target = Features()
    report = tg.graft(source, target, example_inputs=(IDS,), verify=True)
    assert report.verdict is Verdict.OK, str(report)
    assert any("the activations of 'norm'" in w for w in report.warnings)
    twin = Features(act="relu")
    report = tg.graft(source, twin, example_inputs=(IDS,), verify=True)
    assert report.verdict is Verdict.DIVERGED


def test_nothing_comparable_is_a_warning_and_the_verdict_the_file_earned(tmp_path: Path) -> None:
    source = _source(Codes)
    target = Features()  # every key by name: ok from the file alone
    report = tg.graft(source, target, example_inputs=(IDS,), verify=True)
    assert report.verdict is Verdict.OK and report.max_abs_diff is None
    assert any("outputs were not compared" in w and "corresponds" in w for w in report.warnings)
    assert set(report.evidence.values()) == {Evidence.NAME}  # nothing verified


def test_inputs_are_bound_to_each_forward_by_argument_name() -> None:
    source = _source(Packed)  # forward(idx)
    target = Sequence()  # forward(input_ids)
    report = tg.graft(source, target, example_inputs={"input_ids": IDS}, verify=True)
    assert report.verdict is Verdict.OK and report.max_abs_diff is not None


def test_forward_raising_on_generated_inputs_is_a_warning(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=16,
                                      num_hidden_layers=1, num_attention_heads=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = transformers.LlamaForCausalLM(config)

    def refuse(*_args: Any) -> None:
        raise RuntimeError("no inputs of this kind")

    model.model.layers[0].mlp.forward = refuse  # raises inside the module
    report = tg.graft(tmp_path, model, verify=True)  # asked for: still never an exception
    assert report.verdict is Verdict.OK
    assert any("on inputs generated from its config" in w and "'model.layers.0.mlp'" in w
               and "no inputs of this kind" in w for w in report.warnings)
