"""Tensors copied file to file in the kernel when converting, and the fallbacks."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import torchgraft as tg
from torchgraft.io.copy import FileCopier


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"a": torch.randn(64, 64), "b": torch.randn(3).bfloat16(),
            "t": torch.randn(8, 4).t(), "c": torch.arange(10)}


def test_convert_copies_stored_tensors_in_the_kernel(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    torch.save(_state(), tmp_path / "in.pt")
    calls: list[int] = []
    real = os.copy_file_range

    def counting(*args: Any) -> int:
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", counting)
    tg.convert(tmp_path / "in.pt", tmp_path / "out.safetensors")
    out = load_file(tmp_path / "out.safetensors")
    assert all(torch.equal(out[k], v) for k, v in _state().items())
    assert len(calls) == 3  # the transposed view is read and written instead


@pytest.mark.parametrize("code", [errno.EXDEV, errno.ENOSYS, errno.EINVAL])
def test_without_kernel_copy_the_bytes_are_written(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   code: int) -> None:
    torch.save(_state(), tmp_path / "in.pt")

    def unsupported(*args: Any) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    tg.convert(tmp_path / "in.pt", tmp_path / "out.safetensors")
    out = load_file(tmp_path / "out.safetensors")
    assert all(torch.equal(out[k], v) for k, v in _state().items())


def test_a_source_that_shrank_is_an_error(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 100)
    with (tmp_path / "dst.bin").open("wb", buffering=0) as f, FileCopier(f.fileno()) as copier:
        assert copier.copy(str(source), 0, 60, what="'w'")
        with pytest.raises(tg.CorruptCheckpointError, match="shrank"):
            copier.copy(str(source), 60, 80, what="'w'")
    assert (tmp_path / "dst.bin").read_bytes() == b"x" * 60
