"""safetensors files, and headers that lie."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests.helpers import assert_same_state


def test_round_trip_with_metadata(tmp_path: Path, state: dict[str, torch.Tensor]) -> None:
    extra = {"bf16": torch.randn(3, 2).bfloat16(), "f8": torch.randn(4).to(torch.float8_e5m2),
             "u8": torch.arange(5).byte(), "scalar": torch.tensor(2.0)}
    path = tmp_path / "model.safetensors"
    save_file({**state, **extra}, path, metadata={"format": "pt", "step": "10"})
    with tg.open(path) as ckpt:
        assert ckpt.format == "safetensors"
        assert ckpt.extras == {"__metadata__": {"step": "10"}}  # "format: pt" is a marker
        assert ckpt.saved_devices == {"cpu"}
    assert_same_state(tg.load(path), {**state, **extra}, ordered=False)


def _rewrite_header(path: Path, edit: object) -> None:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    edit(header)  # type: ignore[operator]
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h: h["w"].update(shape=[4, 5]), "data_offsets span"),
    (lambda h: h["w"].update(data_offsets=[0, 10**9]), "data_offsets span"),
    (lambda h: h["w"].update(shape=[10**6], data_offsets=[0, 4 * 10**6]), "truncated"),
    (lambda h: h["w"].update(dtype="float"), "unknown dtype"),
    (lambda h: h["w"].update(dtype=[]), "unknown dtype"),
    (lambda h: h["w"].update(shape=[True, 16]), "malformed shape"),
    (lambda h: h["w"].update(shape=[-1, 4]), "malformed shape"),
    (lambda h: h["w"].update(data_offsets=[8, 72]), "overlap"),
    (lambda h: h.update(__metadata__=[1]), "__metadata__"),
    (lambda h: h.update(x=5), "is not an object"),
])
def test_header_that_lies(tmp_path: Path, edit: object, message: str) -> None:
    path = tmp_path / "lies.safetensors"
    save_file({"w": torch.ones(4, 4), "b": torch.ones(4)}, path)
    _rewrite_header(path, edit)
    with pytest.raises(tg.CorruptCheckpointError, match=message) as info:
        tg.load(path)
    assert str(path) in str(info.value)


def test_header_length_beyond_file(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 5000) + b'{"w": {}}')
    with pytest.raises(tg.CorruptCheckpointError, match="truncated"):
        tg.open(path)


def test_dtype_not_read_yet(tmp_path: Path) -> None:
    path = tmp_path / "new.safetensors"
    save_file({"w": torch.ones(4)}, path)
    _rewrite_header(path, lambda h: h["w"].update(dtype="F4_E2M1"))
    with pytest.raises(tg.UnsupportedCheckpointError, match="F4_E2M1"):
        tg.open(path)
