"""Verification from files: a folder's config.json builds the source's own model, or
``source_model=`` gives it; outputs are compared on inputs generated from the config, and the
guesses of the first diverging unit are settled by trying their hypotheses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Evidence, Verdict
from torchgraft.graft.inputs import Inputs, bind, from_config, read_inputs
from torchgraft.graft.source_model import empty_parameters, from_folder

pytest.importorskip("transformers")

from tests.graft.pairs.codebases import (
    TWIN_HEADS,
    hf_gpt2,
    hf_llama,
    meta_llama,
    nanogpt,
    randomise,
)
from tests.graft.pairs.codebases import (
    Inputs as PairInputs,
)

TOKENS = PairInputs.make().tokens


def _saved(model: nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)  # type: ignore[operator]
    return folder


def test_a_folder_with_a_config_verifies_the_graft(tmp_path: Path) -> None:
    source = randomise(hf_llama())
    target = meta_llama().eval()
    report = tg.graft(_saved(source, tmp_path), target)
    assert report.verdict is Verdict.OK
    assert set(report.evidence.values()) == {Evidence.VERIFIED}
    assert report.verified_with is not None and "LlamaForCausalLM" in report.verified_with
    assert report.max_abs_diff is not None
    with torch.no_grad():
        assert torch.allclose(target(TOKENS), source(TOKENS).logits, atol=1e-5)


def test_another_head_count_with_the_same_shapes_diverges(tmp_path: Path) -> None:
    """Names and shapes all fit; only the outputs can tell: never ok."""
    report = tg.graft(_saved(randomise(hf_llama()), tmp_path), meta_llama(heads=TWIN_HEADS))
    assert report.verdict is Verdict.DIVERGED
    assert report.divergence is not None and "activations first diverge at 'layers.0" in \
        report.divergence
    assert report.exit_code == 4


def test_a_source_one_block_deeper_diverges(tmp_path: Path) -> None:
    report = tg.graft(_saved(randomise(hf_gpt2(deeper=True)), tmp_path), nanogpt())
    assert report.verdict is Verdict.DIVERGED
    assert not report.ok


def test_without_verification_the_same_graft_is_not_verified(tmp_path: Path) -> None:
    report = tg.graft(_saved(randomise(hf_llama()), tmp_path), meta_llama(), verify=False)
    assert report.max_abs_diff is None and report.verified_with is None
    assert Evidence.VERIFIED not in report.evidence.values()


def test_source_model_settles_the_rotary_order(tmp_path: Path) -> None:
    """A transformers Llama state dict into torchtune's Llama: nothing in the file tells the
    rotary order; outputs compared with the source's own model settle it."""
    pytest.importorskip("torchtune")
    from tests.graft.pairs.codebases import torchtune_llama

    source = randomise(hf_llama())
    torch.save(source.state_dict(), tmp_path / "llama.pt")
    guessed = tg.graft(tmp_path / "llama.pt", torchtune_llama(), verify=False)
    assert guessed.verdict is Verdict.UNVERIFIED
    target = torchtune_llama().eval()
    report = tg.graft(tmp_path / "llama.pt", target, source_model=hf_llama)
    assert report.verdict is Verdict.OK, str(report)
    assert report.settled and all("rotary rows" in s and "Meta order" in s
                                  for s in report.settled)
    with torch.no_grad():
        assert torch.allclose(target(TOKENS), source(TOKENS).logits, atol=1e-5)


def test_structure_that_swapped_two_norms_is_settled(tmp_path: Path) -> None:
    """A sorted file: the stem's BN and the first block's BN (same shapes) were swapped by
    structure; outputs compared with the source's own model find and undo it."""
    pytest.importorskip("efficientnet_pytorch")
    from tests.graft.pairs.codebases import hf_efficientnet, lukemelas_efficientnet

    source = randomise(lukemelas_efficientnet())
    save_file(dict(source.state_dict()), str(tmp_path / "model.safetensors"))
    images = (PairInputs.make().images,)
    unchecked = hf_efficientnet().eval()
    assert not tg.graft(tmp_path / "model.safetensors", unchecked, verify=False,
                        example_inputs=images).ok
    target = hf_efficientnet().eval()
    report = tg.graft(tmp_path / "model.safetensors", target, example_inputs=images,
                      source_model=lukemelas_efficientnet)
    assert report.verdict is Verdict.OK, str(report)
    assert report.settled == ["'efficientnet.embeddings.batchnorm' and 'efficientnet.encoder."
                              "blocks.0.depthwise_conv.depthwise_norm' swapped (same shapes, "
                              "matched by structure)"]
    assert report.mapping["efficientnet.embeddings.batchnorm.weight"] == "_bn0.weight"
    with torch.no_grad():
        assert torch.allclose(target(*images).logits, source(*images), atol=1e-5)


def test_source_model_never_settles_a_wrong_head_count(tmp_path: Path) -> None:
    pytest.importorskip("torchtune")
    from tests.graft.pairs.codebases import torchtune_llama

    torch.save(randomise(hf_llama()).state_dict(), tmp_path / "llama.pt")
    report = tg.graft(tmp_path / "llama.pt", torchtune_llama(heads=TWIN_HEADS),
                      source_model=hf_llama)
    assert report.verdict is Verdict.DIVERGED


def test_verify_true_without_anything_to_compare_with_is_an_error(tmp_path: Path) -> None:
    torch.save(nn.Linear(3, 4).state_dict(), tmp_path / "linear.pt")
    with pytest.raises(tg.TorchgraftError, match="verify=True needs something to compare"):
        tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4), verify=True)


def test_source_model_that_the_file_cannot_fill_is_said(tmp_path: Path) -> None:
    torch.save(nn.Linear(3, 4).state_dict(), tmp_path / "linear.pt")
    report = tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4),
                      source_model=lambda: nn.Linear(5, 6))
    assert report.max_abs_diff is None
    assert any("could not be filled from the checkpoint" in w for w in report.warnings)
    with pytest.raises(tg.TorchgraftError, match="could not be filled"):
        tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4), verify=True,
                 source_model=lambda: nn.Linear(5, 6))


def test_a_config_asking_for_remote_code_builds_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "auto_map": {"AutoModel": "evil.Model"},
         "model_type": "llama"}))
    assert from_folder(tmp_path) is None


def test_a_config_naming_no_transformers_model_builds_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["os.system"]}))
    assert from_folder(tmp_path) is None
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(tg.TorchgraftError, match="config.json is not valid JSON"):
        from_folder(tmp_path)


def test_empty_parameters_keeps_computed_buffers() -> None:
    with empty_parameters():
        model = hf_llama()
    assert all(p.is_meta for p in model.parameters())
    assert all(not b.is_meta for b in model.buffers())


def test_inputs_from_configs() -> None:
    clip = {"text_config": {"vocab_size": 50, "max_position_embeddings": 6},
            "vision_config": {"image_size": 16, "num_channels": 3}}
    made = from_config(clip)
    assert made["token ids"].shape == (1, 6) and int(made["token ids"].max()) < 50
    assert made["pixel values"].shape == (1, 3, 16, 16)
    whisper = from_config({"vocab_size": 9, "num_mel_bins": 4, "max_source_positions": 5})
    assert whisper["audio features"].shape == (1, 4, 10)
    assert from_config({"hidden_size": 3}) == {}


def test_inputs_are_bound_by_argument_name() -> None:
    class Clip(nn.Module):
        def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
            return image.sum() + text.sum()

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    inputs = Inputs({"token ids": torch.ones(1, 2), "pixel values": torch.zeros(1, 3)})
    args, kwargs = bind(Clip(), inputs)
    assert not args and kwargs["image"] is inputs["pixel values"]
    assert kwargs["text"] is inputs["token ids"]
    assert bind(Plain(), Inputs({"token ids": inputs["token ids"]}))[1]["x"] is \
        inputs["token ids"]
    with pytest.raises(tg.TorchgraftError, match="argument 'x'"):
        bind(Plain(), inputs)


def test_inputs_from_a_file(tmp_path: Path) -> None:
    save_file({"input_ids": torch.arange(6).view(1, 6)}, str(tmp_path / "inputs.safetensors"))
    read = read_inputs(tmp_path / "inputs.safetensors")
    assert list(read) == ["token ids"] and read["token ids"].tolist() == [[0, 1, 2, 3, 4, 5]]
    source = randomise(hf_llama())
    target = meta_llama().eval()
    report = tg.graft(_saved(source, tmp_path / "llama"), target, example_inputs=read)
    assert report.verdict is Verdict.OK and report.max_abs_diff is not None
    with pytest.raises(tg.TorchgraftError, match="inputs file not found"):
        read_inputs(tmp_path / "missing.safetensors")
