"""Hostile and broken inputs: bounded time, clean errors, nothing read outside the checkpoint."""

from __future__ import annotations

import json
import os
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.meta import TensorRef


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_self_sharing_lists_inspect_in_linear_time(tmp_path: Path) -> None:
    x: list[object] = []
    for _ in range(60):
        x = [x, x]  # 2**60 paths if shared references were expanded
    path = tmp_path / "bomb.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "bomb": x}, path)
    info = tg.inspect(path)
    assert "<shared>" in json.dumps(info.to_dict())


def test_deeply_nested_extras_are_cut(tmp_path: Path) -> None:
    from torchgraft.bounds import MAX_NESTING
    from torchgraft.containers import MAX_PLAIN_DEPTH

    assert MAX_PLAIN_DEPTH < MAX_NESTING - 10
    nested: dict[str, object] = {}
    for _ in range(MAX_NESTING - 10):
        nested = {"n": nested}
    path = tmp_path / "deep.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "deep": nested}, path)
    with tg.open(path) as ckpt:
        assert "<nested too deeply>" in json.dumps(ckpt.extras)
        assert torch.equal(ckpt.get("w"), torch.ones(1))
    for _ in range(700 - MAX_NESTING + 10):  # deeper than any checkpoint nests
        nested = {"n": nested}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # torch.save's pickler recurses per level
    try:
        torch.save({"state_dict": {"w": torch.ones(1)}, "deep": nested}, path)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(tg.CorruptCheckpointError, match=f"nest deeper than {MAX_NESTING}"):
        tg.open(path)


def test_too_deep_for_any_checkpoint_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "deeper.pkl"
    path.write_bytes(b"\x80\x02" + b"]" * 20000 + b"e" * 19999 + b".")  # lists 20,000 deep
    with pytest.raises(tg.TorchgraftError):
        tg.inspect(path)


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    with pytest.raises(tg.UnsupportedCheckpointError, match="not a regular file"):
        tg.open(fifo)


def _sharded(folder: Path, shard_name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": shard_name}}))
    return index


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_shards_outside_the_folder_are_refused(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside.safetensors"
    save_file({"w": torch.ones(2)}, outside)
    folder = tmp_path / "ckpt"
    name = {"dotdot": "../outside.safetensors", "absolute": str(outside),
            "symlink": "link.safetensors"}[kind]
    index = _sharded(folder, name)
    if kind == "symlink":
        (folder / "link.safetensors").symlink_to(outside)
    with pytest.raises(tg.OutsideCheckpointError, match="outside the checkpoint's folder"):
        tg.open(index)


def test_a_shard_inside_the_folder_still_loads(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    index = _sharded(folder, "sub/part.safetensors")
    (folder / "sub").mkdir()
    save_file({"w": torch.ones(2)}, folder / "sub" / "part.safetensors")
    assert torch.equal(tg.load(index)["w"], torch.ones(2))


@pytest.mark.timeout(30)
def test_an_index_linked_to_an_endless_file_is_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors.index.json").symlink_to("/dev/zero")
    with pytest.raises(tg.TorchgraftError):
        tg.open(folder)
    with pytest.raises(tg.TorchgraftError):
        tg.open(folder / "model.safetensors.index.json")


def test_deeply_nested_index_is_a_clean_error(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tg.CorruptCheckpointError):
        tg.open(index)


def test_a_view_outside_its_storage_is_refused_on_open(tmp_path: Path) -> None:
    from torchgraft.io.source import check_view

    with pytest.raises(tg.CorruptCheckpointError, match="reaches element"):
        check_view((200000, 200000), (200000, 1), 0, 4, what="w", source="x.pt")


def test_failures_while_reading_name_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(2)}, path)
    with tg.open(path) as ckpt:
        stored = ckpt._weights["w"]  # a reader failing in a decoder's own way
        ckpt._weights["w"] = TensorRef(stored.meta,
                                       lambda: (_ for _ in ()).throw(ValueError("bad stream")))
        ref = ckpt.tensor_refs()["w"]
        with pytest.raises(tg.CorruptCheckpointError) as info:
            ref.read()
    assert "while reading 'w'" in str(info.value) and str(path) in str(info.value)


def test_pickle_memo_bomb_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "memo.pkl"
    path.write_bytes(b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b".")
    with pytest.raises(tg.TorchgraftError):
        tg.load(path)


def test_memo_indices_of_real_pickles_pass(tmp_path: Path) -> None:
    shared = [1.5, 2.5]
    for protocol in range(6):
        path = tmp_path / f"plain{protocol}.pkl"
        with path.open("wb") as f:
            pickle.dump({"a": shared, "b": shared, "w": torch.ones(2).numpy()}, f,
                        protocol=protocol)
        with tg.open(path) as ckpt:
            assert ckpt.extras["a"] == ckpt.extras["b"] == [1.5, 2.5]


def _bomb_zip(path: Path, member: str, payload_bytes: int, *, extra: dict[str, bytes],
              prefix: bytes = b"") -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in extra.items():
            archive.writestr(name, data)
        with archive.open(member, "w", force_zip64=True) as f:
            f.write(prefix)
            block = b"\0" * (1 << 20)
            for _ in range(payload_bytes >> 20):
                f.write(block)


@pytest.mark.timeout(60)
def test_zip_bomb_in_data_pkl_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt"
    _bomb_zip(path, "archive/data.pkl", 300 << 20, extra={"archive/version": b"3\n"})
    assert path.stat().st_size < 2 << 20
    with pytest.raises(tg.CorruptCheckpointError, match="data.pkl"):
        tg.inspect(path)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_zip_bomb_in_an_npz_member_is_refused_before_decompressing(tmp_path: Path) -> None:
    import io
    import resource

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (4,)})
    path = tmp_path / "bomb.npz"
    _bomb_zip(path, "small.npy", 300 << 20, extra={}, prefix=header.getvalue())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(tg.CorruptCheckpointError, match="need 16"):
        tg.load(path)
    grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grew_kib < 100 * 1024  # far below the 300 MiB the member expands to


def test_empty_tensors_load_from_npz_and_dcp(tmp_path: Path) -> None:
    import warnings

    from torch.distributed.checkpoint import save

    np.savez(tmp_path / "e.npz", a=np.zeros(0, np.float32), b=np.ones(2, np.float32))
    assert tg.load(tmp_path / "e.npz")["a"].shape == (0,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save({"a": torch.zeros(0), "b": torch.ones(2)}, checkpoint_id=str(tmp_path / "dcp"))
    loaded = tg.load(tmp_path / "dcp")
    assert loaded["a"].shape == (0,) and torch.equal(loaded["b"], torch.ones(2))


def test_dcp_chunks_must_cover_their_tensor() -> None:
    from torchgraft.io.dcp import _check_cover

    _check_cover("w", (4, 4), [((0, 0), (2, 4)), ((2, 0), (2, 4))], Path("x"))
    with pytest.raises(tg.CorruptCheckpointError, match="cover 4 of its 4096 elements"):
        _check_cover("w", (64, 64), [((0, 0), (2, 2))], Path("x"))
    with pytest.raises(tg.CorruptCheckpointError, match="overlap"):
        _check_cover("w", (4,), [((0,), (3,)), ((2,), (1,))], Path("x"))
    with pytest.raises(tg.CorruptCheckpointError, match="outside"):
        _check_cover("w", (4,), [((3,), (2,))], Path("x"))


def test_a_file_that_shrinks_while_open_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(1024)}, path)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(1024))
    with tg.open(path) as ckpt:
        size = path.stat().st_size
        with path.open("r+b") as f:
            f.truncate(size - 2048)
        with pytest.raises(tg.CorruptCheckpointError, match="shrank"):
            tg.graft(ckpt, model)
