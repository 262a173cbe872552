"""A pickle's opcodes, walked before it is unpickled, against the file.

CPython's unpickler trusts a pickle's numbers: ``BINBYTES8 2**62`` reserves that many bytes
before it reads one, and ``LONG_BINPUT 2**30`` grows the memo to 2**31 entries (16 GiB) for a
10-byte file. The walk finds where each opcode is (nothing is built) and refuses, before the
unpickler runs: a counted length past the file's end (strings, bytes, long integers,
``FRAME``), a memo index above the pickle's bytes so far (a pickler numbers its memo 0, 1, 2...,
one opcode at least per entry, so no pickler writes one), a line without its end, an opcode
that is none. An index never stored is the unpickler's own error, allocating nothing.

Why not ``pickletools.genops``: it builds an object per opcode in Python, about 0.2 µs each,
1.3 s for 10 MB of pickle. Here the runs of opcodes whose arguments cost nothing (no argument,
or a fixed-width integer, float, memo get or one-byte memo index) are stepped over by one
regular expression, at C speed; only opcodes with a counted length, a text line, a four-byte
memo index or a frame come back to Python, and each of those takes two bytes at least, so the
walk is linear with a small constant (docs/safety.md gives it). Torch-free: the quick
``inspect`` walks the pickles it reads too.
"""

from __future__ import annotations

import pickletools
import re
from typing import IO, Any

from .bounds import check_length
from .errors import CorruptCheckpointError

__all__ = ["walk_opcodes"]

_STOP, _FRAME, _LONG_BINPUT, _PUT = b".", b"\x95", b"r", b"p"
#: Opcodes whose argument, if any, is a fixed-width number that allocates nothing: every
#: opcode without one (but ``STOP``), and those with one but ``FRAME`` and ``LONG_BINPUT``.
_FIXED: dict[int, bytes] = {}
_OPCODES = frozenset(op.code.encode("latin-1") for op in pickletools.opcodes)
for _opcode in pickletools.opcodes:
    _width = _opcode.arg.n if _opcode.arg is not None else 0
    _code = _opcode.code.encode("latin-1")
    if _width >= 0 and _code not in (_STOP, _FRAME, _LONG_BINPUT):
        _FIXED[_width] = _FIXED.get(_width, b"") + _code
#: Opcodes followed by a counted length: the length's width, whether it is signed.
_COUNTED = {b"U": (1, False), b"C": (1, False), b"\x8c": (1, False), b"\x8a": (1, False),
            b"T": (4, True), b"B": (4, False), b"X": (4, False), b"\x8b": (4, True),
            b"\x8d": (8, False), b"\x8e": (8, False), b"\x96": (8, False)}
#: Opcodes followed by text lines, and how many.
_LINES = {b"I": 1, b"L": 1, b"F": 1, b"S": 1, b"V": 1, b"P": 1, b"g": 1, b"p": 1, b"c": 2,
          b"i": 2}
_ANY = b"[\x00-\xff]"


def _short(width: int) -> bytes:
    """The counted opcodes of a ``width``-byte length below 256, with their bytes.

    The bytes are held, so they lie inside the file.
    """
    codes = b"".join(code for code, (size, _signed) in _COUNTED.items() if size == width)
    return b"[" + re.escape(codes) + b"](?:" + b"|".join(
        re.escape(bytes([n]) + bytes(width - 1)) + (_ANY + b"{%d}" % n if n else b"")
        for n in range(256)) + b")"


#: Steps over a run of opcodes that need no check (possessive: no state kept to backtrack):
#: those of :data:`_FIXED`; counted ones with a length below 256; text lines but a ``PUT`` of
#: six digits or more; a ``LONG_BINPUT`` below 65,536 and a ``FRAME`` below 16 MiB (a memo or
#: a read of that size costs nothing much, whatever the file).
_RUN = re.compile(b"(?:" + b"|".join([
    *(b"[" + re.escape(codes) + b"]" + (_ANY + b"{%d}" % width if width else b"")
      for width, codes in sorted(_FIXED.items())),
    *(_short(width) for width in (1, 4, 8)),
    b"[ILFSVPg][^\n]*\n", b"[ci][^\n]*\n[^\n]*\n", b"p[0-9]{1,5}\n",
    b"r" + _ANY + b"{2}\x00\x00", b"\x95" + _ANY + b"{3}\x00{5}"]) + b")*+")
#: Bytes read at a time from a stream: the first read, and the most it grows to, doubling
#: (a legacy torch file's pickle is small, and its storages follow: they are never read).
_FIRST, _CHUNK = 64 << 10, 4 << 20


class _Bytes:
    """The stream's bytes from stream position :attr:`base`, read a chunk at a time.

    Nothing past ``end`` is read; indices into :attr:`data` move down as earlier bytes are
    let go.
    """

    def __init__(self, stream: IO[bytes] | Any, end: int) -> None:
        self.stream = stream
        self.end = end
        self.base = stream.tell()
        self.data = b""
        self.chunk = min(_FIRST, _CHUNK)
        self.seek(self.base)

    @property
    def whole(self) -> bool:
        """Whether the bytes held reach the file's end."""
        return self.base + len(self.data) >= self.end

    def hold(self, at: int, count: int) -> int:
        """Read on so that ``count`` bytes from index ``at`` are held, where the file has them.

        Returns:
            ``at``'s index now (0 when the bytes before it were let go).
        """
        if len(self.data) - at >= count or self.whole:
            return at
        kept = self.data[at:]
        self.base += at
        self.chunk = min(2 * self.chunk, _CHUNK)
        self.data = kept + self.stream.read(min(max(self.chunk, count),
                                                self.end - self.base - len(kept)))
        return 0

    def seek(self, position: int) -> None:
        """Let go of what is held and go on from stream position ``position``."""
        self.stream.seek(position)
        self.base = position
        self.data = self.stream.read(min(self.chunk, max(self.end - position, 0)))

    def lines(self, at: int, count: int) -> tuple[int, int]:
        """Find the end of the ``count`` text lines after the opcode at ``at``.

        Returns:
            ``at``'s index now, and the index of the last line's end (-1: none before the
            file's end).
        """
        search = at + 1
        for _ in range(count):
            found = self.data.find(b"\n", search)
            while found < 0:
                if self.whole:
                    return at, -1
                moved = at
                at = self.hold(at, len(self.data) - at + 1)
                search -= moved - at
                found = self.data.find(b"\n", search)
            search = found + 1
        return at, search - 1


def walk_opcodes(stream: IO[bytes] | Any, end: int) -> int:
    """Walk one pickle's opcodes from the stream's position, refusing what no pickler writes.

    Args:
        stream: A seekable binary stream at the pickle's first byte.
        end: The stream position of the file's end (nothing past it is read).

    Returns:
        The stream position just after the pickle's ``STOP``. The stream is left anywhere.

    Raises:
        CorruptCheckpointError: For a length past the file's end, a memo index no pickler
            writes, a line without its end, a byte that is no opcode, or no ``STOP``.
    """
    held = _Bytes(stream, end)
    first = held.base
    at = 0
    while True:
        run_end = _RUN.match(held.data, at).end()  # type: ignore[union-attr]
        if len(held.data) - run_end < 9 and not held.whole:  # the run may stop at a cut opcode
            at = held.hold(run_end, 9)
            continue
        at = run_end
        if at >= len(held.data):
            raise CorruptCheckpointError("the pickle ends before its STOP opcode: it is "
                                         "truncated")
        position = held.base + at
        code = held.data[at:at + 1]
        if code == _STOP:
            return position + 1
        if code in _COUNTED:
            width, signed = _COUNTED[code]
            at = _whole(held, at, 1 + width)
            length = int.from_bytes(held.data[at + 1:at + 1 + width], "little", signed=signed)
            after = position + 1 + width
            check_length(length, available=end - after,
                         what=f"a length in the pickle (at byte {position - first})")
            if at + 1 + width + length <= len(held.data):
                at += 1 + width + length
            else:
                held.seek(after + length)
                at = 0
        elif code in (_FRAME, _LONG_BINPUT):
            width = 8 if code == _FRAME else 4
            at = _whole(held, at, 1 + width)
            value = int.from_bytes(held.data[at + 1:at + 1 + width], "little")
            if code == _FRAME:
                check_length(value, available=end - position - 9,
                             what=f"a pickle frame's length (at byte {position - first})")
            else:
                _check_memo(value, position - first)
            at += 1 + width
        elif code in _LINES:
            at, stop = held.lines(at, _LINES[code])
            if stop < 0:
                raise CorruptCheckpointError(f"a text opcode of the pickle (at byte "
                                             f"{position - first}) has no line end: it is "
                                             "truncated")
            if code == _PUT:
                text = held.data[at + 1:stop].strip()
                if not text.isdigit() or len(text) > 20:
                    raise CorruptCheckpointError(f"memo index {text[:40]!r} (at byte "
                                                 f"{position - first}) is not a number")
                _check_memo(int(text), position - first)
            at = stop + 1
        elif code in _OPCODES:  # a fixed one the regular expression did not take: cut short
            raise CorruptCheckpointError("the pickle ends inside an opcode: it is truncated")
        else:
            raise CorruptCheckpointError(f"byte {code.hex()} at {position - first} of the pickle "
                                         "is no pickle opcode")


def _whole(held: _Bytes, at: int, count: int) -> int:
    """``at``'s index once ``count`` bytes from it are held; refused where the file ends."""
    at = held.hold(at, count)
    if len(held.data) - at < count:
        raise CorruptCheckpointError("the pickle ends inside an opcode: it is truncated")
    return at


def _check_memo(index: int, walked: int) -> None:
    if index > walked:
        raise CorruptCheckpointError(f"memo index {index} after {walked} bytes of the pickle: "
                                     "no pickler numbers its memo so")
