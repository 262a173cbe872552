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
from torchgraft.graft.check.source_model import from_folder
from torchgraft.graft.evidence import Evidence, Verdict
from torchgraft.graft.sides.build import empty_parameters
from torchgraft.graft.sides.inputs import Inputs, bind, from_config, read_inputs

pytest.importorskip("transformers")

from tests.graft.pairs.codebases import (
    TWIN_HEADS,
    hf_gpt2,
    hf_llama,
    meta_llama,
    nanogpt,
)
from tests.graft.pairs.codebases import (
    Inputs as PairInputs,
)
from tests.graft.pairs.values import randomise

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_source_model_settles_the_rotary_order(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A transformers Llama state dict into a Llama whose names no family table lists
    (torchtune's, taken off the table here): nothing tells the rotary order; outputs compared
    with the source's own model settle it."""
    pytest.importorskip("torchtune")
    from tests.graft.pairs.codebases import torchtune_llama
    from torchgraft.graft.layouts import catalogue as layouts

    monkeypatch.delitem(layouts._FAMILIES, "torchtune-llama")
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


class _Block(nn.Module):
    def __init__(self, first: str, second: str) -> None:
        super().__init__()
        self.names = (first, second)
        for name in self.names:
            self.add_module(name, nn.LayerNorm(8))
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = (getattr(self, n) for n in self.names)
        return second(self.proj(first(x)))


def test_a_unit_that_structure_swapped_is_settled() -> None:
    """Two same-shape norms filled the wrong way round (as structure can do where names say
    nothing): outputs compared with the source find the first diverging norm, try the
    same-shape modules, keep the exchange that makes it agree, and record it in the plan."""
    from dataclasses import replace

    from torchgraft.graft.check.reference import Reference
    from torchgraft.graft.check.settle import verify_graft
    from torchgraft.graft.search.activations import as_call
    from torchgraft.meta import TensorMeta, TensorRef

    torch.manual_seed(0)
    source = randomise(nn.Sequential(_Block("zeta", "alpha"), _Block("zeta", "alpha")))
    target = nn.Sequential(_Block("pre", "post"), _Block("pre", "post")).eval()
    x = torch.randn(3, 8)
    report = tg.graft(source, target, verify=False, example_inputs=(x,), source_inputs=(x,))
    plan = report.plan
    assert plan is not None and report.mapping["0.pre.weight"] == "0.zeta.weight"
    steps = {s.target: s for s in plan.steps}
    with torch.no_grad():  # what a wrong structural match leaves
        for leaf in ("weight", "bias"):
            first, second = f"0.pre.{leaf}", f"0.post.{leaf}"
            pre, post = getattr(target[0].pre, leaf), getattr(target[0].post, leaf)
            held = pre.clone()
            pre.copy_(post)
            post.copy_(held)
            steps[first], steps[second] = (replace(steps[second], target=first),
                                           replace(steps[first], target=second))
            report.mapping[first], report.mapping[second] = (steps[first].source,
                                                             steps[second].source)
    plan.steps = [steps[s.target] for s in plan.steps]
    refs = {key: TensorRef(TensorMeta.of(tuple(t.shape), t.dtype), t.detach().clone)
            for key, t in source.state_dict().items()}
    verify_graft(report, plan, target, Reference(source, as_call((x,)), as_call((x,)), {},
                                                 "the source"), refs=refs)
    assert report.verdict is Verdict.OK, str(report)
    assert report.settled == ["'0.pre' and '0.post' exchanged, found by comparing activations"]
    assert report.mapping["0.pre.weight"] == "0.zeta.weight"
    assert {s.target: s.source for s in plan.steps}["0.pre.weight"] == "0.zeta.weight"
    with torch.no_grad():
        assert torch.allclose(target(x), source(x))


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
    # verification asked for: the model is filled by then, so it is a warning, never an error
    report = tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4), verify=True,
                      source_model=lambda: nn.Linear(5, 6))
    assert report.max_abs_diff is None and report.ok
    assert any("could not be filled from the checkpoint" in w for w in report.warnings)


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


class _NoForward(nn.Module):
    """A container of the source model's layout that cannot itself be run."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = nn.ModuleDict({"model": inner})


def test_a_target_that_cannot_run_on_generated_inputs_is_not_compared(tmp_path: Path) -> None:
    """Inputs torchgraft made up that the target cannot take: a warning, not an error."""
    source = randomise(hf_llama())
    target = _NoForward(hf_llama())
    report = tg.graft(_saved(source, tmp_path), target.inner["model"])
    assert report.verdict is Verdict.OK  # the plain case, for contrast
    report = tg.graft(_saved(source, tmp_path / "again"), target, rules=[(r"^", "inner.model.")])
    assert report.verified_with is None
    assert any("outputs were not compared" in w and "on inputs generated from its config" in w
               for w in report.warnings)


def test_a_target_that_cannot_run_on_the_callers_inputs_is_an_error(tmp_path: Path) -> None:
    target = _NoForward(hf_llama())
    with pytest.raises(tg.TorchgraftError, match="failed on the example inputs"):
        tg.graft(_saved(randomise(hf_llama()), tmp_path), target, rules=[(r"^", "inner.model.")],
                 example_inputs=(TOKENS,))
