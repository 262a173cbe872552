"""Grafts and loads through the staging ring: a cast on the CPU here, pinned towards a GPU.

The GPU cases run where CUDA is present (``scripts/gpu_check.sh``); the same pipeline runs on
the CPU in CI whenever the target's dtype is not the stored one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from torchgraft.io import reads as reads_module

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _rings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """Record each reader's staging ring made: (buffers, buffer bytes, pinned)."""
    made: list[tuple[int, int, bool]] = []
    ring = reads_module._ring

    def recorded(count: int, buffer_bytes: int, pinned: bool) -> torch.Tensor:
        made.append((count, buffer_bytes, pinned))
        return ring(count, buffer_bytes, pinned)

    monkeypatch.setattr(reads_module, "_ring", recorded)
    return made


def _source() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 10))


def _written(source: nn.Module, folder: Path, kind: str) -> Path:
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    if kind == "pt":
        torch.save(state, folder / "m.pt")
        return folder / "m.pt"
    if kind == "sharded":
        import json

        keys = list(state)
        files = {"model-00001-of-00002.safetensors": keys[:2],
                 "model-00002-of-00002.safetensors": keys[2:]}
        for name, part in files.items():
            save_file({k: state[k] for k in part}, folder / name)
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: f for f, part in files.items() for k in part}}))
        return folder
    save_file(state, folder / "m.safetensors")
    return folder / "m.safetensors"


def _same(target: nn.Module, source: nn.Module, device: str) -> None:
    for (name, a), b in zip(target.state_dict().items(), source.state_dict().values(),
                            strict=True):
        assert a.device.type == device and torch.equal(a.cpu(), b.to(a.dtype)), name


@pytest.mark.parametrize("kind", ["safetensors", "pt", "sharded"])
def test_the_ring_on_the_cpu_fills_a_graft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           kind: str) -> None:
    """A cast sent through the ring as a device target is (on the CPU it is read from the
    file's mapping, one pass: see the twin below)."""
    source = _source()
    made = _rings(monkeypatch)
    monkeypatch.setattr(reads_module, "_staged", lambda read: not read.direct)
    target = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 10)).double()
    assert tg.graft(_written(source, tmp_path, kind), target, strict=True).ok
    _same(target, source, "cpu")
    assert made and not any(pinned for _, _, pinned in made)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_on_the_cpu_no_ring_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    dtype: torch.dtype) -> None:
    """The twin: read straight into the parameters, or cast from the file's mapping."""
    source = _source()
    made = _rings(monkeypatch)
    target = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 10)).to(dtype)
    assert tg.graft(_written(source, tmp_path, "safetensors"), target, strict=True).ok
    _same(target, source, "cpu")
    assert made == []


@GPU
@pytest.mark.parametrize("kind", ["safetensors", "pt", "sharded"])
@pytest.mark.parametrize("meta", [False, True])
def test_graft_into_a_cuda_model_through_pinned_buffers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, meta: bool) -> None:
    source = _source()
    made = _rings(monkeypatch)
    with torch.device("meta" if meta else "cuda"):
        target = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 10))
    options: dict[str, Any] = {"device": "cuda"} if meta else {}
    assert tg.graft(_written(source, tmp_path, kind), target, strict=True, **options).ok
    _same(target, source, "cuda")
    assert made and all(pinned for _, _, pinned in made)


@GPU
@pytest.mark.parametrize("kind", ["safetensors", "pt", "sharded"])
def test_load_onto_cuda_through_pinned_buffers(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               kind: str) -> None:
    source = _source()
    made = _rings(monkeypatch)
    loaded = tg.load(_written(source, tmp_path, kind), device="cuda", dtype=torch.bfloat16)
    for key, value in source.state_dict().items():
        assert loaded[key].is_cuda and torch.equal(loaded[key].cpu(), value.bfloat16()), key
    assert made and all(pinned for _, _, pinned in made)
