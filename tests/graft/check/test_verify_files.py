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
from torchgraft.graft.sides.config import SIZES
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
    assert from_folder(tmp_path, shapes={}) is None


@pytest.mark.parametrize(("config", "reason"), [
    ({"architectures": ["LlamaForCausalLM"], "auto_map": {"AutoModel": "evil.Model"}},
     "asks for remote code ('auto_map': {'AutoModel': 'evil.Model'}), which torchgraft never "
     "runs"),
    ({"architectures": ["os.system"]}, "names 'os.system', which is no model class"),
    ({"model_type": "mine"}, "names no transformers class"),
    ([1, 2], "is not a JSON object"),
], ids=["remote code", "not transformers'", "no architectures", "not an object"])
def test_a_config_that_builds_no_model_is_named_with_its_reason(
        tmp_path: Path, config: object, reason: str) -> None:
    """verify=True is refused naming the config.json and why it builds nothing; without it,
    the warning says the same (the reason alone, before: the file went unnamed)."""
    torch.save(nn.Linear(3, 4).state_dict(), tmp_path / "linear.pt")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(tg.TorchgraftError) as caught:
        tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4), verify=True)
    assert str(caught.value).startswith(f"{tmp_path / 'config.json'}: verify=True needs "
                                        "something to compare with"), caught.value
    assert reason in str(caught.value)
    report = tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4))
    assert any(f"{tmp_path / 'config.json'} builds no model: it" in w and reason in w
               for w in report.warnings), report.warnings
    (tmp_path / "config.json").unlink()  # the control: no config, nothing to name
    with pytest.raises(tg.TorchgraftError, match="^verify=True needs something to compare"):
        tg.graft(tmp_path / "linear.pt", nn.Linear(3, 4), verify=True)


def test_a_config_naming_no_transformers_model_builds_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["os.system"]}))
    assert from_folder(tmp_path, shapes={}) is None
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(tg.TorchgraftError, match="config.json is not valid JSON"):
        from_folder(tmp_path, shapes={})


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


#: Each config entry that sizes a generated input, set to what a forger writes beside a tiny
#: checkpoint: (the config, the entries the error names).
_INPUT_CLAIMS = {
    "image_size": ({"image_size": 100_000}, ["'image_size' 100000"]),
    "img_size": ({"img_size": 100_000, "in_chans": 3}, ["'img_size' 100000"]),
    "image_size as a list": ({"vision_config": {"image_size": [100_000, 100_000]}},
                             ["'vision_config.image_size' [100000, 100000]"]),
    "num_channels": ({"num_channels": 10**9}, ["'num_channels' 1000000000"]),
    "in_chans": ({"in_chans": 10**9}, ["'in_chans' 1000000000"]),
    "mel bins and frames": ({"num_mel_bins": 100_000, "max_source_positions": 100_000},
                            ["'num_mel_bins' 100000", "'max_source_positions' 100000"]),
    "n_mels and n_audio_ctx": ({"n_mels": 80, "n_audio_ctx": 10**9},
                               ["'n_audio_ctx' 1000000000"]),
    "image_size negative": ({"image_size": -3}, ["'image_size' -3"]),
    "image_size fractional": ({"image_size": [3.5, 2]}, ["'image_size' [3.5, 2]"]),
    "vocab_size negative": ({"vocab_size": -5}, ["'vocab_size' -5"]),
    "n_ctx negative": ({"vocab_size": 5, "n_ctx": -3}, ["'n_ctx' -3"]),
}


@pytest.mark.parametrize("claim", sorted(_INPUT_CLAIMS))
def test_a_config_sizing_an_input_past_its_bound_is_refused_naming_the_entry(
        tmp_path: Path, claim: str) -> None:
    """Generated inputs are at most MAX_INPUT_BYTES: a claim past it (image_size 10^5: 120 GB,
    before a raw RuntimeError from the allocator) is an error naming the config and entries."""
    config, named = _INPUT_CLAIMS[claim]
    with pytest.raises(tg.TorchgraftError) as caught:
        from_config(config, path=tmp_path / "config.json")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: ") and all(
        n in message for n in named), message


def test_true_input_sizes_generate_their_inputs() -> None:  # the control
    made = from_config({"image_size": 1024, "num_channels": 3,  # SAM's: 12 MiB
                        "num_mel_bins": 128, "max_source_positions": 1500, "vocab_size": 9})
    assert made["pixel values"].shape == (1, 3, 1024, 1024)
    assert made["audio features"].shape == (1, 128, 3000)
    assert made["token ids"].shape == (1, 8)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved(randomise(hf_llama()), tmp_path_factory.mktemp("llama"))


def _claiming(folder: Path, work: Path, changes: dict[str, object]) -> Path:
    """A copy of a checkpoint folder whose config.json says ``changes`` too."""
    import shutil

    shutil.copytree(folder, work)
    config = json.loads((work / "config.json").read_text())
    for key, value in changes.items():
        scope, _, name = key.rpartition(".")
        (config.setdefault(scope, {}) if scope else config)[name] = value
    (work / "config.json").write_text(json.dumps(config))
    return work


@pytest.mark.parametrize("entry", [*sorted(SIZES), "text_config.num_hidden_layers"])
def test_a_config_sizing_its_model_past_the_checkpoint_is_refused_before_building(
        llama_folder: Path, tmp_path: Path, entry: str) -> None:
    """num_hidden_layers: 100000 beside a two-layer checkpoint built 100,000 layers to compare
    with (minutes of CPU); every entry that sizes a model is checked against the checkpoint's
    largest size (a dimension, or numbered parts of its keys) before anything is built."""
    folder = _claiming(llama_folder, tmp_path / "claims", {entry: 100_000})
    target = hf_llama()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(tg.TorchgraftError) as caught:
        tg.graft(folder, target, verify=True)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'config.json'}: verify=True: '{entry}' is 100000, "
                              "more than the checkpoint beside it holds"), message
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())  # untouched
    report = tg.graft(folder, hf_llama())  # without verify=True: filled, and said why not
    assert report.ok and report.max_abs_diff is None
    assert any(f"'{entry}' is 100000" in w for w in report.warnings), report.warnings


def test_a_size_per_stage_is_checked_size_by_size(llama_folder: Path, tmp_path: Path) -> None:
    """A list of sizes (EfficientNet's in_channels, a size per stage) is checked element by
    element: one past the checkpoint is refused; the control, all within it, is not."""
    refused = _claiming(llama_folder, tmp_path / "claims", {"in_channels": [16, 100_000]})
    with pytest.raises(tg.TorchgraftError, match=r"'in_channels' is \[16, 100000\], more than"):
        tg.graft(refused, hf_llama(), verify=True)
    within = _claiming(llama_folder, tmp_path / "within", {"in_channels": [16, 8]})
    assert not any("in_channels" in w for w in tg.graft(within, hf_llama()).warnings)


def test_a_config_sizing_its_model_as_the_checkpoint_does_verifies(llama_folder: Path,
                                                                   tmp_path: Path) -> None:
    # the control: the true config, and one whose entries say what the checkpoint holds
    # exactly (its layers counted from its keys)
    config = json.loads((llama_folder / "config.json").read_text())
    folder = _claiming(llama_folder, tmp_path / "true", {
        "num_hidden_layers": config["num_hidden_layers"], "vocab_size": config["vocab_size"]})
    report = tg.graft(folder, meta_llama(), verify=True)
    assert report.verdict is Verdict.OK and report.max_abs_diff is not None
