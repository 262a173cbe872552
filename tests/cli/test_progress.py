"""Progress: bytes written, with rate and time left, moving with the copy (not jumping to 100%).

The library reports bytes through ``progress_bytes``; only the command line draws them, on a
terminal, for steps that last over a second.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests.cli.slow_copy import start
from torchgraft.written import on_disk

MIB = 1 << 20


def _slowed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A slow disk: 1 MiB per call of ``os.<name>``, 0.05 s each."""
    real = getattr(os, name)

    def call(*args: object) -> object:
        time.sleep(0.05)
        if name == "copy_file_range":
            return real(args[0], args[1], min(int(args[2]), MIB), *args[3:])  # type: ignore[call-overload]
        return real(args[0], memoryview(args[1]).cast("B")[:MIB], *args[2:])  # type: ignore[call-overload,arg-type]

    monkeypatch.setattr(os, name, call)


def _reports(calls: list[tuple[int, int]], total: int) -> None:
    """Bytes rise through the copy, never past the total, and end at it."""
    assert calls[-1] == (total, total)
    done = [d for d, t in calls]
    assert done == sorted(done) and all(t == total for _d, t in calls)
    assert len({d for d in done if 0 < d < total}) >= 2, calls  # not a jump to 100%


@pytest.mark.slow
def test_convert_reports_the_bytes_of_its_kernel_copies_as_they_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_file({f"w{i}": torch.ones(1024, 1024) for i in range(8)}, tmp_path / "m.safetensors")
    _slowed(monkeypatch, "copy_file_range")
    calls: list[tuple[int, int]] = []
    tg.convert(tmp_path / "m.safetensors", tmp_path / "o.safetensors",
               progress_bytes=lambda done, total: calls.append((done, total)))
    _reports(calls, 32 * MIB)


def test_save_reports_the_bytes_it_writes_as_they_go(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(2048, 2048)  # 16 MiB of weights
    _slowed(monkeypatch, "pwrite")
    calls: list[tuple[int, int]] = []
    tg.save(model, tmp_path / "m.safetensors",
            progress_bytes=lambda done, total: calls.append((done, total)))
    _reports(calls, (2048 * 2048 + 2048) * 4)


def test_a_sharded_save_counts_every_shard_once(tmp_path: Path) -> None:
    state = {f"w{i}": torch.ones(256, 1024) for i in range(4)}  # 4 MiB
    calls: list[tuple[int, int]] = []
    written = tg.save(state, tmp_path / "m.safetensors", max_shard_size="1MiB",
                      progress_bytes=lambda done, total: calls.append((done, total)))
    assert len(written) == 5 and calls[-1] == (4 * MIB, 4 * MIB)
    assert [d for d, _t in calls] == sorted(d for d, _t in calls)


def test_bytes_on_disk_are_the_bytes_written_not_the_size_claimed(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB long, nothing written
    written = tmp_path / "written"
    written.write_bytes(b"x" * (3 * MIB))
    assert on_disk(sparse) < MIB
    assert on_disk(written) == 3 * MIB
    assert on_disk(tmp_path) >= 3 * MIB  # a folder: every file in it
    assert on_disk(tmp_path / "gone") == 0


@pytest.mark.slow
def test_the_command_line_draws_bytes_rate_and_time_left(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    save_file({f"w{i}": torch.ones(1024, 4096) for i in range(4)}, work / "m.safetensors")
    terminal = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120"}
    process, _marker = start(tmp_path, "copy", "convert", str(work / "m.safetensors"),
                             str(work / "o.safetensors"), env=terminal)
    _out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)  # colours and cursor moves
    shown = re.findall(r"converting m\.safetensors.*?([\d.]+)/64\.0 MiB\s+([\d.]+ [KM]iB)/s"
                       r"\s+(\d:\d\d:\d\d)", err)
    assert len({done for done, _rate, _left in shown if float(done) < 64}) >= 2, err[-2000:]
    save_file({"w": torch.ones(4)}, work / "small.safetensors")
    quick = start(tmp_path, "none", "convert", str(work / "small.safetensors"),
                  str(work / "q.safetensors"), env=terminal)[0]
    _out, err = quick.communicate(timeout=300)  # its twin: done within a second, no bar
    assert quick.returncode == 0 and "MiB/s" not in err
