"""Bounds before allocation: what a file claims is checked against what it holds, first.

Every length, count, shape, stride and offset a reader takes from a file goes through these
checks before anything is allocated or read: a length must fit in the bytes that exist, a
shape's bytes in the bytes stored for it, a view in its storage. Views are measured by their
extent, not their element count: a tensor of 2^30 elements with stride 0 over one byte is
one byte, and stays a view. Plain Python integers are used throughout: no product overflows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import CorruptCheckpointError, MissingDependencyError, brief, shown

__all__ = ["MAX_INDEX_BYTES", "MAX_NDIM", "MAX_NESTING", "MAX_RANKS", "check_fits",
           "check_length", "check_nesting", "check_shape", "check_view", "parse_json",
           "parse_yaml", "view_extent"]

#: More dimensions than this is no tensor (torch allows 64... in practice, far fewer).
MAX_NDIM = 64
#: An index larger than this is not one (a 70B model's weight map is about 100 KiB).
MAX_INDEX_BYTES = 64 * 1024 * 1024
#: How deep any structure decoded from a file may nest: pickled containers and calls, HDF5
#: groups, msgpack maps and arrays, ONNX subgraphs, JSON. Real checkpoints nest a few dozen
#: levels at most (a whole pickled model: about three per module level); this bound keeps
#: every walk of a decoded structure far inside Python's own recursion limit.
MAX_NESTING = 100
#: More ranks than this is no checkpoint torchgraft merges or writes.
MAX_RANKS = 4096


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_length(value: Any, *, available: int, what: str,
                 path: str | Path | None = None) -> int:
    """A length or count from a file: an integer from 0 to ``available``.

    Args:
        value: What the file says.
        available: The most it can be: the bytes left in the file, a configured cap.
        what: What it counts, for the message (``"the header length"``).
        path: The file, for the message.

    Returns:
        The length.

    Raises:
        CorruptCheckpointError: If it is not an integer, negative, or more than available.
    """
    if not _integer(value) or not 0 <= value <= available:
        raise CorruptCheckpointError(f"{what} is {shown(value, 40)}, where at most {available} "
                                     "can be: the file is truncated or lies", path=path)
    return int(value)


def check_shape(value: Any, *, what: str, path: str | Path | None = None) -> tuple[int, ...]:
    """A shape from a file: at most :data:`MAX_NDIM` non-negative integers.

    Args:
        value: What the file says (a list or tuple).
        what: Whose shape, for the message.
        path: The file, for the message.

    Returns:
        The shape as a tuple.

    Raises:
        CorruptCheckpointError: If it is not such a sequence.
    """
    if not isinstance(value, (list, tuple)) or len(value) > MAX_NDIM or not all(
            _integer(d) and d >= 0 for d in value):
        raise CorruptCheckpointError(f"{what} has a malformed shape {shown(value, 80)}", path=path)
    return tuple(int(d) for d in value)


def check_fits(shape: Sequence[int], itemsize: int, *, available: int, what: str,
               path: str | Path | None = None) -> int:
    """The bytes a dense tensor of ``shape`` needs, refused if more than ``available``.

    Args:
        shape: The shape (checked with :func:`check_shape` first).
        itemsize: Bytes per element.
        available: The bytes stored for it (or a cap).
        what: The tensor, for the message.
        path: The file, for the message.

    Returns:
        The number of bytes.

    Raises:
        CorruptCheckpointError: If they are more than available.
    """
    nbytes = math.prod(shape) * itemsize
    if nbytes > available:
        raise CorruptCheckpointError(
            f"{what} of shape {tuple(shape)} needs {nbytes} bytes, but only {available} are "
            "stored for it: the file is truncated or lies", path=path)
    return nbytes


def view_extent(shape: Sequence[int], stride: Sequence[int], offset: int, *, what: str,
                path: str | Path | None = None) -> int:
    """How many storage elements a strided view reaches: its last element's index + 1.

    Args:
        shape: The view's shape.
        stride: Its strides, in elements (0 repeats an element: no bytes are needed for it).
        offset: Its first element in the storage.
        what: The tensor, for the message.
        path: The file, for the message.

    Returns:
        The extent (0 for an empty view).

    Raises:
        CorruptCheckpointError: If the shape, strides or offset are malformed.
    """
    if len(shape) != len(stride) or len(shape) > MAX_NDIM or not _integer(offset) or \
            offset < 0 or not all(_integer(s) and s >= 0 for s in (*shape, *stride)):
        raise CorruptCheckpointError(f"tensor '{what}' has a malformed shape or stride",
                                     path=path)
    if 0 in shape:
        return 0
    return offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1


def check_view(shape: Sequence[int], stride: Sequence[int], offset: int, numel: int, *,
               what: str, source: str | Path | None = None) -> None:
    """Check, before anything is read or allocated, that a view stays inside its storage.

    Args:
        shape: The tensor's shape.
        stride: Its strides, in elements.
        offset: Its offset in the storage, in elements.
        numel: The storage's size, in elements of the view's dtype.
        what: The tensor's name, for the error message.
        source: The file, for the error message.

    Raises:
        CorruptCheckpointError: If the shape or strides are malformed, or the view reaches
            outside the storage.
    """
    extent = view_extent(shape, stride, offset, what=what, path=source)
    if extent > numel:
        raise CorruptCheckpointError(
            f"tensor '{what}' of shape {tuple(shape)} reaches element {extent - 1} of a "
            f"storage with {numel}", path=source)


def check_nesting(depth: int, *, what: str, path: str | Path | None = None) -> None:
    """Refuse a structure nested deeper than :data:`MAX_NESTING` (every decoder's one bound).

    Args:
        depth: How deep the structure is at this point (the top is 0 or 1).
        what: What nests, for the message (``"HDF5 groups"``).
        path: The file, for the message.

    Raises:
        CorruptCheckpointError: If ``depth`` is more than :data:`MAX_NESTING`.
    """
    if depth > MAX_NESTING:
        raise _too_deep(what, path)


def _too_deep(what: str, path: str | Path | None) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{what} nest deeper than {MAX_NESTING} levels, which no "
                                  "real file of its kind does: it is damaged or forged",
                                  path=path)


def parse_json(data: bytes | str, *, what: str, path: str | Path | None = None) -> Any:
    """Parse JSON from a file, its nesting bounded by :data:`MAX_NESTING`.

    Args:
        data: The document (already bounded in size by the caller).
        what: The document, for the message (``"config.json"``).
        path: The file, for the message.

    Returns:
        The parsed value.

    Raises:
        CorruptCheckpointError: If it is not UTF-8 JSON, or nests too deeply.
    """
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep(f"{what}'s arrays and objects", path) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CorruptCheckpointError(f"{what} is not valid JSON ({brief(exc)})",
                                     path=path) from None
    # level by level (json makes plain dicts and lists): a safetensors header of 100k tensors
    # is 300k containers, walked in one comprehension per level, not a generator per node
    level = [value] if type(value) in (dict, list) else []
    depth = 0
    while level:
        depth += 1
        check_nesting(depth, what=f"{what}'s arrays and objects", path=path)
        level = [child for node in level
                 for child in (node.values() if type(node) is dict else node)
                 if type(child) is dict or type(child) is list]
    return value


def _yaml_values(text: str, *, what: str, path: str | Path | None) -> int:
    """How many values a YAML document stands for, each alias counted as what it repeats.

    One pass over the parser's events (the parser keeps its own stack: no recursion), before
    anything is built: nesting is checked at each opening, an alias adds the size of what its
    anchor holds, and an alias to a collection still open (a recursive one) is refused.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    open_: list[list[Any]] = []  # per open collection: its anchor, and its values so far
    sizes: dict[str, int] = {}  # per anchor: the values it stands for
    total = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_.append([event.anchor, 1])
            check_nesting(len(open_), what=f"{what}'s lists and mappings", path=path)
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, count = open_.pop()
            if anchor is not None:
                sizes[anchor] = count
        elif isinstance(event, yaml.ScalarEvent):
            count = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:  # undefined, or an alias inside its own anchor
                raise CorruptCheckpointError(
                    f"{what} uses alias *{shown(event.anchor, 40)} inside what it names or "
                    "before it is defined", path=path)
            count = sizes[event.anchor]
        else:
            continue
        if open_:
            open_[-1][1] += count
        else:
            total += count
        if total > len(text) or (open_ and open_[-1][1] > len(text)):
            raise CorruptCheckpointError(
                f"{what}'s aliases repeat its values more times than it has characters "
                f"({len(text)}): a YAML alias bomb; write the values out", path=path)
    return total


def parse_yaml(text: str, *, what: str, path: str | Path | None = None) -> Any:
    """Parse a YAML document safely (no Python tags), its size once expanded bounded.

    YAML's aliases repeat what an anchor holds: nine lines can stand for 10^9 values, which
    building, walking or printing would never finish. A document may stand for at most as
    many values as it has characters (a document without aliases always does), and nest at
    most :data:`MAX_NESTING` levels; both are checked on the parser's events before anything
    is built.

    Args:
        text: The document (already bounded in size by the caller).
        what: The document, for the message (``"the rules file"``).
        path: The file, for the message.

    Returns:
        The parsed value.

    Raises:
        MissingDependencyError: If PyYAML is not installed.
        CorruptCheckpointError: If it is not valid YAML, expands too far or nests too deeply.
    """
    try:
        import yaml
    except ImportError:
        raise MissingDependencyError("yaml", extra="yaml", feature=f"YAML ({what})") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _yaml_values(text, what=what, path=path)
        return yaml.load(text, Loader=loader)  # a safe loader: no Python tags
    except yaml.YAMLError as exc:
        raise CorruptCheckpointError(f"{what} is not valid YAML ({brief(exc)})",
                                     path=path) from None
