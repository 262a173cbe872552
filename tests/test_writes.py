"""Writes: exclusive when asked, removing only what they wrote, and whole under kill -9.

Killed writes run in children forked from a fork server that has torch imported (a kill
costs milliseconds, and no thread of the test process is copied); each kill is counted only
if it landed mid-write (the child had begun the save and had not finished it), until 20
have, for single files, shards and DCP folders.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import multiprocessing.context
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.atomic import atomic_dir

KILLS = 20
TENSORS = 16


def _state(value: float) -> dict[str, torch.Tensor]:
    return {f"layer{i}.weight": torch.full((128, 128), value) for i in range(TENSORS)}


def _values(folder_or_file: Path) -> set[float]:
    """The distinct values of a checkpoint written by :func:`_state` (one if it is whole)."""
    loaded = tg.load(folder_or_file)
    assert sorted(loaded) == sorted(_state(0.0)), sorted(loaded)
    return {float(t.unique()[0]) for t in loaded.values() if t.unique().numel() == 1} | {
        float("nan") for t in loaded.values() if t.unique().numel() != 1}


Save = Callable[[float, Callable[[int, int], None]], None]


def _child(save: Save, value: float, conn: Connection) -> None:
    """One save, telling the parent when it starts, after each tensor, and when it is done."""
    conn.send_bytes(b"s")
    save(value, lambda done, total: conn.send_bytes(b"p"))
    conn.send_bytes(b"d")


@pytest.fixture(scope="module")
def server() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed.checkpoint", "torchgraft",
                                    "torchgraft.save", "tests.test_writes"])
    return context


def _killed_save(context: multiprocessing.context.ForkServerContext, save: Save, value: float,
                 *, after: int | None, delay: float) -> bool:
    """Run a child that saves ``value``; SIGKILL it mid-write. True if the kill landed so."""
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(save, value, child))
    process.start()
    child.close()
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.is_alive():
        if parent.poll(0.001):
            try:
                seen.append(parent.recv_bytes())
            except EOFError:
                break
        if seen[:1] == [b"s"]:
            if after is None:
                time.sleep(delay)
                break
            if seen.count(b"p") >= after:
                break
    assert process.pid is not None
    with contextlib.suppress(ProcessLookupError):  # it may have finished
        os.kill(process.pid, signal.SIGKILL)
    process.join()
    while parent.poll():
        try:
            seen.append(parent.recv_bytes())
        except EOFError:
            break
    parent.close()
    return seen[:1] == [b"s"] and seen[-1:] != [b"d"]


def _kill_loop(context: multiprocessing.context.ForkServerContext, save: Save,
               check: Callable[[], set[float]], *, per_tensor: bool, duration: float) -> int:
    """Kill saves until :data:`KILLS` landed mid-write; after each, the checkpoint is whole."""
    rng = random.Random(0)
    committed = 1.0
    save(committed, _quiet)
    landed = attempts = 0
    while landed < KILLS:
        attempts += 1
        assert attempts < 4 * KILLS, f"only {landed} of {attempts} kills landed mid-write"
        value = committed + 1
        after = rng.randint(1, TENSORS - 1) if per_tensor else None
        mid = _killed_save(context, save, value, after=after, delay=rng.uniform(0, duration))
        found = check()
        assert len(found) == 1, f"a mixed checkpoint: {found}"
        (now,) = found
        assert now in (committed, value), (now, committed, value)
        committed = now
        landed += mid
    print(f"{landed} kills landed mid-write in {attempts} attempts; none lost or mixed")
    return attempts


def _leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


SHARD = 3 * 128 * 128 * 4


def _save(path: Path, shard: bool, value: float, progress: Callable[[int, int], None]) -> None:
    tg.save(_state(value), path, overwrite=True, progress=progress,
            max_shard_size=SHARD if shard else None)


def _quiet(done: int, total: int) -> None:
    pass


@pytest.mark.slow
def test_killed_single_file_writes_keep_a_whole_file_and_leave_nothing(
        tmp_path: Path, server: multiprocessing.context.ForkServerContext) -> None:
    path = tmp_path / "m.safetensors"

    def check() -> set[float]:
        assert _leftovers(tmp_path, {path.name}) == []  # an unnamed temporary: nothing left
        return _values(path)

    _kill_loop(server, functools.partial(_save, path, False), check, per_tensor=True,
               duration=0)


@pytest.mark.slow
def test_killed_sharded_writes_keep_a_whole_checkpoint(
        tmp_path: Path, server: multiprocessing.context.ForkServerContext) -> None:
    save = functools.partial(_save, tmp_path / "model.safetensors", True)
    _kill_loop(server, save, lambda: _values(tmp_path), per_tensor=True, duration=0)
    save(99.0, _quiet)  # the next write cleans what the killed ones left
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert _leftovers(tmp_path, {*index["weight_map"].values(),
                                 "model.safetensors.index.json"}) == []
    assert _values(tmp_path) == {99.0}


@pytest.mark.slow
def test_killed_dcp_writes_keep_a_whole_folder(
        tmp_path: Path, server: multiprocessing.context.ForkServerContext) -> None:
    path = tmp_path / "ckpt"
    save = functools.partial(_save, path, False)
    save(0.0, _quiet)
    start = time.monotonic()
    save(0.5, _quiet)
    duration = time.monotonic() - start
    shutil.rmtree(path)
    _kill_loop(server, save, lambda: _values(path), per_tensor=False, duration=duration)
    save(99.0, _quiet)
    assert _leftovers(tmp_path, {"ckpt"}) == []
    assert _values(path) == {99.0}


def test_sharded_overwrite_false_is_exclusive(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    raced: list[bool] = []

    def other_writer(done: int, total: int) -> None:
        if not raced:  # another process commits while this write is under way
            raced.append(True)
            tg.save(_state(7.0), target, max_shard_size=SHARD)

    with pytest.raises(tg.TorchgraftError, match="already exists"):
        tg.save(_state(1.0), target, max_shard_size=SHARD, progress=other_writer)
    assert _values(tmp_path) == {7.0}
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert _leftovers(tmp_path, {*index["weight_map"].values(),
                                 "model.safetensors.index.json"}) == []


def test_an_overwrite_removes_only_shards_it_replaced(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    save_file({"w": torch.ones(2)}, tmp_path / "model-00001-of-00001.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "w": "model-00001-of-00001.safetensors", "v": "config.json"}}))
    tg.save(_state(2.0), tmp_path / "model.safetensors", max_shard_size=SHARD,
            overwrite=True)
    assert (tmp_path / "config.json").read_text() == "{}"
    assert not (tmp_path / "model-00001-of-00001.safetensors").exists()
    assert _values(tmp_path) == {2.0}


def test_a_failed_sharded_write_removes_its_new_shards(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    tg.save(_state(1.0), target, max_shard_size=SHARD)
    before = sorted(p.name for p in tmp_path.iterdir())

    calls: list[int] = []

    def fail(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 8:  # in the third shard: two are written
            raise OSError(28, "No space left on device")

    with pytest.raises(tg.CheckpointWriteError, match="No space"):
        tg.save(_state(2.0), target, max_shard_size=SHARD, overwrite=True,
                progress=fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert _values(tmp_path) == {1.0}


def test_a_killed_overwrite_after_its_commit_is_cleaned_by_the_next_write(tmp_path: Path
                                                                          ) -> None:
    target = tmp_path / "model.safetensors"
    first = tg.save(_state(1.0), target, max_shard_size=SHARD)
    kept = {p.name: p.read_bytes() for p in first[:-1]}
    tg.save(_state(2.0), target, max_shard_size=SHARD, overwrite=True)
    for name, data in kept.items():  # as if killed after the commit, before the clean-up
        (tmp_path / name).write_bytes(data)
        os.utime(tmp_path / name, (1, 1))
    third = tg.save(_state(3.0), target, max_shard_size=SHARD, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in third)
    assert _values(tmp_path) == {3.0}


@pytest.mark.skipif(os.getuid() != 0, reason="needs to plant a file owned by another user")
def test_a_swap_folder_of_another_user_is_never_adopted(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    planted = tmp_path / ".ckpt.tg-999999-planted"
    tg.save(_state(6.0), planted / "old")
    for item in [planted, *planted.rglob("*")]:
        os.chown(item, 12345, 12345)
    with atomic_dir(path) as temporary:
        tg.save(_state(1.0), temporary)
    assert _values(path) == {1.0}
    assert planted.exists()  # not ours: not removed either


def test_a_dcp_save_on_a_full_disk_names_the_destination(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.checkpoint import filesystem

    path = tmp_path / "ckpt"
    tg.save(_state(1.0), path)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(filesystem, "_write_item", full)
    with pytest.raises(tg.CheckpointWriteError, match="No space left") as caught:
        tg.save(_state(2.0), path, overwrite=True)
    assert caught.value.path == str(path)
    assert _values(path) == {1.0}
    assert _leftovers(tmp_path, {"ckpt"}) == []
