"""Atomic writes: the destination is either the old file or the complete new one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


@pytest.mark.slow
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


_WRITER = """
import sys, torch, torchgraft as tg
value, target, kind = float(sys.argv[1]), sys.argv[2], sys.argv[3]
state = {f"layer{i}.weight": torch.full((256, 256), value) for i in range(24)}
sharded = {"max_shard_size": 300_000} if kind == "sharded" else {}
print("ready", flush=True)
tg.save(state, target, overwrite=True, **sharded)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["single", "sharded", "dcp"])
def test_kill_9_at_any_moment_leaves_old_or_new_never_a_mix(tmp_path: Path, kind: str) -> None:
    """Real kills (SIGKILL) of overwrites at spread-out moments: what loads is whole."""
    import random
    import signal
    import time

    name = {"single": "model.safetensors", "sharded": "model.safetensors", "dcp": "ckpt"}[kind]
    target = tmp_path / "out" / name
    opened = target.parent if kind == "sharded" else target
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    subprocess.run([sys.executable, str(script), "1", str(target), kind], check=True,
                   capture_output=True)
    rng = random.Random(7)
    for attempt in range(6):
        value = float(attempt + 2)
        writer = subprocess.Popen([sys.executable, str(script), str(value), str(target), kind],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.25))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        loaded = tg.load(opened)
        assert len(loaded) == 24
        values = {float(t.flatten()[0]) for t in loaded.values()}
        assert len(values) == 1, f"a mix of writes: {sorted(values)}"
        assert all(torch.all(t == t.flatten()[0]) for t in loaded.values())
    subprocess.run([sys.executable, str(script), "99", str(target), kind], check=True,
                   capture_output=True)  # the next write cleans what the killed ones left
    assert not [p for p in target.parent.iterdir() if ".tg-" in p.name]
    assert {float(t.flatten()[0]) for t in tg.load(opened).values()} == {99.0}


_FULL_DISK = """
import os, subprocess, sys, torch, torchgraft as tg
folder, big = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", folder], check=True)
target = os.path.join(folder, "model.safetensors")
tg.save({"w": torch.zeros(4)}, target)
before = open(target, "rb").read()
results = []
for attempt in ("save", "convert"):
    try:
        if attempt == "save":
            tg.save({"w": torch.ones(1_000_000)}, target, overwrite=True)
        else:
            tg.convert(big, target, overwrite=True)  # copied in the kernel: ENOSPC there
        results.append(attempt + " WROTE")
    except tg.CheckpointWriteError as exc:
        results.append(attempt + " CLEAN " + ("named" if target in str(exc) else str(exc)))
assert open(target, "rb").read() == before, "the old file changed"
subprocess.run(["mount", "-o", "remount,ro", folder], check=True)  # a read-only folder
try:
    tg.save({"w": torch.ones(2)}, target, overwrite=True)
    results.append("read-only WROTE")
except tg.CheckpointWriteError as exc:
    results.append("read-only CLEAN " + ("named" if target in str(exc) else str(exc)))
assert open(target, "rb").read() == before, "the old file changed"
print(results, sorted(os.listdir(folder)))
"""


@pytest.mark.slow
def test_a_real_full_disk_and_a_read_only_folder_keep_the_old_file(tmp_path: Path) -> None:
    """A 256 KiB tmpfs, then remounted read-only (in a private user and mount namespace)."""
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare here to mount a small tmpfs")
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "mount", "-t",
                            "tmpfs", "-o", "size=256k", "tmpfs", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()[-200:]}")
    big = tmp_path / "big.pt"
    torch.save({"w": torch.ones(1_000_000)}, big)
    folder = tmp_path / "tiny"
    folder.mkdir()
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK)
    out = subprocess.run([unshare, "--user", "--map-root-user", "--mount", sys.executable,
                          str(script), str(folder), str(big)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("['save CLEAN named', 'convert CLEAN named', 'read-only CLEAN named'] "
            "['model.safetensors']") in out.stdout


def _dcp_failure(inner: BaseException) -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("save failed", {0: (inner, traceback_summary())})


def traceback_summary() -> object:
    import traceback

    return traceback.StackSummary.from_list([])


@pytest.mark.parametrize("inner", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_a_dcp_failure_is_the_interrupt_or_a_write_error_naming_its_cause(
        tmp_path: Path, inner: BaseException) -> None:
    """torch gathers each rank's failure as (exception, frames): Ctrl-C stays Ctrl-C."""
    from torchgraft.atomic import atomic_dir

    expected = KeyboardInterrupt if isinstance(inner, KeyboardInterrupt) else \
        tg.CheckpointWriteError
    with pytest.raises(expected) as raised, atomic_dir(tmp_path / "ckpt"):
        raise _dcp_failure(inner)
    if expected is tg.CheckpointWriteError:
        assert str(raised.value).endswith("cannot write it: No space left on device; an "
                                          "existing checkpoint there is left as it was")
    assert list(tmp_path.iterdir()) == []


def test_abandon_removes_the_writes_under_way_and_not_the_finished_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Ctrl-C's watchdog calls before it ends the process: no temporary is left."""
    import torchgraft.atomic as atomic

    monkeypatch.setattr(atomic, "_anonymous", lambda folder: None)  # named temporaries
    monkeypatch.setattr(atomic, "_COMMITTING", type(atomic._COMMITTING)())  # a lock of its own
    (tmp_path / "done.bin").write_bytes(b"old")
    with atomic_path(tmp_path / "done.bin", overwrite=True) as finished:
        finished.write_bytes(b"new")
    with atomic_path(tmp_path / "file.bin", unnamed=True) as file, \
            atomic.atomic_dir(tmp_path / "folder") as folder:
        file.write_bytes(b"half")
        folder.mkdir()
        (folder / "part").write_bytes(b"half")
        assert len(list(tmp_path.iterdir())) == 3  # two temporaries beside done.bin
        atomic.abandon(timeout=1)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["done.bin"]
        file.write_bytes(b"")  # so that the block itself can end
        folder.mkdir(parents=True)
    assert (tmp_path / "done.bin").read_bytes() == b"new"


def test_an_interrupt_between_a_folder_swaps_two_moves_puts_the_old_folder_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the system cannot swap two folders in one step, the old one is moved out first."""
    import torchgraft.atomic as atomic

    target = tmp_path / "ckpt"
    tg.save({"w": torch.ones(2)}, target)
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    moves = []
    replace = os.replace

    def interrupted_second_move(a: Path, b: Path) -> None:
        moves.append((a, b))
        if len(moves) == 2:
            raise KeyboardInterrupt
        replace(a, b)

    monkeypatch.setattr(atomic.os, "replace", interrupted_second_move)
    with pytest.raises(KeyboardInterrupt):
        tg.save({"w": torch.zeros(2)}, target, overwrite=True)
    monkeypatch.setattr(atomic.os, "replace", replace)
    assert torch.equal(tg.load(target)["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


# --- kills at each step, and the next write into the folder ------------------------------

#: Each step a write can be killed at: (kind of write, what the child patches to die there).
KILL_STEPS = {
    "single file, written, before its last move": "single",
    "single file (named temporary), while writing": "single",
    "single file (named temporary), before its move": "single",
    "folder, written, before the swap": "folder",
    "folder, between the swap's two moves": "folder",
    "folder, swapped, before its work folder goes": "folder",
    "sharded, after its first shard": "sharded",
    "sharded, every shard written, before the index": "sharded",
}
_TARGETS = {"single": "model.safetensors", "folder": "ckpt", "sharded": "model.safetensors"}


def _killed_state(value: float) -> dict[str, torch.Tensor]:
    return {f"layer{i}.weight": torch.full((8, 8), value) for i in range(4)}


def _die(*_args: object, **_kwargs: object) -> None:
    os._exit(9)  # as SIGKILL: no finally, no cleanup, no atexit


def _killed_at(step: str, target: str) -> None:
    """In a child: overwrite ``target`` with 2.0, killed at ``step`` (exit status 9)."""
    import importlib

    import torchgraft.atomic as atomic

    save = importlib.import_module("torchgraft.save")  # tg.save is the function
    if "named temporary" in step:
        atomic._anonymous = lambda folder: None  # type: ignore[assignment]
    if step == "single file, written, before its last move":
        atomic.os.replace = _die  # type: ignore[assignment]  # the unnamed file's named copy
    elif step == "single file (named temporary), while writing":
        atomic.os.fsync = _die  # type: ignore[assignment]
    elif step == "single file (named temporary), before its move":
        atomic._commit = _die  # type: ignore[assignment]
    elif step == "folder, written, before the swap":
        atomic._swap_in = _die  # type: ignore[assignment]
    elif step == "folder, between the swap's two moves":
        atomic._exchange = lambda a, b: False  # type: ignore[assignment]
        moves, replace = [], os.replace

        def second_move_dies(a: object, b: object) -> None:
            moves.append(a)
            if len(moves) == 2:
                _die()
            replace(a, b)  # type: ignore[arg-type]
        atomic.os.replace = second_move_dies  # type: ignore[assignment]
    elif step == "folder, swapped, before its work folder goes":
        atomic._settle = _die  # type: ignore[assignment]
    elif step == "sharded, after its first shard":
        shards, watched = [], save._watched

        def second_shard_dies(*args: object) -> object:
            shards.append(args)
            if len(shards) == 2:  # the first is whole, under its tagged name
                _die()
            return watched(*args)  # type: ignore[arg-type]
        save._watched = second_shard_dies  # type: ignore[assignment]
    elif step == "sharded, every shard written, before the index":
        parts = save._write_parts

        def then_die(*args: object) -> None:
            parts(*args)  # type: ignore[arg-type]
            _die()
        save._write_parts = then_die  # type: ignore[assignment]
    sharded = {"max_shard_size": 300} if KILL_STEPS[step] == "sharded" else {}
    tg.save(_killed_state(2.0), target, overwrite=True, **sharded)  # type: ignore[arg-type]


def _leftovers(folder: Path) -> list[str]:
    """What in ``folder`` is a temporary, or a shard its index does not name."""
    from torchgraft.save import _TAGGED, _indexed_shards

    named = _indexed_shards(folder / "model.safetensors.index.json")
    return sorted(p.name for p in folder.iterdir() if ".tg-" in p.name or (
        _TAGGED.fullmatch(p.name) is not None and p.name not in named))


@pytest.fixture(scope="module")
def killer() -> object:
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torchgraft", "torchgraft.save",
                                    "torch.distributed.checkpoint", "tests.test_atomic"])
    return context


@pytest.mark.parametrize("step", list(KILL_STEPS))
def test_a_write_killed_at_each_step_leaves_what_the_next_write_into_the_folder_removes(
        tmp_path: Path, step: str, killer: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The old checkpoint (or the whole new one) loads after the kill; the next write into
    the folder, to another name, removes every temporary the killed one left (its process no
    longer runs), saying so at debug level, and the checkpoint still loads."""
    import logging

    kind = KILL_STEPS[step]
    target = tmp_path / _TARGETS[kind]
    opened = tmp_path if kind == "sharded" else target
    sharded = {"max_shard_size": 300} if kind == "sharded" else {}
    tg.save(_killed_state(1.0), target, **sharded)  # type: ignore[arg-type]
    child = killer.Process(target=_killed_at, args=(step, str(target)))
    child.start()
    child.join()
    assert child.exitcode == 9, "the kill did not land"
    left = _leftovers(tmp_path)
    assert left, "the kill left nothing to remove"
    with caplog.at_level(logging.DEBUG, logger="torchgraft"):
        tg.save({"w": torch.ones(1)}, tmp_path / "other.safetensors")  # another name
    assert not _leftovers(tmp_path), _leftovers(tmp_path)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert all(name in logged for name in left), (left, logged)
    values = {float(t.unique()[0]) for t in tg.load(opened).values()}
    assert len(values) == 1 and values <= {1.0, 2.0}, values  # old, or the whole new one


def _temporary(folder: Path, host: str, pid: int) -> list[Path]:
    """A temporary file and folder, and a tagged shard no index names, of a write of ``pid``
    on ``host``."""
    files = [folder / f".model.safetensors.tg-{host}-{pid}-abc.tmp",
             folder / f"model-{host}{pid:08x}abcd-00001-of-00002.safetensors"]
    for file in files:
        file.write_bytes(b"partial")
    (folder / f".ckpt.tg-{host}-{pid}-xyz").mkdir()
    return [*files, folder / f".ckpt.tg-{host}-{pid}-xyz"]


def test_a_write_still_running_or_of_another_host_is_never_cleaned(tmp_path: Path) -> None:
    from torchgraft.atomic import HOST

    dead = 2**22 + 12345  # above any pid this machine hands out
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = [*_temporary(tmp_path, HOST, os.getpid()),  # this process's own writes
                *_temporary(tmp_path, HOST, sleeper.pid),  # another process, still running
                *_temporary(tmp_path, "0badc0de" if HOST != "0badc0de" else "0badc0df",
                            dead)]  # another host's (a shared filesystem): its pids not ours
        gone = _temporary(tmp_path, HOST, dead)  # the control: this host's, process gone
        tg.save({"w": torch.ones(1)}, tmp_path / "w.safetensors")
        assert all(os.path.lexists(p) for p in kept), [p for p in kept if not p.exists()]
        assert not any(os.path.lexists(p) for p in gone), [p for p in gone if p.exists()]
    finally:
        sleeper.kill()
        sleeper.wait()
