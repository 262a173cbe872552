"""Bad input raises our own errors, naming the file, for every format and every cut."""

from __future__ import annotations

import json
import random
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.errors import shown

_STATE = {"w": torch.arange(12, dtype=torch.float32).reshape(4, 3), "b": torch.ones(3).half(),
          "n": torch.tensor(5)}


def _torch_zip(path: Path) -> None:
    torch.save({"epoch": 1, "state_dict": _STATE}, path)


def _torch_legacy(path: Path) -> None:
    torch.save(_STATE, path, _use_new_zipfile_serialization=False)


def _safetensors(path: Path) -> None:
    save_file(_STATE, path)


def _paddle(path: Path) -> None:
    import pickle

    with path.open("wb") as f:
        pickle.dump({k: v.numpy() for k, v in _STATE.items()}, f, protocol=4)


def _npz(path: Path) -> None:
    np.savez(path, **{k: v.numpy() for k, v in _STATE.items()})


def _npy(path: Path) -> None:
    np.save(path, _STATE["w"].numpy())


WRITERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "torch-zip": ("model.pt", _torch_zip),
    "torch-legacy": ("model.pth", _torch_legacy),
    "safetensors": ("model.safetensors", _safetensors),
    "paddle": ("model.pdparams", _paddle),
    "npz": ("model.npz", _npz),
    "npy": ("model.npy", _npy),
}


def _load_fully(path: Path) -> None:
    with tg.open(path) as ckpt:
        for name in ckpt.keys():
            ckpt.get(name)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_truncated_at_every_byte(tmp_path: Path, fmt: str) -> None:
    name, write = WRITERS[fmt]
    good = tmp_path / name
    write(good)
    _load_fully(good)
    data = good.read_bytes()
    cut = tmp_path / f"cut-{name}"
    for size in range(len(data)):
        cut.write_bytes(data[:size])
        with pytest.raises(tg.TorchgraftError) as info:
            _load_fully(cut)
        assert str(cut) in str(info.value), (size, str(info.value))


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_random_corruption_never_escapes(tmp_path: Path, fmt: str) -> None:
    name, write = WRITERS[fmt]
    good = tmp_path / name
    write(good)
    data = bytearray(good.read_bytes())
    rng = random.Random(fmt)
    bad = tmp_path / f"bad-{name}"
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        bad.write_bytes(bytes(mutated))
        try:
            _load_fully(bad)
        except tg.TorchgraftError as exc:
            assert str(bad) in str(exc)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(tg.CorruptCheckpointError, match="empty.pt: the file is empty"):
        tg.open(empty)
    with pytest.raises(tg.CheckpointNotFoundError, match="nope.pt: no such file"):
        tg.load(tmp_path / "nope.pt")


def test_corrupt_zip_record(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(_STATE, path)
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    data = bytearray(path.read_bytes())
    data[info.header_offset:info.header_offset + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    with tg.open(path) as ckpt, pytest.raises(tg.CorruptCheckpointError,
                                              match="corrupt header") as exc:
        ckpt.get("w")
    assert str(path) in str(exc.value)


def test_storage_missing_from_archive(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save(_STATE, good)
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("data/0"):
                dst.writestr(item, src.read(item))
    with tg.open(broken) as ckpt, pytest.raises(tg.CorruptCheckpointError,
                                                match="missing from the archive"):
        for name in ckpt.keys():
            ckpt.get(name)


def test_wrong_format_and_garbage(tmp_path: Path) -> None:
    text = tmp_path / "config.json"
    text.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(tg.UnknownFormatError, match="config.json"):
        tg.open(text)
    garbage = tmp_path / "model.pt"
    garbage.write_bytes(b"\x80\x02" + bytes(range(256)) * 4)
    with pytest.raises(tg.CorruptCheckpointError, match="model.pt"):
        tg.open(garbage)


def _dcp_dir(directory: Path) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": dict(_STATE), "epoch": 2}, checkpoint_id=str(directory))
    return directory


@pytest.mark.slow
def test_dcp_files_truncated_at_every_byte(tmp_path: Path) -> None:
    directory = _dcp_dir(tmp_path / "dcp")
    _load_fully(directory)
    for file in sorted(p for p in directory.iterdir() if p.is_file()):
        data = file.read_bytes()
        for size in range(0, len(data), 3):
            file.write_bytes(data[:size])
            with pytest.raises(tg.TorchgraftError) as info:
                _load_fully(directory)
            assert str(directory) in str(info.value)
        file.write_bytes(data)


def test_sharded_index_truncated_at_every_byte(tmp_path: Path) -> None:
    save_file(_STATE, tmp_path / "shard.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    data = json.dumps({"weight_map": dict.fromkeys(_STATE, "shard.safetensors")}).encode()
    for size in range(len(data)):
        index.write_bytes(data[:size])
        with pytest.raises(tg.TorchgraftError) as info:
            _load_fully(index)
        assert str(index) in str(info.value)


def _shared_lists(depth: int) -> list[object]:
    """Lists nested ``depth`` deep, each holding the one below twice: 2^depth leaves to render."""
    node: list[object] = [1]
    for _ in range(depth):
        node = [node, node]
    return node


@pytest.mark.parametrize(("value", "start"), [
    pytest.param(_shared_lists(60), "[[[[", id="shared lists"),  # an alias bomb: 10^18 leaves
    pytest.param("x" * 10**7, "'xxx", id="long text"),
    pytest.param(10**20000, "<66439-bit integer>", id="huge integer"),
    pytest.param(b"\x00" * 10**7, "b'\\x00", id="long bytes"),
    pytest.param(torch.Size([3, 4]), "(3, 4)", id="torch.Size"),
])
def test_shown_renders_a_bounded_part_of_any_value(value: object, start: str) -> None:
    text = shown(value, 80)
    assert text.startswith(start) and len(text) <= 80


def test_shown_shows_small_values_whole() -> None:  # the control: nothing lost when it fits
    value = {"op": "reshape", "shape": [-1, 4], "from": "a.weight"}
    assert shown(value, 200) == repr(value)
    assert shown("abc") == "'abc'" and shown(None) == "None" and shown(1.5) == "1.5"


def test_no_error_renders_a_value_before_cutting_it() -> None:
    """``{value!r:.80}`` renders all of ``value`` first: messages use :func:`shown`."""
    src = Path(__file__).parent.parent / "src" / "torchgraft"
    found = [f"{p.relative_to(src)}:{n}" for p in src.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"![rsa]:\.\d", line)]
    assert not found
