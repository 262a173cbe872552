"""``tg.save(model, path, layout_of=source)``: a grafted model written back in its source's layout.

Each source is written by its library's own ``save_pretrained``; the file written back is
compared bit for bit with it, and loaded by the library's own ``from_pretrained``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import torchgraft as tg
from tests.graft.layouts.test_op_rules import TO_FAST
from tests.graft.pairs.codebases import ARCHS, DIM, LAYERS, VOCAB
from tests.graft.pairs.pairs import outputs_equal, run
from tests.graft.pairs.values import randomise
from tests.models import NanoGPT

GPT2, NANO = ARCHS["transformers GPT-2"], ARCHS["nanoGPT"]
LLAMA, META, FAST = ARCHS["transformers Llama"], ARCHS["Meta Llama"], ARCHS["gpt-fast Llama"]


def _saved(model: nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


def _written_back(model: nn.Module, source: Path, out: Path, **options: object) -> Path:
    """``model`` saved in the layout of the folder ``source``, as a folder of its own."""
    out.mkdir()
    shutil.copy(source / "config.json", out / "config.json")
    tg.save(model, out / "model.safetensors", layout_of=source, **options)  # type: ignore[arg-type]
    return out


def _bit_for_bit(written: Path, stored: Path) -> None:
    ours, theirs = load_file(written / "model.safetensors"), load_file(stored / "model.safetensors")
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    model = randomise(GPT2.build(), seed=3).eval()
    return model, _saved(model, tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    model = randomise(LLAMA.build(), seed=4).eval()
    return model, _saved(model, tmp_path_factory.mktemp("llama"))


def test_nanogpt_saved_as_gpt2_loads_in_transformers(gpt2: tuple[nn.Module, Path],
                                                     tmp_path: Path) -> None:
    hf, folder = gpt2
    nano = NANO.build()
    assert tg.graft(folder, nano).ok
    out = _written_back(nano, folder, tmp_path / "back")
    _bit_for_bit(out, folder)
    loaded = type(hf).from_pretrained(out).eval()
    assert outputs_equal(run(GPT2, loaded), run(GPT2, hf))
    assert torch.equal(run(GPT2, loaded), run(GPT2, hf))


def test_a_head_the_file_stores_apart_gets_the_tied_value(gpt2: tuple[nn.Module, Path],
                                                          tmp_path: Path) -> None:
    """A state dict written by safetensors stores lm_head apart from wte; nanoGPT ties them."""
    hf, _ = gpt2
    stored = {k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()}
    source = tmp_path / "gpt2.safetensors"
    save_file(stored, str(source))
    nano = NANO.build()
    report = tg.graft(source, nano)  # every value right; a bare file of another code base
    assert report.verdict == "unverified" and not report.guesses  # does not state its heads
    assert [a.what for a in report.assumptions] == ["attention head count"]
    tg.save(nano, tmp_path / "back.pt", layout_of=source)
    back = torch.load(tmp_path / "back.pt")
    assert sorted(back) == sorted(stored)
    assert all(torch.equal(back[k], v) for k, v in stored.items())


def test_meta_llama_saved_in_transformers_layout_undoes_rotary_rows(
        llama: tuple[nn.Module, Path], tmp_path: Path) -> None:
    hf, folder = llama
    meta = META.build()
    report = tg.graft(folder, meta)
    assert report.ok and report.verified_with  # the head count was a guess, settled by outputs
    assert any("rotary" in text for text in report.adapted.values())
    with pytest.raises(tg.TorchgraftError, match="by a guess"):
        tg.save(meta, tmp_path / "guessed.safetensors", layout_of=folder)
    out = tmp_path / "back"
    out.mkdir()
    shutil.copy(folder / "config.json", out / "config.json")
    tg.save(meta, out / "model.safetensors", layout_of=report)
    _bit_for_bit(out, folder)
    loaded = type(hf).from_pretrained(out).eval()
    assert torch.equal(run(LLAMA, loaded), run(LLAMA, hf))


def test_layout_of_a_report_and_operation_rules(llama: tuple[nn.Module, Path],
                                                tmp_path: Path) -> None:
    """gpt-fast's fused wqkv, made by rules, is taken apart again and its rotary rows undone."""
    _, folder = llama
    fast = FAST.build()
    report = tg.graft(folder / "model.safetensors", fast, rules=TO_FAST)
    assert report.ok
    out = tmp_path / "from_report"
    out.mkdir()
    tg.save(fast, out / "model.safetensors", layout_of=report)
    _bit_for_bit(out, folder)
    again = _written_back(fast, folder, tmp_path / "from_rules", rules=TO_FAST)
    _bit_for_bit(again, folder)


def test_a_model_of_another_configuration_is_an_error_not_a_file(
        gpt2: tuple[nn.Module, Path], tmp_path: Path) -> None:
    _, folder = gpt2
    for other in (NANO.build(deeper=True), NanoGPT(VOCAB, 32, LAYERS - 1, 4, DIM),
                  NanoGPT(VOCAB, 32, LAYERS, 4, DIM * 2)):
        with pytest.raises(tg.TorchgraftError, match="does not fit the checkpoint's layout"):
            tg.save(other, tmp_path / "wrong.safetensors", layout_of=folder)
        assert not (tmp_path / "wrong.safetensors").exists()


def test_allow_incomplete_writes_what_fits_and_says_what_not(
        gpt2: tuple[nn.Module, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, folder = gpt2
    shallower = randomise(NanoGPT(VOCAB, 32, LAYERS - 1, 4, DIM))
    with caplog.at_level(logging.WARNING, logger="torchgraft"):
        tg.save(shallower, tmp_path / "part.safetensors", layout_of=folder,
                allow_incomplete=True)
    written = load_file(tmp_path / "part.safetensors")
    first, second = (f"transformer.h.{n}.attn.c_attn.weight" for n in (0, 1))
    assert first in written and second not in written
    assert torch.equal(written[first], shallower.transformer.h[0].attn.c_attn.weight.T)
    assert f"'{second}': not in the model" in caplog.text


def test_a_guess_is_refused(llama: tuple[nn.Module, Path], tmp_path: Path) -> None:
    """A bare file does not say its head count: rotary rows reordered by the model's are a guess."""
    hf, _ = llama
    bare = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(bare))
    with pytest.raises(tg.TorchgraftError, match="by a guess"):
        tg.save(META.build(), tmp_path / "out.safetensors", layout_of=bare)


class EveryKind(nn.Module):
    """A tensor for each kind of operation a rule can name."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6, bias=False)  # stored transposed
        self.conv = nn.Conv2d(4, 3, 1, bias=False)  # stored as a Linear's [3, 4]
        self.norm = nn.LayerNorm(4)  # its weight stored as gamma - 1
        self.experts = nn.Parameter(torch.zeros(2, 3, 4))  # stored one expert per key
        self.p = nn.Linear(4, 3, bias=False)  # p and r stored as one [6, 4]
        self.r = nn.Linear(4, 3, bias=False)
        self.qkv = nn.Linear(4, 6, bias=False)  # stored as x, y, z, interleaved row by row
        self.cube = nn.Parameter(torch.zeros(4, 2, 3))  # stored [2, 3, 4]


EVERY_KIND: list[object] = [
    {"op": "transpose", "from": r"a_t\.weight", "to": "a.weight"},
    {"op": "reshape", "from": r"conv_lin\.weight", "to": "conv.weight", "shape": [3, 4, 1, 1]},
    {"op": "offset", "from": r"norm\.weight", "delta": 1.0},
    {"op": "stack", "from": ["e0", "e1"], "to": "experts"},
    {"op": "split", "from": r"pr\.weight", "count": 2, "to": ["p.weight", "r.weight"]},
    {"op": "interleave", "from": ["x", "y", "z"], "to": "qkv.weight", "sizes": [1, 1, 1]},
    {"op": "permute", "from": "cube_stored", "to": "cube", "dims": [2, 0, 1]},
]


def test_every_kind_of_rule_fills_the_model_and_is_undone_bit_for_bit(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(7)

    def values(*shape: int) -> torch.Tensor:  # eighths: gamma - 1 + 1 is exact
        return torch.randint(-16, 16, shape, generator=generator).float() / 8

    stored = {"a_t.weight": values(4, 6), "conv_lin.weight": values(3, 4),
              "norm.weight": values(4), "norm.bias": values(4), "e0": values(3, 4),
              "e1": values(3, 4), "pr.weight": values(6, 4), "x": values(2, 4),
              "y": values(2, 4), "z": values(2, 4), "cube_stored": values(2, 3, 4)}
    source = tmp_path / "stored.safetensors"
    save_file(stored, str(source))
    model = EveryKind()
    report = tg.graft(source, model, rules=EVERY_KIND)
    assert report.ok and report.complete, report
    assert set(report.matched_by.values()) == {"rule", "exact"}
    assert torch.equal(model.a.weight, stored["a_t.weight"].T)
    assert torch.equal(model.conv.weight, stored["conv_lin.weight"][:, :, None, None])
    assert torch.equal(model.norm.weight, stored["norm.weight"] + 1)
    assert torch.equal(model.experts, torch.stack([stored["e0"], stored["e1"]]))
    assert torch.equal(torch.cat([model.p.weight, model.r.weight]), stored["pr.weight"])
    assert torch.equal(model.qkv.weight[1::3], stored["y"])
    assert torch.equal(model.cube, stored["cube_stored"].permute(2, 0, 1))
    tg.save(model, tmp_path / "back.safetensors", layout_of=source, rules=EVERY_KIND)
    back = load_file(tmp_path / "back.safetensors")
    assert list(back) == list(load_file(source))
    assert all(torch.equal(back[k], v) for k, v in stored.items())
