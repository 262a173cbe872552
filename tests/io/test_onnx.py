"""ONNX models written by torch.onnx.export, read back into their PyTorch classes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.errors import CorruptCheckpointError, OutsideCheckpointError, TorchgraftError

onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Net(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.emb = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.encoder = nn.Sequential(nn.Linear(8, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 4, bias=False)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).mean((2, 3)) + self.emb(ids)
        return self.head(self.encoder(self.norm(y)))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([1, 7])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Net, Path]:
    torch.manual_seed(0)
    model = Net().eval()
    path = tmp_path_factory.mktemp("onnx") / "net.onnx"
    torch.onnx.export(model, _inputs(), str(path), dynamo=False)
    return model, path


def test_legacy_export_grafts_back_with_recovered_names(exported: tuple[Net, Path]) -> None:
    model, path = exported
    info = tg.inspect(path)
    assert info.format == "onnx"
    # The bias-free Linear was exported as a MatMul on a transposed copy, 'onnx::MatMul_N'.
    renamed = info.extras["__metadata__"]["renamed_from_graph"]
    assert list(renamed) == ["head.weight"] and renamed["head.weight"].startswith("onnx::MatMul")
    target = Net()
    report = tg.graft(path, target)
    assert report.ok, report
    with torch.no_grad():
        torch.testing.assert_close(target(*_inputs()), model(*_inputs()), rtol=0, atol=0)


def test_external_data_is_read_by_offset(tmp_path: Path, exported: tuple[Net, Path]) -> None:
    model, path = exported
    proto = onnx.load(str(path))
    out = tmp_path / "external.onnx"
    onnx.save_model(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    target = Net()
    assert tg.graft(out, target).ok
    with torch.no_grad():
        torch.testing.assert_close(target(*_inputs()), model(*_inputs()), rtol=0, atol=0)
    converted = tmp_path / "net.safetensors"
    tg.convert(out, converted)
    assert set(tg.load(converted)) == set(Net().state_dict())


def test_dynamo_export_with_external_data_grafts_back(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = Net().eval()
    path = tmp_path / "dynamo.onnx"
    torch.onnx.export(model, _inputs(), str(path), dynamo=True, external_data=True)
    assert (tmp_path / "dynamo.onnx.data").is_file()
    target = Net()
    assert tg.graft(path, target).ok
    with torch.no_grad():
        torch.testing.assert_close(target(*_inputs()), model(*_inputs()), rtol=0, atol=0)


def test_another_width_is_never_ok(exported: tuple[Net, Path]) -> None:
    assert not tg.graft(exported[1], Net(hidden=32), strict=False).ok


def _external(tmp_path: Path, exported: tuple[Net, Path], **entries: str) -> Path:
    proto = onnx.load(str(exported[1]))
    weight = next(t for t in proto.graph.initializer if t.name == "conv.weight")
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in entries.items():
        item = weight.external_data.add()
        item.key, item.value = key, value
    path = tmp_path / "model.onnx"
    onnx.save_model(proto, str(path))
    (tmp_path / "w.bin").write_bytes(bytes(100))
    return path


def test_external_data_outside_the_folder_is_refused(tmp_path: Path,
                                                      exported: tuple[Net, Path]) -> None:
    with pytest.raises(OutsideCheckpointError):
        tg.open(_external(tmp_path, exported, location="../../etc/passwd"))


@pytest.mark.parametrize("entries", [
    {"location": "w.bin", "offset": str(2**40), "length": "864"},
    {"location": "w.bin", "length": "864"},
    {"location": "missing.bin"},
])
def test_external_data_past_the_end_is_an_error(tmp_path: Path, exported: tuple[Net, Path],
                                                entries: dict[str, str]) -> None:
    with pytest.raises(CorruptCheckpointError):
        tg.open(_external(tmp_path, exported, **entries))


def test_dims_claiming_2_to_the_40_elements_are_an_error(tmp_path: Path,
                                                          exported: tuple[Net, Path]) -> None:
    proto = onnx.load(str(exported[1]))
    weight = next(t for t in proto.graph.initializer if t.name == "conv.weight")
    weight.dims[:] = [2**20, 2**20]
    path = tmp_path / "huge.onnx"
    onnx.save_model(proto, str(path))
    start = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match="conv.weight"):
        tg.open(path)
    assert time.monotonic() - start < 2


def test_truncated_and_garbage_files_are_errors(tmp_path: Path,
                                                exported: tuple[Net, Path]) -> None:
    data = exported[1].read_bytes()
    for cut in (20, len(data) // 2, len(data) - 3):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(TorchgraftError):
            tg.load(path)
    bomb = tmp_path / "bomb.onnx"  # a field claiming 2^62 bytes
    bomb.write_bytes(b"\x08\x07\x3a" + b"\xff" * 8 + b"\x3f")
    with pytest.raises(CorruptCheckpointError):
        tg.open(bomb)
