"""Files saved on GPUs load anywhere; device maps and dtype casts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchgraft as tg
from tests.helpers import SmallNet, assert_same_state, data_parallel_state, save_on


@pytest.mark.parametrize("legacy", [False, True])
def test_saved_on_cuda1_loads_on_this_machine(tmp_path: Path, model: SmallNet,
                                              legacy: bool) -> None:
    state = data_parallel_state(model)
    path = tmp_path / "dp.pth"
    save_on("cuda:1", state, path, _use_new_zipfile_serialization=not legacy)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA"):
            torch.load(path, weights_only=True)
    with tg.open(path) as ckpt:
        assert ckpt.saved_devices == {"cuda:1"}
        assert ckpt.meta("module.conv.weight").device == "cuda:1"
    loaded = tg.load(path)
    assert {t.device.type for t in loaded.values()} == {"cpu"}
    assert_same_state(loaded, state)
    assert_same_state(tg.load(path, device={"cuda:1": "cpu"}), state)
    assert_same_state(tg.load(path, device={"cuda": torch.device("cpu")}), state)


def test_whole_model_saved_on_gpu(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "whole.pt"
    save_on("cuda:0", model, path)
    with tg.open(path) as ckpt:
        assert ckpt.saved_devices == {"cuda:0"}
    assert_same_state(tg.load(path), model.state_dict())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_unavailable_devices_are_clear_errors(tmp_path: Path, state: dict) -> None:
    path = tmp_path / "gpu.pt"
    save_on("cuda:1", state, path)
    with pytest.raises(tg.DeviceError, match="device 'cuda:0' was requested"):
        tg.load(path, device="cuda:0")
    with pytest.raises(tg.DeviceError, match=r"saved on 'cuda:1'.*\{'cuda:1': 'cpu'\}"):
        tg.load(path, device={"cuda:7": "cpu"})
    with pytest.raises(tg.DeviceError, match="is not a device"):
        tg.load(path, device="gpu:0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_map_to_gpu(tmp_path: Path, state: dict) -> None:
    path = tmp_path / "gpu.pt"
    save_on("cuda:1", state, path)
    loaded = tg.load(path, device={"cuda:1": "cuda:0"})
    assert {str(t.device) for t in loaded.values()} == {"cuda:0"}
    assert_same_state({k: v.cpu() for k, v in loaded.items()}, state)


def test_dtype_cast_leaves_integer_buffers(tmp_path: Path, state: dict) -> None:
    path = tmp_path / "sd.pt"
    torch.save(state, path)
    loaded = tg.load(path, dtype="bf16")
    assert loaded["conv.weight"].dtype == torch.bfloat16
    assert loaded["bn.num_batches_tracked"].dtype == torch.int64
    assert torch.equal(loaded["conv.weight"], state["conv.weight"].bfloat16())
