"""Unit-offset norms: Gemma's ``x * (1 + weight)`` <-> a plain RMSNorm's ``x * weight``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_model
from torch import nn

import torchgraft as tg
from tests.models import ConvNormNet
from torchgraft.graft.evidence import Evidence, Verdict
from torchgraft.graft.layouts import norms

SIZES = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
         "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
NORMS = ["model.norm.weight", *(f"model.layers.{n}.{name}.weight" for n in range(2)
                                for name in ("input_layernorm", "post_attention_layernorm"))]


class HandWrittenRMSNorm(nn.Module):
    """A plain RMSNorm of a hand-written model: a class no table knows."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)


def _gemma() -> nn.Module:
    """transformers' Gemma, its norm weights drawn (they are zeros at initialisation)."""
    model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**SIZES)).eval()
    with torch.no_grad():
        for key in NORMS:
            model.get_parameter(key).normal_()
    return model


def _plain(norm: type[nn.Module] = nn.RMSNorm) -> nn.Module:
    """Gemma's own code with every norm a plain RMSNorm (``x * weight``): Llama's kind."""
    model = _gemma()
    for path, module in list(model.named_modules()):
        if type(module).__name__ == "GemmaRMSNorm":
            parent, _, leaf = path.rpartition(".")
            model.get_submodule(parent).register_module(leaf, norm(32, module.eps))
    return model


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("way", ["gemma->plain", "plain->gemma"])
def test_unit_offset_added_or_removed_by_the_norm_classes(way: str, ids: torch.Tensor) -> None:
    torch.manual_seed(0)
    gemma, plain = _gemma(), _plain()
    source, target = (gemma, plain) if way == "gemma->plain" else (plain, gemma)
    expected = _logits(source, ids)
    report = tg.graft(source, target)
    assert report.verdict is Verdict.OK and not report.guesses
    assert set(report.adapted) == set(NORMS)
    added = way == "gemma->plain"
    assert report.adapted["model.norm.weight"].startswith(
        f"unit offset: 1 {'added to' if added else 'taken from'} the norm's weight")
    assert torch.equal(plain.model.norm.weight, gemma.model.norm.weight + 1)
    assert torch.equal(_logits(target, ids), expected)
    verified = tg.graft(source, target, example_inputs=ids)
    assert verified.verdict is Verdict.OK and verified.max_abs_diff == 0


class UnitOffsetNorm(nn.Module):
    """A hand-written norm that scales by ``1 + g`` (x-transformers' ``unit_offset``)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.g, self.eps = nn.Parameter(torch.zeros(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, self.g.shape, 1 + self.g, self.eps)


class BatchFirstOnlyNorm(HandWrittenRMSNorm):
    """A plain norm whose forward refuses anything but ``[batch, sequence, width]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError("expected [batch, sequence, width]")
        return super().forward(x)


def test_a_norm_class_no_table_knows_is_measured_by_its_own_forward(ids: torch.Tensor) -> None:
    """A hand-written norm's forward, run on a copy with its scale 0 then -1, says it is plain:
    the offset is added, and nothing is a guess."""
    torch.manual_seed(1)
    gemma, plain = _gemma(), _plain(HandWrittenRMSNorm)
    report = tg.graft(gemma, plain)
    assert report.verdict is Verdict.OK and not report.guesses
    assert torch.equal(_logits(plain, ids), _logits(gemma, ids))
    assert norms.norm_offsets(plain)["model.norm.weight"] == 0.0


def test_a_unit_offset_norm_of_its_own_scale_name_is_measured() -> None:
    """``g`` is the scale (the one 1-D parameter); its forward says ``1 + g``."""
    model = nn.Sequential(UnitOffsetNorm(8, 1e-6), nn.Linear(8, 8), HandWrittenRMSNorm(8, 1e-6))
    assert norms.norm_offsets(model) == {"0.g": 1.0, "2.weight": 0.0}


def test_a_norm_whose_forward_says_nothing_beside_a_unit_offset_norm_is_a_guess(
        ids: torch.Tensor) -> None:
    """The twin: a forward that cannot be probed leaves the class unknown; the offset is added,
    as most norms are plain, but never said ok until outputs are compared (as they are, on
    generated inputs, wherever the source module is given)."""
    torch.manual_seed(1)
    gemma, plain = _gemma(), _plain(BatchFirstOnlyNorm)
    report = tg.graft(gemma, plain, verify=False)
    assert report.verdict is Verdict.UNVERIFIED and set(report.guesses) == set(NORMS)
    assert "does not tell" in report.guesses["model.norm.weight"].why
    assert torch.equal(_logits(plain, ids), _logits(gemma, ids))
    for inputs in (ids, None):
        settled = tg.graft(gemma, _plain(BatchFirstOnlyNorm), example_inputs=inputs)
        assert settled.verdict is Verdict.OK
        assert settled.evidence["model.norm.weight"] is Evidence.VERIFIED


def test_measuring_never_changes_the_callers_norm() -> None:
    norm = UnitOffsetNorm(8, 1e-6)
    with torch.no_grad():
        norm.g.normal_()
    before = norm.g.clone()
    assert norms.norm_offsets(norm) == {"g": 1.0}
    assert torch.equal(norm.g, before)


def test_a_table_saying_nothing_of_gemma_is_caught_by_outputs(
        monkeypatch: pytest.MonkeyPatch, ids: torch.Tensor) -> None:
    """The broken twin: with no entry for Gemma's norms, the offset is skipped; compared
    outputs then say diverged, never ok."""
    monkeypatch.setattr(norms, "UNIT_OFFSET", frozenset())
    torch.manual_seed(2)
    report = tg.graft(_gemma(), _plain(), example_inputs=ids)
    assert report.verdict is Verdict.DIVERGED and not report.ok
    assert not report.adapted


def test_a_gemma_folder_says_its_norms_by_its_config(tmp_path: Path, ids: torch.Tensor) -> None:
    """A file does not say its norms' offset; its folder's config builds Gemma (on meta),
    whose norms do: the offset is added, and the outputs compared agree."""
    torch.manual_seed(3)
    gemma = _gemma()
    gemma.save_pretrained(tmp_path / "gemma")
    plain = _plain()
    report = tg.graft(tmp_path / "gemma", plain)
    assert report.verdict is Verdict.OK and set(report.adapted) == set(NORMS)
    assert torch.allclose(_logits(plain, ids), _logits(gemma, ids), atol=1e-5)


def test_a_gemma_folder_whose_norms_no_table_names_diverges(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The twin: with no entry for Gemma's norms, the folder's model says them plain; the
    offset is skipped, and its outputs compared say diverged, never ok."""
    monkeypatch.setattr(norms, "UNIT_OFFSET", frozenset())
    torch.manual_seed(3)
    _gemma().save_pretrained(tmp_path / "gemma")
    report = tg.graft(tmp_path / "gemma", _plain())
    assert report.verdict is Verdict.DIVERGED and not report.adapted


def test_the_offset_is_added_in_the_wider_dtype() -> None:
    """A bfloat16 ``gamma - 1`` into a float32 plain norm: + 1 in float32, no bfloat16 rounding."""
    torch.manual_seed(4)
    gemma, plain = _gemma().to(torch.bfloat16), _plain()
    report = tg.graft(gemma, plain)
    assert report.verdict is Verdict.OK
    assert torch.equal(plain.model.norm.weight, gemma.model.norm.weight.float() + 1)
    assert not torch.equal(plain.model.norm.weight, (gemma.model.norm.weight + 1).float())


def test_a_source_model_says_the_norm_classes_of_a_bare_file(tmp_path: Path,
                                                             ids: torch.Tensor) -> None:
    torch.manual_seed(5)
    gemma, plain = _gemma(), _plain()
    save_model(gemma, str(tmp_path / "gemma.safetensors"))
    report = tg.graft(tmp_path / "gemma.safetensors", plain, source_model=_gemma(),
                      example_inputs=ids)
    assert report.verdict is Verdict.OK and report.verified_with.startswith("source_model=")
    assert set(report.adapted) == set(NORMS)
    assert torch.equal(_logits(plain, ids), _logits(gemma, ids))


def test_a_norm_on_the_meta_device_is_measured_on_a_copy_with_storage() -> None:
    with torch.device("meta"):
        model = nn.Sequential(UnitOffsetNorm(8, 1e-6), HandWrittenRMSNorm(8, 1e-6))
    assert norms.norm_offsets(model) == {"0.g": 1.0, "1.weight": 0.0}
    assert model[0].g.is_meta


def test_a_callable_source_model_says_the_norms_of_a_bare_file(tmp_path: Path,
                                                               ids: torch.Tensor) -> None:
    """A callable is built on meta once more to measure its norms (Gemma's table entry)."""
    torch.manual_seed(6)
    gemma = _gemma()
    save_model(gemma, str(tmp_path / "gemma.safetensors"))
    report = tg.graft(tmp_path / "gemma.safetensors", _plain(), source_model=_gemma)
    assert set(report.adapted) == set(NORMS) and not report.guesses


def _drawn(model: nn.Module) -> nn.Module:
    """Every floating tensor drawn (variances positive): a trained model's values."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5 if "var" in name
                             else torch.randn_like(tensor))
    return model.eval()


def test_a_frozen_norm_whose_state_is_buffers_is_measured_plain() -> None:
    from tests.models import FrozenBatchNorm2d
    model = ConvNormNet(FrozenBatchNorm2d)
    assert norms.norm_offsets(model) == {"bn.weight": 0.0}
    assert isinstance(model.bn.weight, torch.Tensor)  # the probe ran on a copy
    assert not isinstance(model.bn.weight, nn.Parameter)


@pytest.mark.parametrize("way", ["into frozen", "out of frozen"])
def test_grafts_between_frozen_and_trained_norms_fill_right(tmp_path: Path, way: str) -> None:
    from tests.models import FrozenBatchNorm2d
    frozen, trained = ConvNormNet(FrozenBatchNorm2d), ConvNormNet(nn.BatchNorm2d)
    source, target = (trained, frozen) if way == "into frozen" else (frozen, trained)
    _drawn(source)
    torch.save(source.state_dict(), tmp_path / "model.pt")
    x = torch.randn(2, 3, 8, 8)
    for given in (source, tmp_path / "model.pt"):
        report = tg.graft(given, target.eval(), example_inputs=x)
        assert report.ok, report
        with torch.no_grad():
            torch.testing.assert_close(target(x), source(x))


def test_a_frozen_norm_on_meta_keeps_no_unknown_value() -> None:
    """Control: a norm on meta whose buffers the probe would not set says nothing."""
    from tests.models import FrozenBatchNorm2d

    class CountingFrozenNorm(FrozenBatchNorm2d):
        def __init__(self, width: int) -> None:
            super().__init__(width)
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    with torch.device("meta"):
        model = ConvNormNet(CountingFrozenNorm)
    assert norms.norm_offsets(model) == {"bn.weight": None}
