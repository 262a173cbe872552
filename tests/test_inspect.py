"""tg.inspect: totals, wrappers and extras from metadata, without reading tensor bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests.helpers import SmallNet, data_parallel_state, save_on


def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def test_summary(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "ckpt.pth"
    save_on("cuda:1", {"epoch": 5, "state_dict": data_parallel_state(model)}, path)
    info = tg.inspect(path)
    n_params = sum(t.numel() for t in model.state_dict().values())
    assert info.format == "torch-zip"
    assert info.saved_devices == ["cuda:1"]
    assert [w.prefix for w in info.wrappers] == ["module."]
    assert info.weights_key == "state_dict"
    assert info.extras == {"epoch": 5}
    assert info.totals.tensors == len(model.state_dict())
    assert info.totals.parameters == n_params
    assert info.by_dtype["int64"].tensors == 1
    assert info.by_dtype["float32"].bytes == (n_params - 1) * 4
    data = json.loads(json.dumps(info.to_dict()))
    assert data["tensors"][0] == {"name": "module.conv.weight", "shape": [8, 3, 3, 3],
                                  "dtype": "float32", "nbytes": 864, "device": "cuda:1"}


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("fmt", ["torch-zip", "torch-legacy", "safetensors"])
def test_inspect_reads_no_tensor_bytes(tmp_path: Path, fmt: str) -> None:
    state = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(16)}  # 64 MiB
    path = tmp_path / "big.bin"
    if fmt == "safetensors":
        save_file(state, path)
    else:
        torch.save(state, path, _use_new_zipfile_serialization=fmt == "torch-zip")
    size = path.stat().st_size
    before = _bytes_read()
    info = tg.inspect(path)
    read = _bytes_read() - before
    assert info.format == fmt and info.totals.bytes == 64 * 2**20
    assert read < size / 100, f"inspect read {read} of {size} bytes"
    if fmt != "safetensors":  # the measure does see a full read
        before = _bytes_read()
        torch.load(path, weights_only=True)
        assert _bytes_read() - before >= size * 0.9
