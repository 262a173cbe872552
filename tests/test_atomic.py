"""Atomic writes: the destination is either the old file or the complete new one."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchgraft as tg
from torchgraft.atomic import atomic_path


def test_success_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with atomic_path(path, overwrite=True) as temporary:
        temporary.write_bytes(b"new")
        assert path.read_bytes() == b"old"
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_failure_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(path, overwrite=True) as temporary:
        temporary.write_bytes(b"partial")
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(tg.TorchgraftError, match="already exists"), atomic_path(path):
        pass
