"""The walk of a pickle's opcodes before it is unpickled: every pickle a pickler writes
passes, where its STOP is; what would allocate on the file's word is refused; the work is
linear in the bytes."""

from __future__ import annotations

import collections
import datetime
import io
import pickle
import pickletools
from typing import Any

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import assert_operations_scale_linearly, operations
from torchgraft import pickle_walk
from torchgraft.pickle_walk import walk_opcodes


def _pickles() -> list[bytes]:
    """Real pickles of every protocol: containers, strings and bytes of every length kind,
    big integers, numpy arrays, a state dict, shared objects (memo puts and gets)."""
    shared = [1.5, "s" * 300]
    objects: list[Any] = [
        {"a": [1, 2.5, "x" * 300, b"y" * 70_000, (None, True)], "b": {1: 2}, "s": shared,
         "t": shared},
        list(range(70_000)), collections.OrderedDict(a=1), datetime.datetime(2024, 1, 2),
        "é" * 100, 2**200, -(2**2000), np.arange(10), {"s": {1, 2}, "f": frozenset([3])},
        bytearray(b"abc"), [[i] * 3 for i in range(300)],
        {f"layer{i}.weight": torch.ones(2).numpy() for i in range(50)}]
    return [pickle.dumps(o, protocol=p) for o in objects for p in range(6)]


def _genops_end(data: bytes) -> int:
    stream = io.BytesIO(data)
    for _ in pickletools.genops(stream):
        pass
    return stream.tell()


@pytest.mark.parametrize("chunk", [4 << 20, 1, 7, 64])
def test_every_real_pickle_passes_and_ends_where_pickletools_ends_it(
        chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read whole, and a few bytes at a time (a legacy file's pickle from a stream): each
    opcode cut at a chunk's end is read on, never taken for another."""
    monkeypatch.setattr(pickle_walk, "_CHUNK", chunk)
    monkeypatch.setattr(pickle_walk, "_FIRST", chunk)
    for data in _pickles():
        followed = data + b"\x00 storages follow"
        assert walk_opcodes(io.BytesIO(followed), len(followed)) == _genops_end(data) \
            == len(data)


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(tg.CorruptCheckpointError, match=match):
        walk_opcodes(io.BytesIO(data), len(data))


@pytest.mark.parametrize(("data", "match"), [
    (b"\x80\x04X" + (0xFFFFFFF0).to_bytes(4, "little") + b"abc", "a length in the pickle"),
    (b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little") + b"x", "a length in the pickle"),
    (b"\x80\x05\x96" + (1 << 40).to_bytes(8, "little") + b"x", "a length in the pickle"),
    (b"\x80\x02T" + (-5).to_bytes(4, "little", signed=True) + b"N.", "a length in the pickle"),
    (b"\x80\x04\x95" + (1 << 40).to_bytes(8, "little") + b"N.", "frame's length"),
    (b"\x80\x02Nr" + (1 << 27).to_bytes(4, "little") + b".", "memo index 134217728"),
    (b"(p99999999999\n.", "memo index 99999999999"),
    (b"(pxx\n.", "is not a number"),
    (b"\x80\x02cos\nsys", "no line end"),
    (b"\x80\x02N\xff.", "byte ff at 3"),
    (b"\x80\x02NN", "ends before its STOP"),
    (b"\x80\x02K", "ends inside an opcode|ends before its STOP"),
])
def test_what_no_pickler_writes_is_refused(data: bytes, match: str) -> None:
    _refused(data, match)


def test_a_memo_index_no_larger_than_the_bytes_so_far_passes() -> None:
    body = b"\x80\x02" + b"N0" * 40_000 + b"Nr" + (70_000).to_bytes(4, "little") + b"."
    assert walk_opcodes(io.BytesIO(body), len(body)) == len(body)  # the control
    _refused(b"\x80\x02" + b"N0" * 40_000 + b"Nr" + (90_000).to_bytes(4, "little") + b".",
             "memo index 90000")


#: Opcodes that come back to the walk's Python one at a time, and the few that run at C
#: speed, each as a flood of ``count``.
_FLOODS = {
    "calls": lambda n: b"\x80\x02cm\nC\nq\x00(" + b"h\x00K\x01\x85R" * n + b"l.",
    "short strings": lambda n: b"\x80\x04(" + b"\x8c\x00" * n + b"l.",
    "large memo indices": lambda n: b"\x80\x02" + b"N0" * 70_000 + b"N" + (
        b"r" + (70_000).to_bytes(4, "little")) * n + b".",
    "text puts": lambda n: b"\x80\x02" + b"N0" * 600_000 + b"N" + b"p1000000\n" * n + b".",
    "long strings": lambda n: b"\x80\x04(" + (b"X" + (300).to_bytes(4, "little")
                                               + b"s" * 300) * n + b"l.",
}


@pytest.mark.parametrize("flood", sorted(_FLOODS))
def test_the_walk_is_linear_in_the_opcodes(flood: str) -> None:
    def walked(count: int) -> int:
        data = _FLOODS[flood](count)
        return operations(lambda: walk_opcodes(io.BytesIO(data), len(data)))

    assert_operations_scale_linearly(walked, 2000)
