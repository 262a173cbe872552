"""The structural fields of a valid file, found by parsing it: where each length, count and
offset is, so that the conformance battery can set each to the values files lie with.

:func:`fields` sniffs what the bytes are (a zip, a pickle or a sequence of them, ``.npy``, JSON,
a safetensors header, GGUF, msgpack, protobuf, HDF5, an OCDBT manifest) and walks them with the
format's own layout, recursing into what a zip stores uncompressed. Each :class:`Field` is a
fixed-width integer (little- or big-endian), a protobuf varint, or a decimal number written as
text (JSON, a ``.npy`` header); :func:`with_value` writes a value into one.
"""

from __future__ import annotations

import io
import json
import pickletools
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Field", "fields", "with_crcs", "with_value"]


@dataclass(frozen=True)
class Field:
    """One integer field of a file.

    Attributes:
        offset: Its first byte.
        width: Its bytes (for text and varints: as written in the valid file).
        kind: ``"<"`` or ``">"`` (fixed width, that byte order), ``"varint"`` or ``"text"``.
        what: What it is, for the battery's messages.
    """

    offset: int
    width: int
    kind: str
    what: str


def with_value(data: bytes, field: Field, value: int) -> bytes:
    """``data`` with ``field`` set to ``value`` (wrapped to a fixed width; -1 as all ones)."""
    if field.kind == "text":
        encoded = str(value).encode()
    elif field.kind == "varint":
        encoded = _varint(value % (1 << 64))
    else:
        number = value % (1 << (8 * field.width))
        encoded = number.to_bytes(field.width, "little" if field.kind == "<" else "big")
    return data[:field.offset] + encoded + data[field.offset + field.width:]


def fields(data: bytes, base: int = 0, hint: str = "") -> list[Field]:
    """Every structural integer field of ``data`` found by parsing it.

    Args:
        data: A valid file (or a member of one).
        base: Where ``data`` starts in the file (fields are given in the file's offsets).
        hint: ``"onnx"`` for protobuf, which has no magic.

    Returns:
        The fields, in file order, each once.
    """
    found: list[Field] = []
    if hint == "onnx":
        _protobuf(data, 0, len(data), "ModelProto", found)
    elif data.startswith(b"PK\x03\x04"):
        _zips(data, found)
    elif data.startswith(b"\x93NUMPY"):
        _npy(data, found)
    elif data.startswith(b"GGUF"):
        _gguf(data, found)
    elif data.startswith(b"\x89HDF\r\n\x1a\n"):
        _hdf5(data, found)
    elif data.startswith(bytes.fromhex("0cdb3a2a")):
        found.append(Field(4, 8, "<", "the OCDBT manifest's length"))
    elif data[:1] == b"\x80":
        _pickles(data, found)
    elif data[:1] in (b"{", b"["):
        _json(data, 0, found)
    elif len(data) > 8 and data[8:9] == b"{":
        found.append(Field(0, 8, "<", "the safetensors header's length"))
        _json(data[8:8 + struct.unpack("<Q", data[:8])[0]], 8, found)
    elif data[:1] and (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)):
        _msgpack(data, found)
    unique = {(f.offset, f.kind): f for f in found}
    return [Field(base + f.offset, f.width, f.kind, f.what)
            for f in sorted(unique.values(), key=lambda f: f.offset)]


# --- zip ---------------------------------------------------------------------------------------

def with_crcs(data: bytes) -> bytes:
    """``data`` with the CRC-32 of every stored member of every zip in it recomputed, in its
    local header and its central record: a forger's edit, which the checksum no longer tells
    from the writer's (``data`` as :func:`_zips` walks it: one zip, or several end to end)."""
    out = bytearray(data)
    start = 0
    while data.startswith(b"PK\x03\x04", start):
        end = data.find(b"PK\x05\x06", start)
        stop = end + 22 + struct.unpack("<H", data[end + 20:end + 22])[0]
        central = start + struct.unpack("<I", data[end + 16:end + 20])[0]
        while data.startswith(b"PK\x01\x02", central):
            name, extra, comment = struct.unpack("<HHH", data[central + 28:central + 34])
            size, local = (struct.unpack("<I", data[central + k:central + k + 4])[0]
                           for k in (20, 42))
            local += start
            begin = local + 30 + sum(struct.unpack("<HH", data[local + 26:local + 30]))
            crc = struct.pack("<I", zlib.crc32(data[begin:begin + size]))
            out[central + 16:central + 20] = out[local + 14:local + 18] = crc
            central += 46 + name + extra + comment
        start = stop
    return bytes(out)


def _zips(data: bytes, found: list[Field]) -> None:
    """One zip archive, or several end to end (a DCP data file: one per stored item)."""
    start = 0
    while data.startswith(b"PK\x03\x04", start):
        end = data.find(b"PK\x05\x06", start)
        if end < 0:
            return
        stop = end + 22 + struct.unpack("<H", data[end + 20:end + 22])[0]
        archive: list[Field] = []
        _zip(data[start:stop], archive)
        found += [Field(start + f.offset, f.width, f.kind, f.what) for f in archive]
        start = stop


def _zip(data: bytes, found: list[Field]) -> None:
    end = data.rfind(b"PK\x05\x06")
    found += [Field(end + 8, 2, "<", "the zip's entries on this disk"),
              Field(end + 10, 2, "<", "the zip's entries"),
              Field(end + 12, 4, "<", "the central directory's size"),
              Field(end + 16, 4, "<", "the central directory's offset")]
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            local = info.header_offset
            name_length, extra_length = struct.unpack("<HH", data[local + 26:local + 30])
            found += [Field(local + 18, 4, "<", f"'{info.filename}' compressed size"),
                      Field(local + 22, 4, "<", f"'{info.filename}' size"),
                      Field(local + 26, 2, "<", f"'{info.filename}' name length"),
                      Field(local + 28, 2, "<", f"'{info.filename}' extra length")]
            start = local + 30 + name_length + extra_length
            if info.compress_type == zipfile.ZIP_STORED:
                found += fields(data[start:start + info.file_size], start)
    central = struct.unpack("<I", data[end + 16:end + 20])[0]
    while data.startswith(b"PK\x01\x02", central):
        name, extra, comment = struct.unpack("<HHH", data[central + 28:central + 34])
        found += [Field(central + 20, 4, "<", "a central record's compressed size"),
                  Field(central + 24, 4, "<", "a central record's size"),
                  Field(central + 28, 2, "<", "a central record's name length"),
                  Field(central + 30, 2, "<", "a central record's extra length"),
                  Field(central + 42, 4, "<", "a central record's local header offset")]
        central += 46 + name + extra + comment


# --- pickle ------------------------------------------------------------------------------------

#: pickletools argument kinds that are a fixed-width integer (a value or a length) at the
#: opcode's next byte.
_PICKLE_ARGS = {"uint1": 1, "uint2": 2, "int4": 4, "uint4": 4, "uint8": 8, "long1": 1,
                "long4": 4, "bytes1": 1, "bytes4": 4, "bytes8": 8, "unicodestring1": 1,
                "unicodestring4": 4, "unicodestring8": 8, "bytearray8": 8}


def _pickle(data: bytes, start: int, found: list[Field]) -> int:
    """The fields of the pickle at ``start``; where it ends."""
    stream = io.BytesIO(data)
    stream.seek(start)
    for opcode, _arg, position in pickletools.genops(stream):
        width = _PICKLE_ARGS.get(opcode.arg.name if opcode.arg else "")
        if width is not None and position is not None:
            found.append(Field(position + 1, width, "<", f"pickle {opcode.name}'s argument"))
    return stream.tell()


def _pickles(data: bytes, found: list[Field]) -> None:
    """One pickle, or a legacy torch file: five pickles, then each storage's element count."""
    end = _pickle(data, 0, found)
    pickles = 1
    while pickles < 5 and data[end:end + 1] == b"\x80":
        end = _pickle(data, end, found)
        pickles += 1
    if pickles == 5:
        found += _storage_counts(data, end)


def _storage_counts(data: bytes, start: int) -> list[Field]:
    """The ``<q`` element count before each storage of a legacy file: the element sizes
    that make the counts and bytes end exactly at the file's end."""
    def walk(position: int) -> list[int] | None:
        if position == len(data):
            return []
        if position + 8 > len(data):
            return None
        count = struct.unpack("<q", data[position:position + 8])[0]
        for itemsize in (4, 2, 8, 1):
            rest = walk(position + 8 + count * itemsize) if count >= 0 else None
            if rest is not None:
                return [position, *rest]
        return None

    return [Field(p, 8, "<", "a storage's element count") for p in walk(start) or []]


# --- numpy -------------------------------------------------------------------------------------

def _npy(data: bytes, found: list[Field]) -> None:
    width = 2 if data[6] == 1 else 4
    found.append(Field(8, width, "<", "the .npy header's length"))
    length = int.from_bytes(data[8:8 + width], "little")
    header = data[8 + width:8 + width + length]
    for match in re.finditer(rb"\d+", header[header.find(b"shape"):]):
        found.append(Field(8 + width + header.find(b"shape") + match.start(),
                           len(match[0]), "text", "a .npy shape"))


# --- JSON --------------------------------------------------------------------------------------

_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|-?\d+(?![.eE\d])')


def _json(data: bytes, base: int, found: list[Field]) -> None:
    """Every integer in a JSON document (strings skipped)."""
    json.loads(data)  # a valid document only
    for match in _JSON_TOKEN.finditer(data):
        if not match[0].startswith(b'"'):
            found.append(Field(base + match.start(), len(match[0]), "text", "a JSON integer"))


# --- GGUF --------------------------------------------------------------------------------------

_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _gguf(data: bytes, found: list[Field]) -> None:
    position = 8

    def take(width: int, what: str) -> int:
        nonlocal position
        found.append(Field(position, width, "<", what))
        value = int.from_bytes(data[position:position + width], "little")
        position += width
        return value

    def string(what: str) -> None:
        nonlocal position
        length = take(8, f"{what}'s length")
        position += length

    def value(kind: int) -> None:
        nonlocal position
        if kind == 8:
            string("a string value")
        elif kind == 9:
            inner = take(4, "an array's element type")
            for _ in range(take(8, "an array's count")):
                value(inner)
        else:
            position += _GGUF_SIZES[kind]

    found.append(Field(4, 4, "<", "the GGUF version"))
    tensors, entries = take(8, "the tensor count"), take(8, "the metadata count")
    for _ in range(entries):
        string("a metadata key")
        value(take(4, "a metadata value's type"))
    for _ in range(tensors):
        string("a tensor name")
        for _ in range(take(4, "a tensor's dimensions")):
            take(8, "a tensor dimension")
        take(4, "a tensor's type")
        take(8, "a tensor's offset")


# --- msgpack -----------------------------------------------------------------------------------

#: msgpack header bytes followed by a big-endian length or count, and its width.
_MSGPACK_LENGTHS = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xDC: 2, 0xDD: 4,
                    0xDE: 2, 0xDF: 4, 0xC7: 1, 0xC8: 2, 0xC9: 4}
_MSGPACK_BYTES = (0xC4, 0xC5, 0xC6, 0xD9, 0xDA, 0xDB)  # bin and str: bytes follow
_MSGPACK_EXTENSIONS = (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8)  # a type byte follows
_MSGPACK_INTS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_MSGPACK_FLOATS = {0xCA: 4, 0xCB: 8}


def _msgpack(data: bytes, found: list[Field]) -> None:
    """Every length, count and integer of a msgpack document, read as one stream: the
    payload of an extension (a Flax array record) is msgpack too."""
    position = 0
    while position < len(data):
        first = data[position]
        position += 1
        if first in _MSGPACK_LENGTHS:
            width = _MSGPACK_LENGTHS[first]
            found.append(Field(position, width, ">", f"msgpack 0x{first:02x}'s length"))
            length = int.from_bytes(data[position:position + width], "big")
            position += width + (length if first in _MSGPACK_BYTES else 0)
        elif first in _MSGPACK_INTS:
            found.append(Field(position, _MSGPACK_INTS[first], ">", "a msgpack integer"))
            position += _MSGPACK_INTS[first]
        elif 0xA0 <= first <= 0xBF:
            position += first & 0x1F
        else:
            position += _MSGPACK_FLOATS.get(first, 0)
        if first in _MSGPACK_EXTENSIONS:
            position += 1


# --- protobuf (ONNX) ---------------------------------------------------------------------------

#: The ONNX messages walked into: (message, field number) to the field's message.
_SUBMESSAGES = {
    ("ModelProto", 7): "GraphProto", ("ModelProto", 8): "OperatorSetIdProto",
    ("GraphProto", 1): "NodeProto", ("GraphProto", 5): "TensorProto",
    ("GraphProto", 11): "ValueInfoProto", ("GraphProto", 12): "ValueInfoProto",
    ("GraphProto", 13): "ValueInfoProto", ("NodeProto", 5): "AttributeProto",
    ("AttributeProto", 5): "TensorProto", ("AttributeProto", 6): "GraphProto",
    ("AttributeProto", 10): "TensorProto", ("AttributeProto", 11): "GraphProto",
    ("TensorProto", 13): "StringStringEntryProto",
}


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if not byte & 0x80:
            return value, position


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _protobuf(data: bytes, start: int, end: int, message: str, found: list[Field]) -> None:
    position = start
    while position < end:
        tag, position = _read_varint(data, position)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, after = _read_varint(data, position)
            found.append(Field(position, after - position, "varint",
                               f"{message} field {number}"))
            position = after
        elif wire == 2:
            length, after = _read_varint(data, position)
            found.append(Field(position, after - position, "varint",
                               f"{message} field {number}'s length"))
            inner = _SUBMESSAGES.get((message, number))
            if inner is not None:
                _protobuf(data, after, after + length, inner, found)
            position = after + length
        else:
            position += 8 if wire == 1 else 4


# --- HDF5 --------------------------------------------------------------------------------------

def _hdf5(data: bytes, found: list[Field]) -> None:
    """The superblock's addresses, and every place an object's address or a dataset's data
    offset and size is written (found by their values, as h5py reports them)."""
    import h5py

    if data[8] == 0:  # superblock version 0: 8-byte addresses from byte 24
        found += [Field(offset, 8, "<", "a superblock address") for offset in (24, 32, 40, 48,
                                                                               64)]
    values: dict[int, str] = {}

    def visit(name: str, node: Any) -> None:
        values[h5py.h5o.get_info(node.id).addr] = f"'{name}' object header address"
        if isinstance(node, h5py.Dataset):
            offset = node.id.get_offset()
            if offset is not None:
                values[offset] = f"'{name}' data offset"
            values[node.id.get_storage_size()] = f"'{name}' data size"

    with h5py.File(io.BytesIO(data), "r") as file:
        file.visititems(visit)
    for value, what in values.items():
        if value < 64:  # too small a number to find by its bytes
            continue
        encoded = struct.pack("<Q", value)
        at = data.find(encoded)
        while at >= 0:
            found.append(Field(at, 8, "<", what))
            at = data.find(encoded, at + 1)
