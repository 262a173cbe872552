"""Reading tensors into their targets at the machine's pace: readers, staging ring, streams.

A pool of readers, a ring of staging buffers, copies to the device overlapping the reads.

The design follows what the fast loaders do, and what each leaves on the table:

* torch.distributed.checkpoint's ``FileSystemReader`` groups a plan's reads by file and reads
  each file's items in offset order, one stream per file, then copies each item into its
  target; safetensors' ``load_file(device=...)`` memory-maps the file and moves tensor after
  tensor to the device from the mapping (page faults, one pageable copy at a time);
* runai-model-streamer reads each file's byte range in chunks with a pool of C++ threads
  (16 by default) into one host buffer the size of what it streams, and hands out tensors as
  their bytes arrive (the caller moves them to the device);
* fastsafetensors (without GPUDirect) reads whole files with threads through pinned bounce
  buffers into one device buffer per file, and makes each tensor a view of it.

Here the file is read by a pool of threads, each holding a small ring of staging buffers, so
host memory is bounded by the ring, never by the file:

* every tensor of the plan is cut into *pieces* of at most :data:`PIECE_BYTES`, in file order:
  a large tensor is split across several pieces (so across readers), small neighbouring ones
  share one piece (one ``preadv`` system call for up to :data:`IOV_MAX` of them);
* the readers take pieces from one queue, so several shards, and several regions of one file,
  are read at once (``preadv`` releases the GIL); each reader opens nothing: the files are
  opened once, here;
* bytes whose target is a contiguous CPU tensor of their dtype are read straight into its
  memory (no staging, no second copy). Bytes bound for an accelerator are read into the
  reader's next staging buffer (pinned for CUDA), then copied into the target, the dtype cast
  on the way (a CPU target of another dtype is filled from the file's mapping, one pass over
  the bytes, see :func:`_staged`); a copy to a CUDA device is issued on the reader's own
  stream and does not wait, the buffer being reused only once an event says its copy is
  over: copies run on as many streams as there are readers, overlapping the reads;
* a tensor whose bytes are not plainly in a file (compressed, another layout) is read by its
  format (:meth:`~torchgraft.meta.TensorRef.read_into`) by one reader.

A failure, or ``KeyboardInterrupt`` in the calling thread, stops the readers after the piece
each has in hand, waits for the copies in flight, and releases every staging buffer and
descriptor before the exception goes on, with a note naming the tensors not loaded.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CorruptCheckpointError, TorchgraftError, reading
from ..meta import TensorRef
from ..text import few, quoted
from .source import file_named

__all__ = ["BUFFERS_PER_READER", "IOV_MAX", "PIECE_BYTES", "READERS", "Piece", "Read", "pieces",
           "plan_read", "read_all"]

#: Buffers one ``preadv`` call takes at most (the POSIX minimum, and Linux's limit).
IOV_MAX = 1024
#: Bytes of one piece at most, and of one staging buffer: large enough that a system call and
#: a copy's launch are amortised (a thousand pieces for 4 GiB), small enough that a 100 MiB
#: tensor keeps every reader busy and 16 readers' buffers pin in a few tens of milliseconds.
PIECE_BYTES = 4 * 1024 * 1024
#: Staging buffers per reader: one being filled while the copy out of the other runs.
BUFFERS_PER_READER = 2
#: Readers at once: every core copying from the page cache, up to 16 (runai-model-streamer's
#: default; more gained nothing on a 16-core machine with a warm page cache).
READERS = max(1, min(16, os.cpu_count() or 1))
#: Where a staged part starts in its buffer: aligned for any dtype (and for DMA engines).
_ALIGN = 64
#: The buffer of a piece that stages nothing.
_NO_BUFFER = torch.empty(0, dtype=torch.uint8)


@dataclass(frozen=True, slots=True)
class Read:
    """One tensor to read into its target.

    Attributes:
        name: The source key, for errors.
        ref: The lazy tensor.
        out: The target tensor (any device), detached.
        path: The file holding its bytes as stored, when they can be read as bytes into
            ``out`` (contiguous, same shape); else ``None``.
        offset: Where they start in that file.
    """

    name: str
    ref: TensorRef
    out: torch.Tensor
    path: str | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """The tensor's size in bytes, as stored."""
        return self.ref.meta.nbytes

    @property
    def direct(self) -> bool:
        """Whether its bytes go straight into ``out``'s memory (CPU, the stored dtype)."""
        return self.out.device.type == "cpu" and self.out.dtype == self.ref.meta.dtype


def plan_read(name: str, ref: TensorRef, out: torch.Tensor) -> Read:
    """Describe a read, with its byte range where its bytes can be read as such into ``out``.

    Args:
        name: The source key.
        ref: The lazy tensor.
        out: The target tensor (same shape), on any device.

    Returns:
        The read.
    """
    out = out.detach()
    if ref.span is not None and out.is_contiguous() and tuple(out.shape) == ref.meta.shape:
        path, offset = ref.span()
        return Read(name, ref, out, path, offset)
    return Read(name, ref, out)


@dataclass(frozen=True, slots=True)
class _Part:
    """Bytes ``[start, start + nbytes)`` of one tensor, within a piece."""

    read: Read
    start: int
    nbytes: int


@dataclass(slots=True)
class Piece:
    """One reader's task: a byte range of one file, or one tensor its format reads.

    Attributes:
        path: The file (``None``: the tensor is read by its format).
        offset: The range's first byte.
        nbytes: Its size.
        parts: The tensors' bytes it holds, in file order.
        staged: Bytes of staging buffer it needs (parts not read straight into their target).
        holds: The reads (their indices) it holds bytes of, each once; an empty tensor is
            held by the piece it would start.
    """

    path: str | None
    offset: int
    nbytes: int = 0
    parts: list[_Part] = field(default_factory=list)
    staged: int = 0
    holds: list[int] = field(default_factory=list)


def _aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


def pieces(reads: Sequence[Read], piece_bytes: int | None = None) -> list[Piece]:
    """Cut the reads into pieces: large tensors split, small neighbours together.

    Args:
        reads: The reads, in any order.
        piece_bytes: Bytes of one piece at most (a tensor that is read straight into its
            target may be cut anywhere; a staged one between elements); by default
            :data:`PIECE_BYTES`.

    Returns:
        The pieces, in file order; then one for each read without a byte range.
    """
    piece_bytes = piece_bytes or PIECE_BYTES
    ranged = [r.path is not None and (r.direct or _staged(r)) for r in reads]
    spans = sorted((i for i, r in enumerate(reads) if ranged[i]),
                   key=lambda i: (reads[i].path, reads[i].offset))
    out: list[Piece] = []
    current = Piece(None, 0)
    for index in spans:
        read = reads[index]
        direct, total = read.direct, read.nbytes
        itemsize = read.ref.meta.dtype.itemsize
        step = piece_bytes if direct else max(itemsize, piece_bytes // itemsize * itemsize)
        start = 0
        while True:
            size = min(step, total - start)
            place = read.offset + start
            if (current.path != read.path or current.offset + current.nbytes != place
                    or current.nbytes + size > piece_bytes or len(current.parts) >= IOV_MAX
                    or (not direct and _aligned(current.staged) + size > piece_bytes)):
                current = Piece(read.path, place)
                out.append(current)
            current.holds.append(index)
            if size:
                current.parts.append(_Part(read, start, size))
                current.nbytes += size
                if not direct:
                    current.staged = _aligned(current.staged) + size
            start += size
            if start >= total:
                break
    return out + [Piece(None, 0, r.nbytes, [_Part(r, 0, r.nbytes)], 0, [i])
                  for i, r in enumerate(reads) if not ranged[i]]


def _staged(read: Read) -> bool:
    """Whether a read that is not straight into its target goes through the staging ring.

    Towards an accelerator, always. Into a CPU tensor of another dtype, the format's own read
    (a memory-mapped view, cast as it is copied) is one pass over the bytes where the ring
    takes two, about 12% slower on the CPU: it is read that way.
    """
    return read.out.device.type != "cpu"


class _Reader:
    """One reader's staging buffers and CUDA streams; a buffer is reused once its copies end.

    The buffers are allocated on the reader's first staged piece, in its own thread: pinning
    host memory takes time (about a millisecond per few MiB), which then overlaps the other
    readers' reads, and a load that stages nothing allocates nothing.

    Args:
        buffer_bytes: Size of each of its :data:`BUFFERS_PER_READER` buffers.
        pinned: Pin them: copies to a CUDA device are then asynchronous.
    """

    def __init__(self, buffer_bytes: int, pinned: bool) -> None:
        self.buffer_bytes = buffer_bytes
        self.pinned = pinned
        self.buffers: list[torch.Tensor] = []
        self.pending: list[list[Any]] = [[] for _ in range(BUFFERS_PER_READER)]  # CUDA events
        self.streams: dict[torch.device, Any] = {}
        self.next = 0

    def take(self) -> tuple[int, torch.Tensor]:
        """The next buffer of the ring, once the copies out of it have finished."""
        if not self.buffers:
            ring = _ring(BUFFERS_PER_READER, self.buffer_bytes, self.pinned)
            self.buffers = [ring[b * self.buffer_bytes:(b + 1) * self.buffer_bytes]
                            for b in range(BUFFERS_PER_READER)]
        index = self.next
        self.next = (index + 1) % len(self.buffers)
        for event in self.pending[index]:
            event.synchronize()
        self.pending[index] = []
        return index, self.buffers[index]

    def open_streams(self, devices: set[torch.device]) -> None:
        """A stream of its own on each CUDA device, after the work queued there so far.

        The calling thread's queued work: the targets' allocation and initialisation.
        """
        for device in devices:
            stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream(device))
            self.streams[device] = stream

    def copy(self, part: _Part, chunk: torch.Tensor) -> None:
        """Copy a staged part into its target, the dtype cast on the way.

        To a CUDA device, on this reader's stream there, without waiting.
        """
        read = part.read
        meta = read.ref.meta
        source = chunk.view(meta.dtype)
        if part.nbytes == meta.nbytes:
            target = read.out
            source = source.view(meta.shape)
        else:
            first = part.start // meta.dtype.itemsize
            target = read.out.view(-1)[first:first + source.numel()]
        stream = self.streams.get(target.device) if self.pinned else None
        if stream is None:
            target.copy_(source)
            return
        with torch.cuda.stream(stream):
            target.copy_(source, non_blocking=True)

    def sent(self, index: int) -> None:
        """Mark buffer ``index`` busy until the copies issued out of it so far have run."""
        for stream in self.streams.values():
            event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
            event.record(stream)  # the waiting reader sleeps rather than spins
            self.pending[index].append(event)

    def finish(self) -> None:
        """Wait for every copy in flight; later work on each device waits for these streams.

        Later work: the calling thread's, on its current stream.
        """
        for events in self.pending:
            for event in events:
                event.synchronize()
        self.pending = [[] for _ in range(BUFFERS_PER_READER)]
        self.buffers = []
        for device, stream in self.streams.items():
            torch.cuda.current_stream(device).wait_stream(stream)


def _bytes(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory, as bytes."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def _read_piece(piece: Piece, fds: dict[str, int], reader: _Reader) -> None:
    """Read one piece: its bytes into targets and a staging buffer, then the staged copies."""
    if piece.path is None:
        read = piece.parts[0].read
        read.ref.read_into(read.out)
        return
    index, buffer = reader.take() if piece.staged else (0, _NO_BUFFER)
    views: list[memoryview] = []
    staged: list[tuple[_Part, torch.Tensor]] = []
    place = 0
    for part in piece.parts:
        if part.read.direct:
            views.append(_bytes(part.read.out)[part.start:part.start + part.nbytes])
        else:
            place = _aligned(place)
            chunk = buffer[place:place + part.nbytes]
            views.append(chunk.numpy().data)
            staged.append((part, chunk))
            place += part.nbytes
    _preadv(fds[piece.path], views, piece.offset, piece)
    for part, chunk in staged:
        reader.copy(part, chunk)
    if staged:
        reader.sent(index)


def _preadv(fd: int, views: list[memoryview], offset: int, piece: Piece) -> None:
    """Fill ``views`` from ``offset`` on, however many calls the system takes."""
    while views:
        first = piece.parts[0].read.name
        try:
            with reading(file_named(str(piece.path))):
                count = os.preadv(fd, views, offset)
        except TorchgraftError as exc:
            raise exc.about(first) from exc.__cause__
        if count <= 0:
            raise CorruptCheckpointError(f"'{first}' or a tensor after it ends early: the file "
                                         "shrank while open", path=file_named(str(piece.path)))
        offset += count
        while views and count >= len(views[0]):
            count -= len(views[0])
            views.pop(0)
        if views and count:
            views[0] = views[0][count:]


def _cuda_targets(reads: Sequence[Read]) -> set[torch.device]:
    """The CUDA devices that staged bytes go to: where copies run on the readers' streams."""
    if not torch.cuda.is_available():
        return set()
    return {r.out.device for r in reads
            if r.path is not None and r.out.device.type == "cuda" and _staged(r)}


def _ring(count: int, buffer_bytes: int, pinned: bool) -> torch.Tensor:
    """One reader's staging buffers, as one allocation (one pinning call)."""
    return torch.empty(count * buffer_bytes, dtype=torch.uint8, pin_memory=pinned)


def _release(pinned: bool) -> None:
    """Give freed pinned buffers back to the system after a failure.

    After a load that succeeded torch's host allocator keeps them for its next pinned
    allocation (as it does for a DataLoader's), at most the ring's size.
    """
    empty = getattr(torch._C, "_host_emptyCache", None)
    if pinned and empty is not None:
        empty()


def _not_loaded(exc: BaseException, names: list[str], total: int) -> None:
    """Say in the exception which tensors were not loaded (the others were)."""
    text = (f"{len(names)} of {total} tensors were not loaded ({few(names, show=quoted)}); "
            "the other targets hold the checkpoint's values")
    if isinstance(exc, TorchgraftError):
        exc.message = f"{exc.message}; {text}"
        exc.args = (f"{exc.path}: {exc.message}" if exc.path else exc.message,)
    elif hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(f"torchgraft: {text}")


@contextlib.contextmanager
def _opened(paths: set[str]) -> Iterator[dict[str, int]]:
    fds: dict[str, int] = {}
    try:
        for path in sorted(paths):
            with reading(path):
                fds[path] = os.open(path, os.O_RDONLY)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def read_all(reads: Sequence[Read], *, threads: int = READERS,
             done: Callable[[int], None] | None = None,
             piece_bytes: int | None = None) -> None:
    """Read every tensor into its target: pieces, a pool of readers, a ring of buffers.

    Args:
        reads: The reads.
        threads: How many readers at once (1: all in this thread).
        done: Called, on this thread, with the number of tensors each finished piece
            completed.
        piece_bytes: Bytes of a piece and of a staging buffer at most (by default
            :data:`PIECE_BYTES`).

    Raises:
        TorchgraftError: A read failed; every buffer and descriptor is released, the other
            readers stopped, and the message names the tensors not loaded.
    """
    work = pieces(reads, piece_bytes)
    if not work:
        return
    readers = max(1, min(threads, len(work)))
    buffer_bytes = _aligned(max(p.staged for p in work))
    devices = _cuda_targets(reads)
    pinned = bool(devices)
    states = [_Reader(buffer_bytes, pinned) for _ in range(readers)]
    for state in states:
        state.open_streams(devices)
    left = [0] * len(reads)  # per read: the pieces holding its bytes not read yet
    for piece in work:
        for index in piece.holds:
            left[index] += 1
    try:
        with _opened({p.path for p in work if p.path is not None}) as fds:
            try:
                _run(work, fds, states, _Tally(left, done))
            finally:
                for state in states:
                    state.finish()
    except BaseException as exc:
        _not_loaded(exc, [r.name for r, n in zip(reads, left, strict=True) if n], len(reads))
        traceback.clear_frames(exc.__traceback__)  # no frame keeps a staging buffer alive
        del states
        _release(pinned)
        raise


@dataclass(frozen=True, slots=True)
class _Tally:
    """Counts the pieces read; a tensor is loaded once every piece holding it is."""

    left: list[int]
    done: Callable[[int], None] | None

    def read(self, piece: Piece) -> None:
        loaded = 0
        for index in piece.holds:
            self.left[index] -= 1
            loaded += not self.left[index]
        if self.done is not None and loaded:
            self.done(loaded)


def _run(work: list[Piece], fds: dict[str, int], states: list[_Reader], tally: _Tally) -> None:
    """Run the pieces on the readers; the first failure stops them all."""
    if len(states) == 1:
        with torch.no_grad():
            for piece in work:
                _read_piece(piece, fds, states[0])
                tally.read(piece)
        return
    tasks = iter(work)
    lock = threading.Lock()
    stop = threading.Event()
    results: queue.SimpleQueue[Piece | BaseException | None] = queue.SimpleQueue()

    def reader(state: _Reader) -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                while not stop.is_set():
                    with lock:
                        piece = next(tasks, None)
                    if piece is None:
                        break
                    _read_piece(piece, fds, state)
                    results.put(piece)
        except BaseException as exc:  # handed to the calling thread, which raises it
            stop.set()
            results.put(exc)
        finally:
            results.put(None)

    pool = [threading.Thread(target=reader, args=(state,), name=f"torchgraft-reader-{k}",
                             daemon=True) for k, state in enumerate(states)]
    failure: BaseException | None = None
    try:
        for thread in pool:
            thread.start()
        running = len(pool)
        while running:
            item = results.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                failure = failure or item
            else:
                tally.read(item)
    finally:
        stop.set()  # on an interrupt here too: each reader ends after its piece in hand
        for thread in pool:
            if thread.ident is not None:
                thread.join()
    if failure is not None:
        raise failure
