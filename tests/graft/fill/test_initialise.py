"""What no checkpoint holds, computed by the model's own code on a meta-built model.

A transformers model built on meta and grafted from its own ``save_pretrained`` folder runs
and equals ``from_pretrained``'s outputs (rotary frequencies and position ids computed as its
own ``_init_weights`` does); a module's ``reset_parameters`` or its constructor computes the
rest. Broken twins: a buffer whose code raises, and one no code computes, stay on meta and are
reported missing with why, never loaded and never left as garbage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Verdict

X = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))


def _transformers_cases() -> list[tuple[str, Callable[[], Any], Callable[[], dict[str, Any]]]]:
    transformers = pytest.importorskip("transformers")
    tokens = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(4))
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    text = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 64}
    return [
        ("LlamaForCausalLM", lambda: transformers.LlamaConfig(**text),
         lambda: {"input_ids": tokens}),
        ("MistralForCausalLM", lambda: transformers.MistralConfig(**text),
         lambda: {"input_ids": tokens}),
        ("CLIPVisionModel", lambda: transformers.CLIPVisionConfig(**vision),
         lambda: {"pixel_values": pixels}),
        ("ViTForImageClassification", lambda: transformers.ViTConfig(num_labels=5, **vision),
         lambda: {"pixel_values": pixels}),
        # save_pretrained writes DINOv2's older names: the graft renames them as
        # from_pretrained does (transformers' own conversion mapping)
        ("Dinov2Model", lambda: transformers.Dinov2Config(
            **{k: v for k, v in vision.items() if k != "intermediate_size"}),
         lambda: {"pixel_values": pixels}),
    ]


@pytest.mark.parametrize("case", range(5))
def test_a_meta_transformers_model_grafted_from_its_folder_runs_as_from_pretrained(
        case: int, tmp_path: Path) -> None:
    import transformers

    name, config, inputs = _transformers_cases()[case]
    cls = getattr(transformers, name)
    torch.manual_seed(0)
    cls(config()).save_pretrained(tmp_path)
    expected = cls.from_pretrained(tmp_path).eval()
    with torch.device("meta"):
        model = cls(config())
    report = tg.graft(tmp_path, model)
    assert report.verdict is Verdict.OK, str(report)
    # its very class and config, every key by its own name: its twin would tell nothing, and
    # is not built beside it; keys renamed (older names in the folder) are compared
    by_name = all(how == "exact" for how in report.matched_by.values())
    assert (report.verified_with is None) is by_name, report.verified_with
    assert not [k for k in model.state_dict(keep_vars=True).values() if k.is_meta]
    assert not [b for b in model.buffers() if b.is_meta]
    assert not set(report.initialised) & set(report.loaded)
    with torch.no_grad():
        out, want = model.eval()(**inputs()), expected(**inputs())
    key = "logits" if "logits" in want else "last_hidden_state"
    assert torch.equal(out[key], want[key])
    if name.endswith("CausalLM"):  # rotary frequencies: non-persistent, computed by its code
        assert set(report.initialised) == {"model.rotary_emb.inv_freq",
                                           "model.rotary_emb.original_inv_freq"}
        assert all(how.endswith("._init_weights") for how in report.initialised.values())
        assert "init " in str(report) and report.counts()["initialised"] == 2


class Rotary(nn.Module):
    """A rotary embedding of no library: its frequencies computed by its constructor only."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.dim, self.base = dim, base
        self.register_buffer("inv_freq", 1.0 / base ** (torch.arange(0, dim, 2) / dim),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.cos(self.inv_freq).repeat(2)


class Scaled(nn.Module):
    """A scale whose buffer its ``reset_parameters`` computes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("scale", torch.empty(4), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.scale, 1 / math.sqrt(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


class Opaque(nn.Module):
    """A buffer its constructor computes from an argument it keeps under no name."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(width, dtype=torch.float32),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table


class Failing(Scaled):
    """Its ``reset_parameters`` works while it is built, and raises ever after; its size is
    an argument it keeps under no name (it cannot be rebuilt either)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.armed = True

    def reset_parameters(self) -> None:
        if getattr(self, "armed", False):
            raise ValueError("cannot compute the scale here")
        super().reset_parameters()


def _graft_into_meta(build: Callable[[], nn.Module], tmp_path: Path) -> tuple[nn.Module,
                                                                                nn.Module, Any]:
    torch.manual_seed(0)
    source = build()
    torch.save(source.state_dict(), tmp_path / "model.pt")
    with torch.device("meta"):
        model = build()
    return source, model, tg.graft(tmp_path / "model.pt", model)


def test_reset_parameters_and_a_rebuilt_module_compute_what_no_checkpoint_holds(
        tmp_path: Path) -> None:
    source, model, report = _graft_into_meta(lambda: nn.Sequential(Scaled(), Rotary(4)),
                                             tmp_path)
    assert report.verdict is Verdict.OK, str(report)
    assert report.initialised == {"0.scale": "Scaled.reset_parameters",
                                  "1.inv_freq": "Rotary(dim=, base=) rebuilt on cpu"}
    assert torch.equal(model(X), source(X))
    assert torch.equal(model[0].proj.weight, source[0].proj.weight)  # never re-initialised


def test_twin_a_buffer_whose_code_raises_stays_on_meta_named(tmp_path: Path) -> None:
    _source, model, report = _graft_into_meta(lambda: nn.Sequential(Failing(4)), tmp_path)
    assert report.verdict is Verdict.INCOMPLETE
    assert "0.scale" in report.missing and "0.scale" not in report.initialised
    reason = report.reasons["0.scale"]
    assert "Failing.reset_parameters raised ValueError: cannot compute the scale" in reason
    assert model[0].scale.is_meta  # never left holding what no code wrote
    assert not model[0].proj.weight.is_meta and "0.proj.weight" in report.loaded


def test_twin_a_buffer_no_code_computes_is_missing(tmp_path: Path) -> None:
    _source, model, report = _graft_into_meta(lambda: nn.Sequential(Opaque(4)), tmp_path)
    assert report.verdict is Verdict.INCOMPLETE
    assert model[0].table.is_meta
    assert "model's code did not compute it" in report.reasons["0.table"]
    assert "Opaque has no _init_weights, reset_parameters" in report.reasons["0.table"]


def test_a_key_the_checkpoint_lacks_is_computed_and_still_missing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.save(nn.Sequential(nn.Linear(4, 4)).state_dict(), tmp_path / "one.pt")
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    report = tg.graft(tmp_path / "one.pt", model)
    assert report.verdict is Verdict.INCOMPLETE
    assert {"1.weight", "1.bias"} <= set(report.missing)
    assert report.initialised["1.weight"] == "LayerNorm.reset_parameters"
    assert "computed by the model's code (LayerNorm.reset_parameters)" in report.reasons[
        "1.weight"]
    assert torch.equal(model[1].weight, torch.ones(4)) and model(X).isfinite().all()


class _Positions(nn.Module):
    """A projection with a position table its code computes (sinusoids), frozen or trained."""

    def __init__(self, *, trained: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.table = nn.Parameter(torch.empty(6, 4), requires_grad=trained)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            angles = torch.arange(6.0)[:, None] / 10_000 ** (torch.arange(4.0) / 4)
            self.table.copy_(torch.sin(angles))


def test_a_frozen_table_the_code_computes_alike_is_kept_as_an_assumption(
        tmp_path: Path) -> None:
    torch.save({k: v for k, v in _Positions(trained=False).state_dict().items()
                if k != "table"}, tmp_path / "no-table.pt")
    report = tg.graft(tmp_path / "no-table.pt", _Positions(trained=False))
    assert report.verdict is Verdict.UNVERIFIED and not report.missing
    assert report.initialised["table"].endswith("alike under any seed")


def test_a_trained_table_the_checkpoint_lacks_stays_missing(tmp_path: Path) -> None:
    """The twin: a parameter the model trains is learned, whatever its first value."""
    torch.save({k: v for k, v in _Positions(trained=True).state_dict().items()
                if k != "table"}, tmp_path / "no-table.pt")
    report = tg.graft(tmp_path / "no-table.pt", _Positions(trained=True))
    assert report.verdict is Verdict.INCOMPLETE and report.missing == ["table"]
