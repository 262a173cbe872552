"""torch.export archives (.pt2) written by torch.export.save, and archives that lie."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.models import NanoGPT


class WithConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("shift", torch.arange(4.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x)) + self.shift


def _exported(tmp_path: Path, model: nn.Module, inputs: tuple[Any, ...],
              name: str = "model.pt2") -> Path:
    path = tmp_path / name
    torch.export.save(torch.export.export(model.eval(), inputs), path)
    return path


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return _exported(tmp_path, WithConstant(), (torch.randn(3, 6),))


def test_weights_and_constants_read_as_torch_export_loads_them(archive: Path) -> None:
    program = torch.export.load(archive)
    with tg.open(archive) as ckpt:
        assert ckpt.format == "torch-export"
        assert list(ckpt) == list(program.state_dict)
        for key, value in program.state_dict.items():
            assert torch.equal(ckpt.get(key), value), key
        assert ckpt.weight_sets == {"state_dict": 7, "constants": 1}
    constants = tg.load(archive, weights_key="constants")
    assert torch.equal(constants["shift"], program.constants["shift"])


def test_export_grafts_into_a_fresh_model_with_equal_outputs(archive: Path) -> None:
    program = torch.export.load(archive)
    torch.manual_seed(5)
    model = WithConstant().eval()
    report = tg.graft(archive, model, strict=True)
    assert report.ok
    x = torch.randn(3, 6)
    assert torch.equal(model(x), program.module()(x))


def test_tied_weights_stay_one_tensor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gpt = NanoGPT(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    path = _exported(tmp_path, gpt, (torch.randint(0, 50, (1, 8)),))
    torch.manual_seed(1)
    target = NanoGPT(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16).eval()
    report = tg.graft(path, target)
    assert report.ok
    assert torch.equal(target.lm_head.weight, gpt.lm_head.weight)
    idx = torch.randint(0, 50, (1, 8))
    assert torch.equal(target(idx), gpt(idx))


def test_bfloat16_export_converts_to_safetensors_and_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2)).bfloat16()
    path = _exported(tmp_path, model, (torch.randn(2, 4).bfloat16(),))
    tg.convert(path, tmp_path / "model.safetensors")
    loaded = tg.load(tmp_path / "model.safetensors")
    for key, value in model.state_dict().items():
        assert loaded[key].dtype == torch.bfloat16 and torch.equal(loaded[key], value)


def test_inspect_from_the_cli(archive: Path) -> None:
    info = tg.inspect(archive)
    assert info.format == "torch-export" and info.totals.tensors == 7


def _rewrite(path: Path, edit: Callable[[str, bytes], bytes | None]) -> None:
    """Rewrite an archive's members through ``edit`` (``None`` drops one), as torch lays it."""
    with zipfile.ZipFile(path) as old:
        members = [(info.filename, edit(info.filename, old.read(info))) for info in
                   old.infolist()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as new:
        for name, data in members:
            if data is not None:
                new.writestr(name, data)
    path.write_bytes(buffer.getvalue())


def _edit_config(change: Callable[[dict[str, Any]], None]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            change(config["config"]["fc.weight"])
            return json.dumps(config).encode()
        return data
    return edit


@pytest.mark.parametrize(("change", "error", "message"), [
    (lambda p: p["tensor_meta"].update(sizes=[{"as_int": 400}, {"as_int": 600}]),
     tg.CorruptCheckpointError, "reaches element"),
    (lambda p: p["tensor_meta"].update(storage_offset={"as_int": 10**6}),
     tg.CorruptCheckpointError, "reaches element"),
    (lambda p: p["tensor_meta"].update(sizes=[{"as_int": -4}, {"as_int": 6}]),
     tg.CorruptCheckpointError, "malformed shape"),
    (lambda p: p["tensor_meta"].update(sizes=[{"as_expr": "s0"}, {"as_int": 6}]),
     tg.UnsupportedCheckpointError, "symbolic"),
    (lambda p: p["tensor_meta"].update(dtype=99), tg.UnsupportedCheckpointError, "dtype code"),
    (lambda p: p.update(path_name="weight_999"), tg.CorruptCheckpointError, "missing entry"),
    (lambda p: p.update(use_pickle=True), tg.UnsupportedCheckpointError,
     "pickled tensor subclass"),
    (lambda p: p.pop("tensor_meta"), tg.CorruptCheckpointError, "has no layout"),
])
def test_archive_that_lies_is_refused_naming_the_tensor(
        archive: Path, change: Callable[[dict[str, Any]], None], error: type[Exception],
        message: str) -> None:
    _rewrite(archive, _edit_config(change))
    with pytest.raises(error, match=message) as info:
        tg.load(archive)
    assert str(archive) in str(info.value) and "fc.weight" in str(info.value)


def test_archive_without_configuration_is_refused(archive: Path) -> None:
    _rewrite(archive, lambda name, data: None if name.endswith("_config.json") else data)
    with pytest.raises(tg.CorruptCheckpointError, match="without weights"):
        tg.open(archive)


def test_archive_written_by_torch_2_5_and_older(tmp_path: Path) -> None:
    """The layout before raw weights: torch.save files inside the archive, as torch 2.5 wrote."""
    torch.manual_seed(0)
    model = WithConstant().eval()
    path = tmp_path / "old.pt2"

    def saved(obj: object) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("serialized_exported_program.json", b"{}")
        archive.writestr("serialized_state_dict.pt", saved(model.state_dict()))
        archive.writestr("serialized_constants.pt", saved({"shift": model.shift}))
        archive.writestr("version", b"7.3")
    with tg.open(path) as ckpt:
        assert ckpt.format == "torch-export"
        for key, value in model.state_dict().items():
            assert torch.equal(ckpt.get(key), value)
    assert torch.equal(tg.load(path, weights_key="constants")["shift"], model.shift)
