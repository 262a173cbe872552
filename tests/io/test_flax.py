"""Flax msgpack files written by flax.serialization.to_bytes and transformers' save_pretrained
(scripts/make_framework_fixtures.py), grafted into PyTorch twins without JAX."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import BOUNDED, assert_scales_linearly, calls
from tests.io.framework_twins import AttentionTwin, assert_bert_grafts
from torchgraft.bounds import MAX_NESTING
from torchgraft.errors import CorruptCheckpointError, TorchgraftError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks" / "flax"


class FlaxCNN(nn.Module):
    """Conv, BatchNorm, Dense, LayerNorm, Dense, with names of its own (matched by structure)."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, width)
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x.permute(0, 3, 1, 2)))).mean((2, 3))
        return self.head(self.norm(self.fc(y)))


def FlaxAttention() -> AttentionTwin:
    """nn.Embed, nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8), nn.Dense."""
    return AttentionTwin(names=("query", "key", "value", "out"), head="head")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8, eps=1e-6)
        self.fc = nn.Linear(8, 8)


class FlaxScan(nn.Module):
    """A Dense, three nn.scan-stacked blocks (LayerNorm, Dense), a Dense."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = x + torch.relu(block.fc(block.norm(x)))
        return self.out(x)


@pytest.mark.parametrize(("name", "model"), [("cnn", FlaxCNN), ("attention", FlaxAttention),
                                             ("scan", FlaxScan), ("cnn_bf16", FlaxCNN)])
def test_flax_msgpack_grafts_with_equal_outputs(name: str, model: type[nn.Module]) -> None:
    io = np.load(FIXTURES / f"{name}_io.npz")
    target = model().eval()
    path = FIXTURES / f"{name}.msgpack"
    if name.endswith("bf16"):  # Flax's bfloat16 arrays are read as bfloat16
        assert set(tg.inspect(path).by_dtype) == {"bfloat16"}
    report = tg.graft(path, target)
    assert report.ok, report
    x = torch.from_numpy(io["x"])
    with torch.no_grad():
        out = target(x.long() if name == "attention" else x)
    np.testing.assert_allclose(out.numpy(), io["y"], rtol=1e-5, atol=1e-5)


def test_transformers_flax_model_msgpack_grafts_into_bert() -> None:
    assert_bert_grafts(FIXTURES / "flax_bert" / "flax_model.msgpack", FIXTURES / "flax_bert_io.npz")


def test_a_layer_more_another_width_or_head_count_is_never_ok() -> None:
    assert not tg.graft(FIXTURES / "scan.msgpack", FlaxScan(layers=4), strict=False).ok
    assert not tg.graft(FIXTURES / "cnn.msgpack", FlaxCNN(width=7), strict=False).ok
    four_heads = AttentionTwin(names=("query", "key", "value", "out"), head="head", heads=4)
    assert not tg.graft(FIXTURES / "attention.msgpack", four_heads, strict=False).ok


def test_inspect_shows_the_scan_stack_and_convert_writes_pytorch_names(tmp_path: Path) -> None:
    info = tg.inspect(FIXTURES / "scan.msgpack")
    assert info.format == "flax"
    assert info.extras["__metadata__"]["scan_stacked"] == {"blocks": 3}
    out = tmp_path / "scan.safetensors"
    tg.convert(FIXTURES / "scan.msgpack", out)
    assert set(tg.load(out)) == set(FlaxScan().state_dict())


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.msgpack"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("data", [
    pytest.param(b"\x81\xa1a" * 100_000 + b"\xc0", id="nesting-bomb"),
    pytest.param(b"\x81\xa1a\xdf" + struct.pack(">I", 2**31), id="map-count"),
    pytest.param(b"\x81\xa1a\xc6" + struct.pack(">I", 2**31), id="bin-length"),
    pytest.param(b"\x81\xa1a\xc9" + struct.pack(">I", 20) + b"\x01\x93\x92\xce\x00\x10\x00\x00"
                 b"\xce\x00\x10\x00\x00\xa7float32\xc4\x04abcd", id="2^40-elements"),
])
def test_bad_msgpack_is_an_error_in_bounded_time(tmp_path: Path, data: bytes) -> None:
    path = _write(tmp_path, data)

    def refused() -> None:
        with pytest.raises(CorruptCheckpointError):
            tg.open(path)

    assert calls(refused) < BOUNDED  # not a walk of what the header claims


def test_truncated_file_is_an_error(tmp_path: Path) -> None:
    data = (FIXTURES / "cnn.msgpack").read_bytes()
    for cut in (5, len(data) // 2, len(data) - 1):
        with pytest.raises(TorchgraftError):
            tg.load(_write(tmp_path, data[:cut]))


def _to_bytes(tree: dict[str, object]) -> bytes:
    """What ``flax.serialization.to_bytes`` writes, by the msgpack library (flax's encoder):
    each array an extension of type 1 holding ``(shape, dtype name, bytes)``."""
    msgpack = pytest.importorskip("msgpack")

    def pack(value: object) -> object:
        if isinstance(value, np.ndarray):
            return msgpack.ExtType(1, msgpack.packb(
                (value.shape, value.dtype.name, value.tobytes("C")), use_bin_type=True))
        raise TypeError(type(value))

    packed: bytes = msgpack.packb(tree, default=pack, strict_types=True)
    return packed


def _many_modules(count: int) -> dict[str, object]:
    """``count`` modules, each with a two-dimensional bias (what a stacked layer has) and a
    kernel of another leading size: every bias looks for a stack, and none is one."""
    return {"params": {f"block_{i}": {"proj": {"bias": np.full((2, 3), i, np.float32),
                                               "kernel": np.zeros((3, 3), np.float32)}}
                       for i in range(count)}}


def test_many_leaves_are_walked_in_linear_time(tmp_path: Path) -> None:
    def cost(count: int) -> int:
        path = tmp_path / f"many{count}.msgpack"
        path.write_bytes(_to_bytes(_many_modules(count)))
        return calls(lambda: tg.open(path).close())

    assert_scales_linearly(cost, 400)
    with tg.open(tmp_path / "many400.msgpack") as ckpt:  # nothing taken for a stack
        assert ckpt.extras["__metadata__"]["scan_stacked"] == {}
        assert torch.equal(ckpt["block_7.proj.bias"], torch.full((2, 3), 7.0))


def _nested(depth: int) -> dict[str, object]:
    tree: dict[str, object] = {"kernel": np.zeros((2, 2), np.float32)}
    for _ in range(depth):
        tree = {"a": tree}
    return tree


def test_a_nesting_bomb_names_the_shared_bound(tmp_path: Path) -> None:
    path = _write(tmp_path, _to_bytes(_nested(MAX_NESTING - 10)))
    assert len(tg.load(path)) == 1  # the control: deep, inside the bound
    path = _write(tmp_path, _to_bytes(_nested(MAX_NESTING + 1)))
    with pytest.raises(CorruptCheckpointError, match=f"nest deeper than {MAX_NESTING}"):
        tg.open(path)
