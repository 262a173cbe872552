"""Ctrl-C during a copy: the command ends at once (exit 130), nothing half-written is left.

A real subprocess gets a real SIGINT in the middle of a copy made slow as a slow disk is slow
(1 MiB per system call, 0.1 s each): convert's kernel copies run in threads that the main thread
waits for, graft's save writes from the main thread. Each has a twin that runs to the end.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.cli.slow_copy import HOLD, MODEL, release, start

pytestmark = pytest.mark.slow

def _interrupt_mid_copy(process: subprocess.Popen[str], marker: Path) -> tuple[int, int, str]:
    """SIGINT while the copy is held mid-way, then let it go on; the slowed calls made before
    and after the signal, stderr.

    Counted, not timed: the marker file gains a byte per slowed call (1 MiB each).
    """
    deadline = time.monotonic() + 120  # a wait for the copy to start, not a measure
    while not marker.exists() or marker.stat().st_size < HOLD:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the copy never started"
        time.sleep(0.05)
    sent = marker.stat().st_size
    process.send_signal(signal.SIGINT)
    release(marker)
    _out, err = process.communicate(timeout=60)
    return sent, marker.stat().st_size - sent, err


def _stopped_early(copied: int, after: int, total: int) -> bool:
    """Whether Ctrl-C stopped the copy with at least a quarter of what was left never copied.

    ``total`` is the slowed calls the whole copy makes: a copy that ran on to its end (or
    nearly) made them all.
    """
    return after < (total - copied) * 3 // 4


def _folder(path: Path) -> dict[str, bytes]:
    """Every entry of a folder, hidden ones included, with its bytes."""
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} | {
        p.name + "/": b"" for p in path.iterdir() if p.is_dir()}


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """128 MiB in 4 tensors: about 6 s of slowed copying in convert's two threads."""
    work = tmp_path / "work"
    work.mkdir()
    save_file({f"w{i}": torch.full((1024, 8192), float(i)) for i in range(4)},
              work / "big.safetensors")
    (work / "old.safetensors").write_bytes(b"the old checkpoint")
    return work


def test_ctrl_c_stops_a_convert_in_kernel_copies_and_keeps_the_old_file(
        tmp_path: Path, big: Path) -> None:
    before = _folder(big)
    process, marker = start(tmp_path, "copy", "convert", str(big / "big.safetensors"),
                             str(big / "old.safetensors"), "--overwrite", held=True)
    copied, after, err = _interrupt_mid_copy(process, marker)
    assert process.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert _stopped_early(copied, after, total=128), (copied, after)  # 128 MiB in 1 MiB calls
    assert _folder(big) == before  # no temporary left, the old checkpoint whole


def test_a_convert_with_the_same_slow_copies_runs_to_the_end(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    state = {"w": torch.arange(4 << 20, dtype=torch.float32).reshape(1024, -1)}
    save_file(state, work / "small.safetensors")
    process, marker = start(tmp_path, "copy", "convert", str(work / "small.safetensors"),
                             str(work / "out.safetensors"))
    _out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert marker.exists()  # the slowed copy ran
    assert torch.equal(load_file(work / "out.safetensors")["w"], state["w"])
    assert sorted(p.name for p in work.iterdir()) == ["out.safetensors", "small.safetensors"]


def test_ctrl_c_stops_a_graft_while_it_saves(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "models.py").write_text(MODEL)
    torch.manual_seed(0)
    save_file(torch.nn.Linear(2048, 4096).state_dict(), work / "ckpt.safetensors")
    before = _folder(work)
    process, marker = start(tmp_path, "write", "graft", str(work / "ckpt.safetensors"),
                             "--model", f"{tmp_path / 'models.py'}:net", "--out",
                             str(work / "out.safetensors"), held=True)
    copied, after, err = _interrupt_mid_copy(process, marker)
    assert process.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert _stopped_early(copied, after, total=33), (copied, after)  # 32 MiB and a bias
    assert _folder(work) == before


def test_a_graft_with_the_same_slow_writes_saves_its_file(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "models.py").write_text(MODEL.replace("2048, 4096", "512, 1024"))
    torch.manual_seed(0)
    state = torch.nn.Linear(512, 1024).state_dict()
    save_file(state, work / "ckpt.safetensors")
    process, marker = start(tmp_path, "write", "graft", str(work / "ckpt.safetensors"),
                             "--model", f"{tmp_path / 'models.py'}:net", "--out",
                             str(work / "out.safetensors"))
    _out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert marker.exists()
    assert torch.equal(load_file(work / "out.safetensors")["weight"], state["weight"])


@pytest.mark.parametrize("pressed", [True, False])
def test_an_error_after_ctrl_c_is_the_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               pressed: bool) -> None:
    """torch.distributed.checkpoint turns an interrupt into its own failure: still exit 130.

    Twin: the same failure without Ctrl-C is the error it is (exit 2).
    """
    import importlib

    from torchgraft.cli import interrupt
    from torchgraft.cli.main import main
    from torchgraft.errors import CheckpointWriteError

    def failing(*args: object, **kwargs: object) -> None:
        if pressed:
            interrupt.interrupted.set()
        raise CheckpointWriteError("cannot write it: a rank failed", path=tmp_path / "ckpt")

    monkeypatch.setattr(importlib.import_module("torchgraft.convert"), "convert", failing)
    save_file({"w": torch.ones(2)}, tmp_path / "w.safetensors")
    code = main(["convert", str(tmp_path / "w.safetensors"), str(tmp_path / "ckpt"),
                 "--format", "dcp"])
    err = capsys.readouterr().err
    if pressed:
        assert code == 130 and "interrupted" in err and "cannot write" not in err
    else:
        assert code == 2 and "cannot write it: a rank failed" in err
