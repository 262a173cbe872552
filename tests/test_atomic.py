"""Atomic writes: the destination is either the old file or the complete new one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    with pytest.raises(tg.CheckpointWriteError, match="disk full"), \
            atomic_path(path, overwrite=True) as temporary:
        temporary.write_bytes(b"partial")
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(tg.TorchgraftError, match="already exists"), atomic_path(path):
        pass


def test_two_exclusive_writers_one_wins(tmp_path: Path) -> None:
    from torchgraft.atomic import atomic_path

    target = tmp_path / "model.pt"
    with pytest.raises(tg.TorchgraftError, match="written meanwhile"), \
            atomic_path(target) as first, atomic_path(target) as second:
        first.write_bytes(b"first")
        second.write_bytes(b"second")
    assert target.read_bytes() == b"second"  # the inner one committed first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_a_full_disk_is_a_clean_error_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    tg.save({"w": torch.zeros(4)}, target)
    before = target.read_bytes()
    code = (
        "import resource, signal, torch, torchgraft as tg\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))\n"
        "try:\n"
        f"    tg.save({{'w': torch.ones(1_000_000)}}, {str(target)!r}, overwrite=True)\n"
        "except tg.CheckpointWriteError as exc:\n"
        "    print('CLEAN', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.startswith("CLEAN") and str(target) in out.stdout, out.stdout + out.stderr
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_leftovers_of_killed_writes_are_cleaned_by_the_next_write(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # above any pid this machine hands out
    stale = tmp_path / f".model.pt.tg-{dead}-abc.tmp"
    stale.write_bytes(b"partial")
    mine = tmp_path / f".model.pt.tg-{os.getpid()}-def.tmp"
    mine.write_bytes(b"in progress")
    tg.save({"w": torch.ones(1)}, tmp_path / "model.pt")
    assert not stale.exists() and mine.exists()


def test_a_dcp_overwrite_killed_between_its_moves_is_restored(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    tg.save({"w": torch.ones(2)}, target)
    dead = 2**22 + 12345
    work = tmp_path / f".ckpt.tg-{dead}-xyz"
    work.mkdir()
    os.replace(target, work / "old")  # the kill came right after this move
    assert not target.exists()
    with pytest.raises(tg.TorchgraftError, match="already exists"):
        tg.save({"w": torch.zeros(2)}, target)  # the next write restores the old one first
    assert torch.equal(tg.load(target)["w"], torch.ones(2)) and not work.exists()
