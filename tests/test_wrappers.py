"""Wrapper prefixes are removed only where a wrapper put them, never from a real module.

transformers' ``LlamaForCausalLM`` with tied embeddings saves only ``model.*`` keys: ``model`` is
its real top-level module, and removing it would rename every weight. Lightning's ``model.`` is
a wrapper only inside a Lightning checkpoint (fixture written by Lightning itself).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import torchgraft as tg
from torchgraft.wrappers import detect_wrappers

FIXTURE = Path(__file__).parent / "fixtures" / "lightning-model"
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder)
    return folder, model


def test_a_real_model_prefix_is_kept_by_convert_diff_and_inspect(
        tied_llama: tuple[Path, nn.Module], tmp_path: Path) -> None:
    folder, model = tied_llama
    saved = load_file(folder / "model.safetensors")
    assert all(k.startswith("model.") for k in saved)  # the case that looked like a wrapper
    with tg.open(folder) as ckpt:
        assert ckpt.wrappers == []
    assert tg.inspect(folder).wrappers == []
    out = tmp_path / "model" / "model.safetensors"
    out.parent.mkdir()
    report = tg.convert(folder, out)
    assert report.wrappers_removed == "" and "wrappers" not in str(report)
    converted = load_file(out)
    assert list(converted) == list(saved)
    assert all(torch.equal(converted[k], saved[k]) for k in saved)
    shutil.copy(folder / "config.json", out.parent / "config.json")
    reloaded = transformers.LlamaForCausalLM.from_pretrained(out.parent).eval()
    ids = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(reloaded(ids).logits, model(ids).logits)
    assert tg.diff(folder, out).wrappers == {}
    fresh = transformers.LlamaForCausalLM(model.config)
    assert tg.graft(folder, fresh).ok
    assert torch.equal(fresh(ids).logits, model(ids).logits)


def test_lightning_model_prefix_is_a_wrapper_inside_a_lightning_checkpoint(
        tmp_path: Path) -> None:
    path = FIXTURE / "wrapped.ckpt"
    reference = load_file(FIXTURE / "reference.safetensors")
    weights = {k.removeprefix("weights/"): v for k, v in reference.items()
               if k.startswith("weights/")}
    with tg.open(path) as ckpt:
        assert [w.prefix for w in ckpt.wrappers] == ["model."]
        assert "pytorch-lightning_version" in ckpt.saved_keys
    out = tmp_path / "bare.safetensors"
    report = tg.convert(path, out)
    assert report.wrappers_removed == "model."
    converted = load_file(out)
    assert sorted(converted) == sorted(weights)
    assert all(torch.equal(converted[k], weights[k]) for k in weights)
    bare = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    bare.load_state_dict(converted)
    assert torch.equal(bare(reference["io/x"]), reference["io/y"])


def test_the_same_names_without_lightnings_evidence_keep_their_prefix(tmp_path: Path) -> None:
    with tg.open(FIXTURE / "wrapped.ckpt") as ckpt:
        state = tg.load(FIXTURE / "wrapped.ckpt")
        names = ckpt.keys()
    plain = tmp_path / "plain.pt"
    torch.save(state, plain)  # the same names, saved by a plain torch.save: no Lightning
    assert tg.open(plain).wrappers == []
    assert tg.convert(plain, tmp_path / "plain.safetensors").wrappers_removed == ""
    assert sorted(load_file(tmp_path / "plain.safetensors")) == sorted(names)
    assert detect_wrappers(names, saved=[]) == []
    assert [w.prefix for w in detect_wrappers(names, saved=["pytorch-lightning_version"])] == [
        "model."]
    parallel = nn.DataParallel(nn.Sequential(nn.Linear(2, 2)))
    wrapped = tmp_path / "dp.pt"
    torch.save(parallel.state_dict(), wrapped)
    assert tg.convert(wrapped, tmp_path / "dp.safetensors").wrappers_removed == "module."
