"""Reading tensors into their targets: pieces, a pool of readers, a ring of staging buffers.

On the CPU the pipeline is the one a GPU runs: targets of the stored dtype are read straight
into, a cast goes through the staging ring (pinned and copied on the readers' streams only
where the target is on CUDA).
"""

from __future__ import annotations

import gc
import os
import re
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from torchgraft.errors import CorruptCheckpointError, TorchgraftError
from torchgraft.io import reads as reads_module
from torchgraft.io.reads import Read, pieces, plan_read, read_all
from torchgraft.meta import TensorMeta, TensorRef


def file_reads(path: Path, dtype: torch.dtype | None = None,
               ) -> tuple[tg.Checkpoint, dict[str, torch.Tensor], list[Read]]:
    ckpt = tg.open(path)
    refs = ckpt.tensor_refs()
    outs = {name: torch.zeros(ref.meta.shape, dtype=dtype or ref.meta.dtype)
            for name, ref in refs.items()}
    return ckpt, outs, [plan_read(name, ref, outs[name]) for name, ref in refs.items()]


def _values(count: int = 12, size: int = 3000) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {f"t{i}": torch.randn(size // (i + 1), i + 1) for i in range(count)}


def _write(values: dict[str, torch.Tensor], folder: Path, kind: str) -> Path:
    """The same tensors as one .safetensors, a torch zip .pt, or a sharded folder."""
    if kind == "pt":
        torch.save(values, folder / "w.pt")
        return folder / "w.pt"
    if kind == "safetensors":
        save_file(values, folder / "w.safetensors")
        return folder / "w.safetensors"
    import json

    names = list(values)
    shards = {f"model-0000{k + 1}-of-00002.safetensors": names[k::2] for k in range(2)}
    for file, keys in shards.items():
        save_file({k: values[k] for k in keys}, folder / file)
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder



class Leaks:
    """What a read may leave behind: staging buffers, reader threads, descriptors."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rings: list[weakref.ref[torch.Tensor]] = []
        self.fds = len(os.listdir("/proc/self/fd"))
        ring = reads_module._ring

        def recorded(*args: Any) -> torch.Tensor:
            made = ring(*args)
            self.rings.append(weakref.ref(made))
            return made

        monkeypatch.setattr(reads_module, "_ring", recorded)

    def check(self) -> None:
        gc.collect()
        assert self.rings and all(r() is None for r in self.rings)
        assert not [t for t in threading.enumerate() if t.name.startswith("torchgraft-reader")]
        assert len(os.listdir("/proc/self/fd")) == self.fds


@pytest.fixture
def ring_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Send CPU targets of another dtype through the staging ring, as device targets go
    (on the CPU the format's own mapped read is faster, and is what runs)."""
    monkeypatch.setattr(reads_module, "_staged", lambda read: not read.direct)


def failing_after(calls: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.preadv`` fails from its ``calls + 1``-th call on (a disk error midway)."""
    real = os.preadv
    count = iter(range(1 << 30))

    def preadv(fd: int, views: list[memoryview], offset: int) -> int:
        if next(count) >= calls:
            raise OSError(5, "Input/output error")
        return real(fd, views, offset)

    monkeypatch.setattr(reads_module.os, "preadv", preadv)


def test_neighbouring_small_tensors_are_one_piece_read_by_one_call(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.arange(i * 10, i * 10 + 6, dtype=torch.float32).reshape(2, 3)
               for i in range(50)} | {"empty": torch.empty(0), "half": torch.ones(3).half()}
    save_file(tensors, tmp_path / "a.safetensors")
    ckpt, outs, reads = file_reads(tmp_path / "a.safetensors")
    with ckpt:
        assert [len(p.parts) for p in pieces(reads)] == [len(tensors) - 1]  # one preadv
        counts: list[int] = []
        read_all(reads, threads=2, done=counts.append)
    assert sum(counts) == len(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(outs[name], tensor), name


def test_a_large_tensor_is_split_across_readers(tmp_path: Path) -> None:
    values = {"big": torch.randn(64, 256), "small": torch.randn(3)}
    save_file(values, tmp_path / "b.safetensors")
    ckpt, outs, reads = file_reads(tmp_path / "b.safetensors")
    with ckpt:
        cut = pieces(reads, piece_bytes=4096)
        assert len(cut) == 64 * 256 * 4 // 4096 + 1
        assert all(p.nbytes <= 4096 for p in cut)
        read_all(reads, threads=3, piece_bytes=4096)
    assert all(torch.equal(outs[k], v) for k, v in values.items())


@pytest.mark.parametrize("kind", ["safetensors", "pt", "sharded"])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16])
@pytest.mark.usefixtures("ring_on_cpu")
def test_every_format_arrives_whole_straight_or_through_the_ring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
        dtype: torch.dtype | None) -> None:
    """The stored dtype is read straight into the targets; a cast goes through the staging
    ring, in pieces smaller than most tensors, so buffers are reused many times over."""
    values = _values()
    leaks = Leaks(monkeypatch)
    ckpt, outs, reads = file_reads(_write(values, tmp_path, kind), dtype)
    with ckpt:
        assert all(r.path is not None for r in reads)  # byte ranges in every format
        read_all(reads, threads=2, piece_bytes=2048)
    for name, value in values.items():
        assert torch.equal(outs[name], value.to(outs[name].dtype)), name
    if dtype is not None:  # staged: each reader's ring, the only host memory besides
        assert 1 <= len(leaks.rings) <= 2  # a reader that stages nothing allocates none
    leaks.rings = leaks.rings or [weakref.ref(torch.empty(0))]
    leaks.check()


@pytest.mark.usefixtures("ring_on_cpu")
def test_the_ring_is_bounded_by_its_buffers_not_the_file(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    ring = reads_module._ring

    def recorded(count: int, buffer_bytes: int, pinned: bool) -> torch.Tensor:
        sizes.append(count * buffer_bytes)
        return ring(count, buffer_bytes, pinned)

    monkeypatch.setattr(reads_module, "_ring", recorded)
    values = _values(count=6, size=60000)  # 1.4 MB of float32
    ckpt, outs, reads = file_reads(_write(values, tmp_path, "safetensors"), torch.float64)
    with ckpt:
        read_all(reads, threads=2, piece_bytes=8192)
    assert set(sizes) == {reads_module.BUFFERS_PER_READER * 8192} and len(sizes) <= 2
    assert all(torch.equal(outs[k], v.double()) for k, v in values.items())


def test_a_cast_on_the_cpu_is_read_from_the_mapping_without_a_ring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the fixture: a CPU target of another dtype is one pass over mapped bytes."""
    values = _values()
    leaks = Leaks(monkeypatch)
    ckpt, outs, reads = file_reads(_write(values, tmp_path, "safetensors"), torch.float64)
    with ckpt:
        assert all(p.path is None for p in pieces(reads))
        read_all(reads, threads=2)
    assert all(torch.equal(outs[k], v.double()) for k, v in values.items())
    assert leaks.rings == []


def test_tensors_not_stored_plainly_are_read_by_their_format() -> None:
    value = torch.arange(6.0)
    ref = TensorRef(TensorMeta.of((6,), torch.float32), lambda: value)
    out = torch.empty(6, dtype=torch.float64)
    read = plan_read("x", ref, out)
    assert read.path is None and len(pieces([read])) == 1
    read_all([read], threads=2)
    assert torch.equal(out, value.double())


def test_a_file_that_shrank_is_an_error_naming_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_file({"a": torch.ones(1000), "b": torch.ones(1000)}, path)
    ckpt, _, reads = file_reads(path)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with ckpt, pytest.raises(CorruptCheckpointError, match="'a' or a tensor after it ends early"):
        read_all(reads, threads=1)


def _midway(tmp_path: Path, dtype: torch.dtype | None
            ) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[Read]]]:
    values = _values(count=16, size=4000)
    ckpt, outs, reads = file_reads(_write(values, tmp_path, "safetensors"), dtype)
    with ckpt:
        yield values, outs, reads


def _report(message: str, values: dict[str, torch.Tensor],
            outs: dict[str, torch.Tensor]) -> None:
    """The message counts the tensors not loaded; every other target holds its value."""
    found = re.search(r"(\d+) of (\d+) tensors were not loaded", message)
    assert found is not None, message
    missing, total = int(found[1]), int(found[2])
    assert total == len(values) and 0 < missing < total
    loaded = [k for k, v in values.items() if torch.equal(outs[k], v.to(outs[k].dtype))]
    assert len(loaded) >= total - missing


@pytest.mark.usefixtures("ring_on_cpu")
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_a_read_error_midway_releases_everything_and_says_what_was_not_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int,
        dtype: torch.dtype | None) -> None:
    leaks = Leaks(monkeypatch)
    failing_after(12, monkeypatch)
    for values, outs, reads in _midway(tmp_path, dtype):
        with pytest.raises(TorchgraftError, match="Input/output error") as caught:
            read_all(reads, threads=threads, piece_bytes=4096)
        _report(str(caught.value), values, outs)
        del caught
    if dtype is None:  # read straight into the targets: no ring at all
        leaks.rings = [weakref.ref(torch.empty(0))]
    leaks.check()


@pytest.mark.usefixtures("ring_on_cpu")
@pytest.mark.parametrize("threads", [1, 3])
def test_an_interrupt_midway_releases_everything_and_says_what_was_not_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    leaks = Leaks(monkeypatch)
    calls = iter(range(1 << 30))

    def progress(count: int) -> None:
        if next(calls) == 3:
            raise KeyboardInterrupt

    for values, outs, reads in _midway(tmp_path, torch.float64):
        with pytest.raises(KeyboardInterrupt) as caught:
            read_all(reads, threads=threads, done=progress, piece_bytes=4096)
        _report(" ".join(getattr(caught.value, "__notes__", [])), values, outs)
        del caught
    leaks.check()


@pytest.mark.usefixtures("ring_on_cpu")
def test_without_a_failure_nothing_is_reported_missing(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin of the failures above: the same reads, no error, every target filled."""
    leaks = Leaks(monkeypatch)
    for values, outs, reads in _midway(tmp_path, torch.float64):
        read_all(reads, threads=3, piece_bytes=4096)
        assert all(torch.equal(outs[k], v.double()) for k, v in values.items())
    leaks.check()


@pytest.mark.usefixtures("ring_on_cpu")
def test_a_graft_that_fails_midway_names_what_it_did_not_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch import nn

    torch.manual_seed(0)
    source = nn.Sequential(*(nn.Linear(64, 64) for _ in range(8)))
    tg.save(source, tmp_path / "m.safetensors")
    target = nn.Sequential(*(nn.Linear(64, 64) for _ in range(8))).double()  # a cast: staged
    monkeypatch.setattr(reads_module, "PIECE_BYTES", 4096)
    failing_after(8, monkeypatch)
    with pytest.raises(TorchgraftError) as caught:
        tg.graft(tmp_path / "m.safetensors", target)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'm.safetensors'}: while reading '")
    assert "cannot be read: Input/output error" in message
    assert re.search(r"; ([1-9]|1[0-5]) of 16 tensors were not loaded \('", message), message


@pytest.mark.usefixtures("ring_on_cpu")
def test_the_leak_check_sees_a_buffer_still_held(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken twin of the checks above: a staging buffer kept alive is caught."""
    leaks = Leaks(monkeypatch)
    held: list[torch.Tensor] = []
    ring = reads_module._ring

    def kept(*args: Any) -> torch.Tensor:
        held.append(ring(*args))
        return held[-1]

    monkeypatch.setattr(reads_module, "_ring", kept)
    failing_after(12, monkeypatch)
    for _values, _outs, reads in _midway(tmp_path, torch.float64):
        with pytest.raises(TorchgraftError):
            read_all(reads, threads=3, piece_bytes=4096)
    with pytest.raises(AssertionError):
        leaks.check()


class FakeCuda:
    """Stands for CUDA's streams and events on the CPU: records what the readers ask of them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import contextlib

        self.events: list[FakeCuda.Event] = []
        self.waits: list[tuple[str, str]] = []
        self.streams = 0
        self.current = FakeCuda.Stream(self, "current")
        cuda = reads_module.torch.cuda
        ring = reads_module._ring
        monkeypatch.setattr(reads_module, "_ring",  # no pinned memory without CUDA
                            lambda count, size, pinned: ring(count, size, False))
        monkeypatch.setattr(reads_module, "_cuda_targets",
                            lambda reads: {torch.device("cpu")})
        monkeypatch.setattr(cuda, "Stream", lambda device: FakeCuda.Stream(self, "reader"))
        monkeypatch.setattr(cuda, "current_stream", lambda device: self.current)
        monkeypatch.setattr(cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "Event", lambda blocking: FakeCuda.Event(self, blocking))

    class Stream:
        def __init__(self, cuda: FakeCuda, name: str) -> None:
            self.cuda, self.name = cuda, name
            cuda.streams += name == "reader"

        def wait_stream(self, other: FakeCuda.Stream) -> None:
            self.cuda.waits.append((self.name, other.name))

    class Event:
        def __init__(self, cuda: FakeCuda, blocking: bool) -> None:
            assert blocking  # a reader waiting for a copy sleeps
            self.recorded = self.synced = False
            cuda.events.append(self)

        def record(self, stream: FakeCuda.Stream) -> None:
            assert stream.name == "reader"
            self.recorded = True

        def synchronize(self) -> None:
            assert self.recorded
            self.synced = True


@pytest.mark.usefixtures("ring_on_cpu")
@pytest.mark.parametrize("fail", [False, True])
def test_towards_cuda_each_piece_is_copied_on_its_readers_stream_and_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    """The CUDA path's bookkeeping, run on the CPU with stand-ins for streams and events:
    each reader's stream starts after the caller's queued work, one event per staged piece,
    every event waited for before its buffer is reused or the load returns, the caller's
    stream waits for every reader's; after a failure the pinned buffers are given back."""
    cuda = FakeCuda(monkeypatch)
    released: list[bool] = []
    monkeypatch.setattr(reads_module, "_release", released.append)
    if fail:
        failing_after(12, monkeypatch)
    for values, outs, reads in _midway(tmp_path, torch.float64):
        work = pieces(reads, piece_bytes=4096)
        if fail:
            with pytest.raises(TorchgraftError):
                read_all(reads, threads=3, piece_bytes=4096)
        else:
            read_all(reads, threads=3, piece_bytes=4096)
            assert all(torch.equal(outs[k], v.double()) for k, v in values.items())
            assert len(cuda.events) == len(work)  # one event per piece (one device)
    assert cuda.streams == 3 and cuda.waits.count(("reader", "current")) == 3
    assert cuda.waits.count(("current", "reader")) == 3
    assert cuda.events and all(e.recorded and e.synced for e in cuda.events)
    assert released == ([True] if fail else [])
