"""Filling accelerator tensors through staging buffers: the pipeline, run on the CPU here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from torchgraft.io.staging import StagedFiller


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"small": torch.randn(8, 4), "rows": torch.randn(300, 16),
            "half": torch.randn(40, 40).half(), "scalar": torch.tensor(3.5),
            "wide": torch.randn(2, 600)}


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_every_tensor_arrives_whole_through_small_buffers(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"w{suffix}"
    state = _state()
    if suffix == ".pt":
        torch.save(state, path)
    else:
        save_file(state, path)
    filler = StagedFiller(torch.device("cpu"), buffer_bytes=1024, buffers=2, pin=False)
    with tg.open(path) as ckpt:
        refs = ckpt.tensor_refs()
        outs = {k: torch.zeros_like(v) for k, v in state.items()}
        for key, ref in refs.items():
            filler.fill(ref, outs[key])
    filler.finish()
    for key, value in state.items():
        assert torch.equal(outs[key], value), key
    # 'rows' (19 KiB) went through in row slices; 'wide' rows exceed a buffer: read whole
    assert filler.staged > len(state)


def test_a_failed_read_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file(_state(), path)
    with tg.open(path) as ckpt:
        refs = ckpt.tensor_refs()
        path.write_bytes(path.read_bytes()[:200])  # truncated under the open checkpoint
        filler = StagedFiller(torch.device("cpu"), buffer_bytes=1024, pin=False)
        with pytest.raises(tg.CorruptCheckpointError, match="rows"):
            filler.fill(refs["rows"], torch.zeros(300, 16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_graft_into_a_cuda_model_through_pinned_buffers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 10))
    tg.save(source, tmp_path / "m.safetensors")
    target = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 10)).cuda()
    assert tg.graft(tmp_path / "m.safetensors", target, strict=True).ok
    for (name, a), b in zip(target.state_dict().items(), source.state_dict().values(),
                            strict=True):
        assert a.is_cuda and torch.equal(a.cpu(), b), name
