"""Grafts across code bases into a model on a GPU: the same verdicts and outputs as on the CPU.

Each case runs on the CPU everywhere and on ``cuda`` where a GPU is present (CI has none; a
machine with one runs the same file). A fused projection split (Meta Llama -> gpt-fast Llama)
and joined (back), from a file of each kind and from a live module on the CPU; outputs compared
on the CPU with the source's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.graft.pairs.handwritten import GptFastLlama
from tests.graft.pairs.values import randomise
from tests.models import MetaLlama

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))]
# hand-written, so that a GPU machine with torch alone runs this file
CODE_BASES: dict[str, type[MetaLlama | GptFastLlama]] = {"Meta Llama": MetaLlama,
                                                         "gpt-fast Llama": GptFastLlama}
PAIRS = [("Meta Llama", "gpt-fast Llama"), ("gpt-fast Llama", "Meta Llama")]


def _built(name: str, *, deeper: bool = False) -> nn.Module:
    return CODE_BASES[name](96, 64, 2 + deeper, 4, 2, 112).eval()


def _tokens() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def _written(source: nn.Module, flavour: str, folder: Path) -> nn.Module | Path:
    if flavour == "module":
        return source
    path = folder / f"source.{flavour}"
    if flavour == "pt":
        torch.save(source.state_dict(), path)
    else:
        tg.save(source, path)
    return path


def _equal(target: nn.Module, expected: torch.Tensor, device: str) -> bool:
    with torch.no_grad():
        actual = target(_tokens().to(device)).cpu()
    return torch.allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flavour", ["safetensors", "pt", "module"])
@pytest.mark.parametrize(("source_name", "target_name"), PAIRS)
def test_graft_into_a_model_on_the_device(tmp_path: Path, device: str, flavour: str,
                                          source_name: str, target_name: str) -> None:
    source = randomise(_built(source_name)).eval()
    with torch.no_grad():
        expected = source(_tokens())
    target = _built(target_name).to(device)
    report = tg.graft(_written(source, flavour, tmp_path), target)
    assert report.complete and report.divergence is None, report
    assert {t.device.type for t in target.state_dict().values()} == {device}
    assert _equal(target, expected, device)
    # settled by comparing outputs: the source stays on the CPU, the model on the device
    settled = _built(target_name).to(device)
    report = tg.graft(source, settled, example_inputs=(_tokens().to(device),),
                      source_inputs=(_tokens(),), verify=True)
    assert report.ok and report.verified_with is not None, report
    assert _equal(settled, expected, device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_wrong_graft_on_the_device_is_not_ok(tmp_path: Path, device: str) -> None:
    """The broken twin: a source one block deeper fills nothing it should not, on any device."""
    source = randomise(_built("Meta Llama", deeper=True)).eval()
    target = _built("gpt-fast Llama").to(device)
    report = tg.graft(_written(source, "safetensors", tmp_path), target)
    assert not report.ok, report


@pytest.mark.parametrize("device", DEVICES)
def test_a_meta_model_gets_storage_on_the_device(tmp_path: Path, device: str) -> None:
    source = randomise(_built("Meta Llama")).eval()
    with torch.no_grad():
        expected = source(_tokens())
    with torch.device("meta"):
        target = _built("gpt-fast Llama")
    report = tg.graft(_written(source, "safetensors", tmp_path), target, device=device)
    assert report.complete, report
    tensors = list(target.state_dict().values())
    assert {t.device.type for t in tensors if t.numel()} == {device}
    assert _equal(target, expected, device)
