"""Files that are no checkpoint are named for what they are, with the fix.

A clone without its LFS files, a saved web page, a text file or an empty file under a
checkpoint's name, and a folder of unrelated files: each error says what the file is.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg


def _lfs_pointer(real: Path, pointer: Path) -> None:
    """What git writes for a file tracked by LFS when the LFS objects were not fetched."""
    if shutil.which("git-lfs"):
        text = subprocess.run(["git", "lfs", "pointer", f"--file={real}"], capture_output=True,
                              text=True, check=True).stdout
    else:  # the pointer format of https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md
        data = real.read_bytes()
        text = (f"version https://git-lfs.github.com/spec/v1\n"
                f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n")
    pointer.write_text(text)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    real = tmp_path / "real.safetensors"
    save_file({"w": torch.ones(4)}, real)
    made = {name: tmp_path / name for name in (
        "lfs.safetensors", "page.pt", "notes.pt", "empty.pth", "lfs.bin")}
    _lfs_pointer(real, made["lfs.safetensors"])
    _lfs_pointer(real, made["lfs.bin"])
    made["page.pt"].write_text("<!DOCTYPE html>\n<html><head><title>Sign in</title></head>"
                               "<body>Please log in</body></html>\n")
    made["notes.pt"].write_text("epoch 12: accuracy 0.91\nsee wandb for the weights\n")
    made["empty.pth"].write_bytes(b"")
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    for name in ("README.md", "config.json", "train.py"):
        (unrelated / name).write_text("x")
    made["unrelated"] = unrelated
    return made


EXPECTED = {
    "lfs.safetensors": (tg.UnknownFormatError, "Git LFS pointer.*git lfs pull"),
    "lfs.bin": (tg.UnknownFormatError, "Git LFS pointer.*git lfs pull"),
    "page.pt": (tg.UnknownFormatError, "an HTML page.*'resolve' link"),
    "notes.pt": (tg.UnknownFormatError, "a text file.*a log or a config"),
    "empty.pth": (tg.CorruptCheckpointError, r"empty \(0 bytes\)"),
    "unrelated": (tg.CheckpointNotFoundError,
                  r"its files \(README.md, config.json, train.py\) are not checkpoints"),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_error_names_what_the_file_is(files: dict[str, Path], name: str) -> None:
    error, message = EXPECTED[name]
    for call in (tg.open, tg.inspect, tg.load):
        with pytest.raises(error, match=message) as caught:
            call(files[name])
        assert str(files[name]) in str(caught.value)
        assert "BadZipFile" not in str(caught.value) and "header length" not in str(caught.value)


@pytest.mark.slow
def test_the_cli_says_it_in_one_line(files: dict[str, Path]) -> None:
    for name in ("lfs.safetensors",):
        result = subprocess.run([sys.executable, "-m", "torchgraft", "inspect", str(files[name])],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1
        assert "git lfs pull" in result.stderr


def test_real_checkpoints_and_text_indexes_are_not_mistaken(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {"w": "model.safetensors"}}')
    assert torch.equal(tg.load(tmp_path / "model.safetensors.index.json")["w"], torch.ones(2))
    binary = tmp_path / "garbage.pt"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(tg.TorchgraftError) as caught:
        tg.open(binary)
    assert "a text file" not in str(caught.value) and "HTML" not in str(caught.value)


@pytest.mark.parametrize("name", ["random.bin", "random.pt", "random.safetensors"])
def test_random_bytes_are_no_checkpoint_format_not_a_truncated_one(tmp_path: Path,
                                                                   name: str) -> None:
    path = tmp_path / name
    path.write_bytes(random.Random(name).randbytes(4096).replace(b"\x80", b"\x81"))
    with pytest.raises(tg.UnknownFormatError, match="not a checkpoint format torchgraft knows"):
        tg.open(path)
    # the control: a real checkpoint cut short is truncated, as its first bytes say
    torch.save({"w": torch.ones(1000)}, tmp_path / "real.pt")
    cut = tmp_path / "cut.pt"
    cut.write_bytes((tmp_path / "real.pt").read_bytes()[:2000])
    with pytest.raises(tg.CorruptCheckpointError) as caught:
        tg.load(cut)
    assert not isinstance(caught.value, tg.UnknownFormatError)
    assert "not a checkpoint format" not in str(caught.value)
