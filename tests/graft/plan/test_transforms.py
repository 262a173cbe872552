"""What a pair needs on the way: 1x1 convolutions <-> Linear, and widths refused, not adapted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

import torchgraft as tg
from tests.graft.pairs import stubs
from torchgraft.graft.evidence import Verdict

stubs.install()  # timm imports torchvision's FrozenBatchNorm2d, never used here
timm_layers = pytest.importorskip("timm.layers")


def _conv_mlp() -> nn.Module:
    """timm's pointwise MLP: 1x1 convolutions over [B, C, H, W]."""
    return timm_layers.ConvMlp(8, 16, 6, act_layer=nn.GELU).eval()


def _linear_mlp() -> nn.Module:
    """timm's Mlp: the same projections as Linear layers over channels-last inputs."""
    return timm_layers.Mlp(8, 16, 6, act_layer=nn.GELU).eval()


def _same_outputs(conv: nn.Module, linear: nn.Module) -> bool:
    """Equal outputs, up to the rounding of a convolution's kernel against a matmul's."""
    x = torch.randn(2, 8, 3, 5)
    with torch.no_grad():
        return torch.allclose(conv(x), linear(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
                              rtol=0, atol=1e-6)


@pytest.mark.parametrize("flavour", ["module", "safetensors"])
def test_1x1_convolutions_into_linear_layers(tmp_path: Path, flavour: str) -> None:
    torch.manual_seed(0)
    conv, linear = _conv_mlp(), _linear_mlp()
    source: object = conv
    if flavour == "safetensors":
        save_file(conv.state_dict(), tmp_path / "conv.safetensors")
        source = tmp_path / "conv.safetensors"
    report = tg.graft(source, linear)
    assert report.verdict is Verdict.OK and len(report.loaded) == 4
    assert report.adapted["fc1.weight"] == "reshaped to (16, 8) (a 1x1 convolution is a Linear)"
    assert torch.equal(linear.fc2.weight, conv.fc2.weight.reshape(6, 16))
    assert _same_outputs(conv, linear)


@pytest.mark.parametrize("flavour", ["module", "safetensors"])
def test_linear_layers_into_1x1_convolutions(tmp_path: Path, flavour: str) -> None:
    torch.manual_seed(1)
    linear, conv = _linear_mlp(), _conv_mlp()
    source: object = linear
    if flavour == "safetensors":
        save_file(linear.state_dict(), tmp_path / "linear.safetensors")
        source = tmp_path / "linear.safetensors"
    report = tg.graft(source, conv)
    assert report.verdict is Verdict.OK and len(report.loaded) == 4
    assert report.adapted["fc2.weight"] == ("reshaped to (6, 16, 1, 1) (a 1x1 convolution is a "
                                            "Linear)")
    assert _same_outputs(conv, linear)


@pytest.mark.parametrize("way", ["conv->linear", "linear->conv"])
def test_timm_conv_classifier_head_and_linear_head(way: str) -> None:
    """timm's ClassifierHead with ``use_conv=True`` (a 1x1 Conv2d ``fc``) and without."""
    torch.manual_seed(5)
    conv = timm_layers.ClassifierHead(16, 5, use_conv=True).eval()
    linear = timm_layers.ClassifierHead(16, 5).eval()
    source, target = (conv, linear) if way == "conv->linear" else (linear, conv)
    x = torch.randn(2, 16, 4, 4)
    report = tg.graft(source, target, example_inputs=x)
    assert report.verdict is Verdict.OK and report.verified_with == "the source module"
    assert report.adapted["fc.weight"].startswith("reshaped to")
    with torch.no_grad():
        assert torch.allclose(conv(x), linear(x), rtol=0, atol=1e-6)


class _Pointwise(nn.Module):
    """A hand-written twin of ConvMlp with Linear layers under other names (structure only)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in, self.proj_out = nn.Linear(8, 16), nn.Linear(16, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(nn.functional.gelu(self.proj_in(x)))


def test_1x1_convolutions_paired_by_structure_under_other_names() -> None:
    torch.manual_seed(2)
    conv, linear = _conv_mlp(), _Pointwise().eval()
    report = tg.graft(conv, linear)
    assert report.mapping == {"proj_in.weight": "fc1.weight", "proj_in.bias": "fc1.bias",
                              "proj_out.weight": "fc2.weight", "proj_out.bias": "fc2.bias"}
    assert report.verdict is Verdict.OK
    assert _same_outputs(conv, linear)


class _Conv3x3(nn.Module):
    """The broken twin: ConvMlp's names and channels, but 3x3 kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(8, 16, 3), nn.Conv2d(16, 6, 3)


@pytest.mark.parametrize("way", ["conv->linear", "linear->conv"])
def test_a_3x3_convolution_is_never_squeezed_into_a_linear(way: str) -> None:
    conv, linear = _Conv3x3(), _linear_mlp()
    source, target = (conv, linear) if way == "conv->linear" else (linear, conv)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    report = tg.graft(source, target)
    assert report.verdict is Verdict.INCOMPLETE and not report.adapted
    assert {"fc1.weight", "fc2.weight"} <= set(report.missing)
    assert all(torch.equal(target.state_dict()[k], before[k]) for k in report.missing)


def _gpt2(width: int, vocab: int = 50) -> nn.Module:
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=16, n_embd=width, n_layer=2,
                                     n_head=4, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("flavour", ["module", "safetensors"])
def test_gpt2_of_width_64_into_width_128_is_refused_as_another_configuration(
        tmp_path: Path, flavour: str) -> None:
    torch.manual_seed(3)
    narrow, wide = _gpt2(64), _gpt2(128)
    source: object = narrow
    if flavour == "safetensors":
        state = {k: v for k, v in narrow.state_dict().items() if k != "lm_head.weight"}  # tied
        save_file(state, tmp_path / "gpt2.safetensors")
        source = tmp_path / "gpt2.safetensors"
    before = {k: v.clone() for k, v in wide.state_dict().items()}
    report = tg.graft(source, wide)
    assert report.verdict is Verdict.INCOMPLETE
    assert not report.loaded and not report.adapted and not report.reinitialised
    for key in ("transformer.h.0.ln_1.weight", "transformer.ln_f.weight",
                "transformer.h.1.mlp.c_fc.bias", "transformer.wte.weight",
                "transformer.wpe.weight"):
        assert "another configuration" in report.reasons[key], key
    assert all(torch.equal(v, before[k]) for k, v in wide.state_dict().items())


def test_a_vocabulary_of_another_size_is_still_adapted() -> None:
    """The twin of the refusal: only the embedding's rows differ, and they are adapted."""
    torch.manual_seed(4)
    small, large = _gpt2(64, vocab=50), _gpt2(64, vocab=60)
    report = tg.graft(small, large)
    assert report.adapted["transformer.wte.weight"].startswith("rows 50->60: 50 kept")
    assert not report.missing
    assert torch.equal(large.transformer.wte.weight[:50], small.transformer.wte.weight)


def test_linear_weights_written_back_as_the_1x1_convolutions_of_their_file(
        tmp_path: Path) -> None:
    """``tg.save(layout_of=...)`` runs the reshape backwards: the file comes back bit for bit."""
    torch.manual_seed(6)
    conv = _conv_mlp()
    save_file(conv.state_dict(), tmp_path / "conv.safetensors")
    linear = _linear_mlp()
    assert tg.graft(tmp_path / "conv.safetensors", linear).ok
    tg.save(linear, tmp_path / "back.safetensors", layout_of=tmp_path / "conv.safetensors")
    back, stored = (load_file(tmp_path / name) for name in ("back.safetensors",
                                                            "conv.safetensors"))
    assert list(back) == list(stored)
    assert all(torch.equal(back[key], stored[key]) for key in stored)
