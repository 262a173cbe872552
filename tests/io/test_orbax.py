"""Orbax checkpoint folders written by orbax-checkpoint (scripts/make_framework_fixtures.py
orbax), read with tensorstore and grafted into PyTorch twins without JAX."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.io.framework_twins import AttentionTwin
from tests.io.test_flax import FlaxAttention, FlaxCNN, FlaxScan
from torchgraft.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MissingDependencyError,
    OutsideCheckpointError,
    TorchgraftError,
    UnsupportedCheckpointError,
)
from torchgraft.io import ReadOptions, open_contents

pytest.importorskip("tensorstore")

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks" / "orbax"


class NnxNet(nn.Module):
    """The Flax NNX model: Conv, BatchNorm, two residual Linears, LayerNorm, Linear head."""

    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(blocks))
        self.norm = nn.LayerNorm(4, eps=1e-6)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x.permute(0, 3, 1, 2)))).mean((2, 3))
        for block in self.blocks:
            y = y + torch.relu(block(y))
        return self.head(self.norm(y))


CASES = [("cnn", FlaxCNN), ("attention", FlaxAttention), ("scan", FlaxScan), ("nnx/7", NnxNet)]


@pytest.mark.parametrize(("name", "model"), CASES, ids=[c[0] for c in CASES])
def test_orbax_folders_graft_with_equal_outputs(name: str, model: type[nn.Module]) -> None:
    io = np.load(FIXTURES / f"{name.split('/')[0]}_io.npz")
    target = model().eval()
    report = tg.graft(FIXTURES / name, target)
    assert report.ok, report
    x = torch.from_numpy(io["x"])
    with torch.no_grad():
        out = target(x.long() if name == "attention" else x)
    np.testing.assert_allclose(out.numpy(), io["y"], rtol=1e-5, atol=1e-5)


def test_a_layer_more_another_width_or_head_count_is_never_ok() -> None:
    assert not tg.graft(FIXTURES / "scan", FlaxScan(layers=4), strict=False).ok
    assert not tg.graft(FIXTURES / "cnn", FlaxCNN(width=7), strict=False).ok
    assert not tg.graft(FIXTURES / "nnx" / "7", NnxNet(blocks=3), strict=False).ok
    four_heads = AttentionTwin(names=("query", "key", "value", "out"), head="head", heads=4)
    assert not tg.graft(FIXTURES / "attention", four_heads, strict=False).ok


@pytest.mark.parametrize(("name", "storage"), [("cnn", "OCDBT, zarr v2"),
                                               ("scan", "OCDBT, zarr v3"),
                                               ("attention", "zarr v2")])
def test_inspect_names_the_storage(name: str, storage: str) -> None:
    info = tg.inspect(FIXTURES / name)
    assert info.format == "orbax"
    assert info.extras["__metadata__"]["storage"] == storage


def test_convert_writes_pytorch_names_and_values(tmp_path: Path) -> None:
    out = tmp_path / "scan.safetensors"
    tg.convert(FIXTURES / "scan", out)
    converted = tg.load(out)
    assert set(converted) == set(FlaxScan().state_dict())
    for name, value in tg.load(FIXTURES / "scan").items():
        assert torch.equal(converted[name], value)


def test_a_block_is_read_from_a_layer_of_a_stack() -> None:
    contents = open_contents(FIXTURES / "scan", ReadOptions())
    try:
        ref = contents.root["blocks.1.fc.bias"]
        block = torch.empty(3)
        ref.read_box((2,), block)
        assert torch.equal(block, ref.read()[2:5])
        assert not torch.equal(ref.read(), contents.root["blocks.0.fc.bias"].read())
    finally:
        contents.close()


def test_a_checkpoint_manager_folder_names_its_steps() -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"steps 7: pass the step"):
        tg.open(FIXTURES / "nnx")


def _copy(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def test_a_shape_of_2_to_the_40_is_refused_before_reading(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "attention")
    zarray = folder / "params.head.kernel" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["shape"] = [1 << 20, 1 << 20]
    zarray.write_text(json.dumps(meta))
    start = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match="claim"):
        tg.open(folder)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("damage", ["manifest-cut", "manifest-garbled", "data-cut",
                                    "metadata-cut", "metadata-bomb", "metadata-shape"])
def test_damaged_folders_are_library_errors(tmp_path: Path, damage: str) -> None:
    folder = _copy(tmp_path, "cnn")
    data_file = next((folder / "d").iterdir())
    target = {"manifest-cut": folder / "manifest.ocdbt", "manifest-garbled":
              folder / "manifest.ocdbt", "data-cut": data_file,
              "metadata-cut": folder / "_METADATA", "metadata-bomb": folder / "_METADATA",
              "metadata-shape": folder / "_METADATA"}[damage]
    data = target.read_bytes()
    target.write_bytes({
        "manifest-cut": data[:len(data) // 2],
        "manifest-garbled": data[:20] + bytes(b ^ 0x5A for b in data[20:]),
        "data-cut": data[:len(data) // 2],
        "metadata-cut": data[:len(data) // 2],
        "metadata-bomb": b'{"tree_metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "metadata-shape": b'{"tree_metadata": {"a": {"key_metadata": "x"}}}',
    }[damage])
    start = time.monotonic()
    with pytest.raises(TorchgraftError):
        tg.load(folder)
    assert time.monotonic() - start < 5


def test_a_file_linking_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "attention")
    secret = tmp_path / "secret"
    secret.write_bytes(b"\0" * 32)
    chunk = folder / "params.head.bias" / "0"
    chunk.unlink()
    chunk.symlink_to(secret)
    with pytest.raises(OutsideCheckpointError):
        tg.open(folder)


def test_without_tensorstore_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    with pytest.raises(MissingDependencyError, match="tensorstore"):
        tg.open(FIXTURES / "cnn")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("fixture", "part"), [
    ("attention", "params.head.bias/0"), ("attention", "params.head.bias/.zarray"),
    ("cnn", "manifest.ocdbt"), ("cnn", "DATA"), ("cnn", "_METADATA")])
def test_a_special_file_in_the_folder_is_refused_before_tensorstore_opens_it(
        tmp_path: Path, fixture: str, part: str) -> None:
    folder = _copy(tmp_path, fixture)
    assert tg.load(folder)  # the control
    path = next((folder / "d").iterdir()) if part == "DATA" else folder / part
    path.unlink()
    os.mkfifo(path)  # tensorstore would open it and wait for a writer, forever
    if part == "_METADATA":  # never opened: not an Orbax item without it
        with pytest.raises(CheckpointNotFoundError, match="without _METADATA"):
            tg.open(folder)
        return
    with pytest.raises(UnsupportedCheckpointError, match="FIFO"):
        tg.open(folder)


def test_a_link_to_a_device_is_refused_even_when_links_are_followed(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "attention")
    chunk = folder / "params.head.bias" / "0"
    chunk.unlink()
    chunk.symlink_to("/dev/zero")
    with pytest.raises(UnsupportedCheckpointError, match="a character device"):
        tg.open(folder, follow_links=True)


def test_metadata_linking_out_is_refused_unless_followed(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "cnn")
    moved = tmp_path / "moved"
    shutil.move(folder / "_METADATA", moved)
    (folder / "_METADATA").symlink_to(moved)
    with pytest.raises(OutsideCheckpointError, match="_METADATA"):
        tg.open(folder)
    assert tg.load(folder, follow_links=True)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


#: Each path on which tensorstore fails with a ValueError: a damaged file, and the error.
_TENSORSTORE_FAILURES = {
    "listing the store": ("cnn", "d/ac31a4eca1249b3498d92281981785d0",
                          "its array store cannot be read"),
    "opening an array": ("attention", "params.head.kernel/.zarray", "cannot be opened"),
    "reading an array": ("attention", "params.head.kernel/0.0", "cannot be read"),
}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
@pytest.mark.parametrize("where", sorted(_TENSORSTORE_FAILURES))
def test_no_descriptor_stays_open_after_a_tensorstore_failure(tmp_path: Path,
                                                              where: str) -> None:
    """tensorstore closes a file on its own threads just after a read fails: the reader waits
    for it, so the caller counts none open (7 were in one fuzzing run)."""
    fixture, part, message = _TENSORSTORE_FAILURES[where]
    folder = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, folder)
    assert tg.load(folder)  # the control: whole, it loads
    data = (folder / part).read_bytes()
    (folder / part).write_bytes(data[:len(data) // 2])
    leaks = []
    for attempt in range(30):
        before = _fds()
        with pytest.raises(CorruptCheckpointError, match=message):
            tg.load(folder)
        if _fds() != before:
            leaks.append(attempt)
    assert not leaks, f"a descriptor open after attempts {leaks}"
    before = _fds()
    tg.load(FIXTURES / fixture)  # and after a load that succeeds
    assert _fds() == before
