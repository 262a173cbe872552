"""Format detection: magic bytes before suffixes; directories holding one checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.io import detect


def test_magic_bytes_win_over_a_misleading_suffix(tmp_path: Path) -> None:
    cases = {
        "safetensors.pt": lambda p: save_file({"w": torch.ones(2)}, p),
        "zip.safetensors": lambda p: torch.save({"w": torch.ones(2)}, p),
        "legacy.npz": lambda p: torch.save({"w": torch.ones(2)}, p,
                                           _use_new_zipfile_serialization=False),
        "arrays.bin": lambda p: np.savez(p, w=np.ones(2, np.float32)),
    }
    expected = {"safetensors.pt": "safetensors", "zip.safetensors": "torch-zip",
                "legacy.npz": "torch-legacy", "arrays.bin": "numpy"}
    for name, write in cases.items():
        path = tmp_path / name
        write(path)
        if name == "arrays.bin":
            path = path.with_name("arrays.bin.npz").rename(path)
        assert detect(path)[0].name == expected[name], name
        assert torch.equal(tg.load(path)["w"], torch.ones(2))


def test_transformers_style_folder_prefers_safetensors(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, tmp_path / "model.safetensors")
    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    assert torch.equal(tg.load(tmp_path)["w"], torch.ones(2))


def test_folder_with_one_checkpoint(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "best.ckpt")
    (tmp_path / "notes.txt").write_text("hello")
    with tg.open(tmp_path) as ckpt:
        assert ckpt.path == tmp_path / "best.ckpt"


def test_folder_with_several_or_no_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(tg.CheckpointNotFoundError, match="holds no checkpoint"):
        tg.open(tmp_path)
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "b.pt")
    with pytest.raises(tg.CheckpointNotFoundError, match=r"several checkpoints \(a.pt, b.pt\)"):
        tg.open(tmp_path)


def test_unknown_format_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.dat"
    path.write_bytes(b"NOT A CHECKPOINT" + bytes(100))
    with pytest.raises(tg.UnknownFormatError, match="not a checkpoint format") as info:
        tg.open(path)
    assert str(path) in str(info.value)


def test_zip_that_is_not_a_torch_file(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "archive.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(tg.UnknownFormatError, match="not a torch.save file"):
        tg.open(path)


def test_an_error_never_quotes_another_files_content(tmp_path: Path) -> None:
    """A weight map naming a text file in the folder: the error names it, never its bytes."""
    import json

    (tmp_path / "notes.txt").write_text("SECRET-TOKEN=abc123\n")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "notes.txt"}}))
    with pytest.raises(tg.TorchgraftError) as info:
        tg.load(tmp_path)
    assert "notes.txt" in str(info.value)
    assert "SECRET" not in str(info.value) and "abc123" not in str(info.value)
