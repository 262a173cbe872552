"""ONNX models: the graph's initializers, read lazily by offset, named as PyTorch named them.

The protobuf is walked here field by field with positioned reads (no ``onnx`` package, which
would read every weight into memory to parse the message): each initializer's ``raw_data`` is
only located, then memory-mapped on read; weights in external data files are read by their
``location``/``offset``/``length``, which must stay inside the model's folder and the file.

Exporters rename some weights: ``torch.onnx.export`` turns a bias-free Linear into a MatMul on a
transposed copy named ``onnx::MatMul_123``, and a convolution's weight into ``onnx::Conv_7``.
The graph says what each initializer is: the node that consumes it (``/encoder/fc1/MatMul``)
gives the module path, and its operator and input slot give the leaf name and layout
(:data:`ROLES`), so the weight comes back as ``encoder.fc1.weight``, transposed back.
Initializers that no weight role or PyTorch-like name claims (shape constants) are left out and
listed in the metadata.

The dynamo exporter names initializers by their state-dict keys, but folds some: a Linear
applied to a 3-D input becomes a MatMul on a transposed copy named ``val_4``. It records in each
node's metadata the modules that ran it (``pkg.torch.onnx.name_scopes``): the innermost names
the copy's module the way a TorchScript node's path does. What consumes an initializer also
says what it is, whatever its name: a 2-D table a ``Gather`` looks rows up in is an embedding
(the metadata's ``kinds``, which grafting counts as a module kind).

Control flow keeps graphs inside nodes: the ``then_branch``/``else_branch`` of an ``If``, the
``body`` of a ``Loop`` or ``Scan`` (attributes of type GRAPH or GRAPHS). Their initializers are
read like the main graph's and their nodes name the weights they use, the main graph's too
(TorchScript's exporter leaves ``a.weight``'s transposed copy in the main graph, used by
``/a/MatMul`` inside a branch). Values passed on through ``Identity`` nodes count as used
where their copies are: the first node in graph order that uses a value or a copy of it in a
weight role names it, found for every value in one pass over the graph. Subgraphs nest at
most :data:`~torchgraft.bounds.MAX_NESTING` deep.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..bounds import MAX_NDIM, check_nesting, check_shape
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..meta import TensorMeta, TensorRef
from .base import Contents, Format, ReadOptions
from .contain import contained
from .framework import relaid
from .source import ByteSource, FileSource, MemorySource

__all__ = ["FORMAT", "ROLES"]

#: TensorProto.DataType to torch dtype.
_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 4: torch.uint16, 5: torch.int16,
           6: torch.int32, 7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64,
           12: torch.uint32, 13: torch.uint64, 16: torch.bfloat16}
#: Typed (non-raw) data fields: TensorProto field number to numpy dtype of packed fixed-size
#: values (float_data, double_data), or ``None`` for varints (int32_data, int64_data,
#: uint64_data), which hold the values of the smaller integer and 16-bit float types too.
_TYPED_FIELDS: dict[int, str | None] = {4: "<f4", 10: "<f8", 5: None, 7: None, 11: None}

#: (operator, input slot) to the PyTorch leaf name of the initializer there and its layout op.
#: A Gemm's weight is transposed unless the node says ``transB=1``.
ROLES: dict[tuple[str, int], tuple[str, str | None]] = {
    ("MatMul", 1): ("weight", "transpose"),
    ("Gemm", 1): ("weight", "transpose"), ("Gemm", 2): ("bias", None),
    ("Conv", 1): ("weight", None), ("Conv", 2): ("bias", None),
    ("ConvTranspose", 1): ("weight", None), ("ConvTranspose", 2): ("bias", None),
    ("BatchNormalization", 1): ("weight", None), ("BatchNormalization", 2): ("bias", None),
    ("BatchNormalization", 3): ("running_mean", None),
    ("BatchNormalization", 4): ("running_var", None),
    ("LayerNormalization", 1): ("weight", None), ("LayerNormalization", 2): ("bias", None),
    ("Gather", 0): ("weight", None),
    ("Add", 0): ("bias", None), ("Add", 1): ("bias", None),
}
#: An initializer already named as a PyTorch state-dict key keeps its name.
_TORCH_NAME = re.compile(r"[A-Za-z_]\w*(\.\w+)+")
_MAX_VARINT = 10
#: Nodes up to this size are read whole, then walked in memory; bigger ones (a subgraph holding
#: weights) are walked in place.
_MAX_NODE_BYTES = 1 << 20
#: AttributeProto fields holding graphs: ``g`` (GRAPH) and ``graphs`` (GRAPHS).
_GRAPH_FIELDS = (6, 11)
_MAX_TYPED_BYTES = 64 << 20


class _Fields:
    """The fields of one protobuf message in ``[start, end)`` of a source, read on demand."""

    def __init__(self, source: ByteSource, start: int, end: int) -> None:
        self.source, self.start, self.end = source, start, end

    def _varint(self, pos: int) -> tuple[int, int]:
        raw = self.source.read(pos, min(_MAX_VARINT, self.end - pos), what="a protobuf varint")
        value = 0
        for i, byte in enumerate(raw):
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                return value, pos + i + 1
        raise CorruptCheckpointError(f"malformed protobuf varint at byte {pos}",
                                     path=self.source.name)

    def __iter__(self) -> Any:
        """Yield ``(field number, wire type, value)``: a varint, else ``(offset, length)``."""
        pos = self.start
        while pos < self.end:
            tag, pos = self._varint(pos)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                value, pos = self._varint(pos)
                yield number, wire, value
                continue
            if wire == 2:
                length, pos = self._varint(pos)
            elif wire in (1, 5):
                length = 8 if wire == 1 else 4
            else:
                raise CorruptCheckpointError(f"protobuf wire type {wire} at byte {pos}",
                                             path=self.source.name)
            if pos + length > self.end:
                raise CorruptCheckpointError(
                    f"a protobuf field at byte {pos} claims {length} bytes, past the end of its "
                    f"message at byte {self.end}", path=self.source.name)
            yield number, wire, (pos, length)
            pos += length

    def text(self, span: tuple[int, int], what: str) -> str:
        try:
            return self.source.read(*span, what=what).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(f"{what} is not UTF-8", path=self.source.name) from None

    def sub(self, span: tuple[int, int]) -> _Fields:
        return _Fields(self.source, span[0], span[0] + span[1])


@dataclass
class _Tensor:
    name: str = ""
    dims: list[int] = field(default_factory=list)
    dtype: int = 0
    raw: tuple[int, int] | None = None
    typed: tuple[int, tuple[int, int]] | None = None
    external: dict[str, str] = field(default_factory=dict)
    location: int = 0


def _varints(raw: bytes) -> list[int]:
    values, value, shift = [], 0, 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            values.append(value)
            value, shift = 0, 0
    return values


def _packed_dims(tensor: _Tensor, fields: _Fields, span: tuple[int, int]) -> None:
    if span[1] > _MAX_VARINT * MAX_NDIM:
        raise CorruptCheckpointError(f"a tensor's dims take {span[1]} bytes: more than "
                                     f"{MAX_NDIM} dimensions", path=fields.source.name)
    tensor.dims.extend(_varints(fields.source.read(*span, what="tensor dims")))


def _external_entry(tensor: _Tensor, fields: _Fields, span: tuple[int, int]) -> None:
    """One ``external_data`` key/value pair (``location``, ``offset``, ``length``)."""
    entry = {n: fields.sub(v) for n, w, v in fields.sub(span) if w == 2}
    if 1 in entry and 2 in entry:
        key = entry[1].text((entry[1].start, entry[1].end - entry[1].start), "a key")
        tensor.external[key] = entry[2].text(
            (entry[2].start, entry[2].end - entry[2].start), "an external data value")


#: Reads one TensorProto field into a :class:`_Tensor`: (tensor, the message, the value).
_Read = Callable[[_Tensor, _Fields, Any], None]


def _typed_field(number: int) -> _Read:
    def read(tensor: _Tensor, fields: _Fields, span: Any) -> None:
        tensor.typed = (number, span)
    return read

#: TensorProto fields read, by (field number, wire type): dims (one by one, or packed),
#: data_type, name, raw_data, the typed data fields, external_data, data_location.
_TENSOR_FIELDS: dict[tuple[int, int], _Read] = {
    (1, 0): lambda tensor, fields, value: tensor.dims.append(value),
    (1, 2): _packed_dims,
    (2, 0): lambda tensor, fields, value: setattr(tensor, "dtype", value),
    (8, 2): lambda tensor, fields, span: setattr(tensor, "name",
                                                 fields.text(span, "a tensor name")),
    (9, 2): lambda tensor, fields, span: setattr(tensor, "raw", span),
    **{(number, 2): _typed_field(number) for number in _TYPED_FIELDS},
    (13, 2): _external_entry,
    (14, 0): lambda tensor, fields, value: setattr(tensor, "location", value),
}


def _tensor(fields: _Fields) -> _Tensor:
    """A TensorProto, its fields read by :data:`_TENSOR_FIELDS`."""
    tensor = _Tensor()
    for number, wire, value in fields:
        read = _TENSOR_FIELDS.get((number, wire))
        if read is not None:
            read(tensor, fields, value)
    return tensor


@dataclass
class _Node:
    op: str = ""
    name: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    ints: dict[str, int] = field(default_factory=dict)
    #: Where its subgraphs are in the file: (offset, length).
    graphs: list[tuple[int, int]] = field(default_factory=list)
    #: The module that ran it, where the exporter says so (``torch.onnx.export(dynamo=True)``
    #: records each node's module scopes in its metadata).
    scope: str | None = None


#: The metadata in which the dynamo exporter lists a node's scopes, outermost first: the
#: modules that ran it (full paths, the root ``''``), then the node itself.
_SCOPES = "pkg.torch.onnx.name_scopes"
#: A node's scopes longer than this are no module path (read no further).
_MAX_SCOPES = 1 << 16
_QUOTED = re.compile(r"'([^'\\]*)'")


def _metadata(node: _Node, fields: _Fields) -> None:
    """One metadata entry: the module a dynamo export says ran the node (its innermost)."""
    entry = {n: v for n, w, v in fields if w == 2 and n in (1, 2)}
    if 1 not in entry or 2 not in entry or entry[2][1] > _MAX_SCOPES or \
            entry[1][1] != len(_SCOPES) or fields.text(entry[1], "a metadata key") != _SCOPES:
        return
    scopes = _QUOTED.findall(fields.text(entry[2], "a node's scopes"))
    node.scope = scopes[-2] if len(scopes) >= 2 and scopes[-2] else None


def _attribute(node: _Node, fields: _Fields, base: int) -> None:
    """An attribute's integer value (``transB``) and its subgraphs' spans in the file."""
    name, value = "", None
    for number, wire, found in fields:
        if number == 1 and wire == 2:
            name = fields.text(found, "an attribute name")
        elif number == 3 and wire == 0:
            value = found
        elif number in _GRAPH_FIELDS and wire == 2:
            node.graphs.append((base + found[0], found[1]))
    if name and value is not None:
        node.ints[name] = value


#: NodeProto fields read as text: the list they go to, and what they are.
_NODE_TEXT = {1: ("inputs", "a node input"), 2: ("outputs", "a node output")}


def _node(fields: _Fields, base: int) -> _Node:
    """A NodeProto; ``base`` is the file offset of ``fields``' source (read into memory)."""
    node = _Node()
    for number, wire, value in fields:
        if wire != 2:
            continue
        if number in _NODE_TEXT:
            names, what = _NODE_TEXT[number]
            getattr(node, names).append(fields.text(value, what))
        elif number == 3:
            node.name = fields.text(value, "a node name")
        elif number == 4:
            node.op = fields.text(value, "an operator")
        elif number == 5:
            _attribute(node, fields.sub(value), base)
        elif number == 9:
            _metadata(node, fields.sub(value))
    return node


def _read_node(source: FileSource, span: tuple[int, int]) -> _Node:
    """A node read whole when small, else walked where it is."""
    if span[1] > _MAX_NODE_BYTES:
        return _node(_Fields(source, span[0], span[0] + span[1]), 0)
    data = source.read(*span, what="a graph node")
    return _node(_Fields(MemorySource(data, source.name), 0, len(data)), span[0])


def _walk(graph: _Fields, source: FileSource, found: tuple[list[_Tensor], list[_Node]],
          depth: int) -> None:
    """Collect a graph's initializers and nodes, and those of its nodes' subgraphs."""
    check_nesting(depth, what="ONNX subgraphs (If/Loop/Scan bodies)", path=source.name)
    tensors, nodes = found
    for number, wire, value in graph:
        if wire != 2:
            continue
        if number == 5:
            tensors.append(_tensor(graph.sub(value)))
        elif number == 1:
            node = _read_node(source, value)
            nodes.append(node)
            for span in node.graphs:
                _walk(_Fields(source, span[0], span[0] + span[1]), source, found, depth + 1)


def _graph(source: FileSource) -> tuple[list[_Tensor], list[_Node]]:
    model = _Fields(source, 0, source.size)
    graphs = [v for n, w, v in model if n == 7 and w == 2]
    if not graphs:
        raise CorruptCheckpointError("the ONNX model has no graph", path=source.name)
    found: tuple[list[_Tensor], list[_Node]] = ([], [])
    _walk(model.sub(graphs[-1]), source, found, 0)
    return found


def _module_path(node: _Node) -> str | None:
    """``/encoder/fc1/MatMul`` to ``encoder.fc1``; ``None`` for names without a path."""
    if not node.name.startswith("/"):
        return None
    parts = node.name.strip("/").split("/")[:-1]
    return ".".join(parts) if parts else None


def _roles(node: _Node) -> tuple[str | None, bool]:
    """The module a node's weights belong to, and whether only its scope says so.

    TorchScript's exporter names a node by its module path (``/encoder/fc1/MatMul``); the
    dynamo exporter records the module in the node's metadata (:func:`_metadata`). There, an
    ``Add`` of a constant (a mask, a scalar the graph folded) is no bias: only weight slots
    that no computation folds into (a MatMul's or a Gemm's matrix, a convolution's, a norm's,
    a lookup table) name the initializer they read.
    """
    path = _module_path(node)
    return (path, False) if path is not None else (node.scope, node.scope is not None)


def _first_uses(nodes: list[_Node]) -> dict[str, tuple[_Node, int]]:
    """Each value to the first node (and input slot) that uses it in a weight role.

    A value passed on by ``Identity`` nodes is used where its copies are. One pass: nodes in
    graph order claim the value in each role slot and, back through the ``Identity`` nodes
    that made it, every value it is a copy of; a value claimed once is never walked again,
    so a graph of long ``Identity`` chains costs its size, not its size squared.
    """
    sources = _copied_from(nodes)
    first: dict[str, tuple[_Node, int]] = {}
    for node in nodes:
        path, by_scope = _roles(node)
        if node.op == "Identity" or path is None or (by_scope and node.op == "Add"):
            continue
        for slot, name in enumerate(node.inputs):
            if (node.op, slot) not in ROLES:
                continue
            stack = [name]
            while stack:
                value = stack.pop()
                if value not in first:
                    first[value] = (node, slot)
                    stack.extend(sources.get(value, ()))
    return first


def _copied_from(nodes: list[_Node]) -> dict[str, list[str]]:
    """An ``Identity`` node's output to its inputs."""
    sources: dict[str, list[str]] = {}
    for node in nodes:
        if node.op == "Identity":
            for out in node.outputs:
                sources.setdefault(out, []).extend(node.inputs)
    return sources


def _tables(nodes: list[_Node]) -> set[str]:
    """The values a ``Gather`` looks rows up in (its data, along axis 0), copies included.

    What consumes a tensor says what it is, whatever its name: a 2-D table whose rows a
    ``Gather`` picks is an embedding (:func:`_open` gives it that kind). A gather along
    another axis, or from a tensor of another rank, is no embedding's lookup.
    """
    sources = _copied_from(nodes)
    found: set[str] = set()
    stack = [node.inputs[0] for node in nodes if node.op == "Gather" and node.inputs
             and node.ints.get("axis", 0) == 0]
    while stack:
        value = stack.pop()
        if value not in found:
            found.add(value)
            stack.extend(sources.get(value, ()))
    return found


def _recovered(tensor: _Tensor, use: tuple[_Node, int] | None) -> tuple[str, str | None] | None:
    """The PyTorch name and layout op the graph gives an initializer, or ``None``."""
    if use is None:
        return None
    node, slot = use
    leaf, op = ROLES[(node.op, slot)]
    if node.op == "Gemm" and slot == 1 and node.ints.get("transB", 0):
        op = None
    if op == "transpose" and len(tensor.dims) != 2:
        return None
    return f"{_roles(node)[0]}.{leaf}", op


class _Files:
    """External data files, opened once each, only inside the model's folder."""

    def __init__(self, model: Path, options: ReadOptions) -> None:
        self.model = model
        self.follow_links = options.follow_links
        self.open: dict[str, FileSource] = {}

    def get(self, location: str, name: str) -> FileSource:
        if location not in self.open:
            target = contained(self.model.parent, location, named_by=self.model,
                               what=f"external data of '{name}'",
                               follow_links=self.follow_links)
            if not target.is_file():
                raise CorruptCheckpointError(f"external data file '{location}' of '{name}' is "
                                             "missing: copy it beside the model",
                                             path=self.model)
            self.open[location] = FileSource(target)
        return self.open[location]

    def close(self) -> None:
        for source in self.open.values():
            source.close()


def _int(text: str, what: str, path: Path) -> int:
    if not text.isdigit():
        raise CorruptCheckpointError(f"{what} is {text!r}, not a number", path=path)
    return int(text)


def _ref(tensor: _Tensor, source: FileSource, files: _Files, path: Path) -> TensorRef:
    name = tensor.name
    if tensor.dtype not in _DTYPES:
        raise UnsupportedCheckpointError(f"initializer '{name}' has ONNX data type "
                                         f"{tensor.dtype}, not read yet", path=path)
    dtype = _DTYPES[tensor.dtype]
    shape = check_shape(tensor.dims, what=f"initializer '{name}'", path=path)
    meta = TensorMeta.of(shape, dtype)
    what = f"initializer '{name}'"
    if tensor.location == 1:
        location = tensor.external.get("location", "")
        data = files.get(location, name)
        offset = _int(tensor.external.get("offset", "0"), f"the offset of '{name}'", path)
        length = _int(tensor.external.get("length", str(meta.nbytes)),
                      f"the length of '{name}'", path)
        origin: ByteSource = data
    elif tensor.raw is not None:
        offset, length = tensor.raw
        origin = source
    elif tensor.typed is not None or meta.numel == 0:
        return _typed(tensor, meta, source, path)
    else:
        raise CorruptCheckpointError(f"{what} holds no data", path=path)
    if length != meta.nbytes:
        raise CorruptCheckpointError(f"{what} says {dtype} {shape} ({meta.nbytes} bytes) but "
                                     f"holds {length}", path=path)
    origin.check_range(offset, length, what=what)
    file_source = origin if isinstance(origin, FileSource) else source

    def read() -> torch.Tensor:
        return file_source.array(offset, length, dtype, what=what).view(shape)

    def read_into(out: torch.Tensor) -> None:
        file_source.read_into(offset, out, what=what)

    return TensorRef(meta, read, read_into, span=lambda: (file_source.held_name(), offset))


def _typed(tensor: _Tensor, meta: TensorMeta, source: FileSource, path: Path) -> TensorRef:
    """An initializer stored in a typed field (small constants): decoded when read."""
    if tensor.typed is None:
        return TensorRef(meta, lambda: torch.empty(meta.shape, dtype=meta.dtype))
    number, span = tensor.typed
    if span[1] > _MAX_TYPED_BYTES:
        raise UnsupportedCheckpointError(f"initializer '{tensor.name}' keeps {span[1]} bytes in "
                                         "a typed field; re-save the model with raw data",
                                         path=path)
    fixed = _TYPED_FIELDS[number]

    def read() -> torch.Tensor:
        raw = source.read(*span, what=f"initializer '{tensor.name}'")
        values = (np.frombuffer(raw, dtype=fixed) if fixed is not None
                  else np.array(_varints(raw), dtype=np.uint64))
        if values.size != meta.numel:
            raise CorruptCheckpointError(f"initializer '{tensor.name}' holds {values.size} "
                                         f"values for shape {meta.shape}", path=path)
        if fixed is None and meta.dtype in (torch.float16, torch.bfloat16):
            bits = torch.from_numpy(values.astype(np.int32)).to(torch.int16)
            return bits.view(meta.dtype).reshape(meta.shape)
        if fixed is None and meta.dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
            values = values.view(np.int64)
        return torch.from_numpy(values.copy()).to(meta.dtype).reshape(meta.shape)

    return TensorRef(meta, read)


def _open(path: Path, options: ReadOptions) -> Contents:
    source = FileSource(path)
    files = _Files(path, options)
    tensors, nodes = _graph(source)
    root: dict[str, Any] = {}
    constants: list[str] = []
    renamed: dict[str, str] = {}
    kinds: dict[str, str] = {}
    uses = _first_uses(nodes)
    tables = _tables(nodes)
    named = _named(tensors, uses)
    for tensor in tensors:
        if tensor.name not in named:
            constants.append(tensor.name)
            continue
        name, op = named[tensor.name]
        if name in root:
            raise CorruptCheckpointError(f"initializers '{renamed.get(name, name)}' and "
                                         f"'{tensor.name}' both name '{name}'", path=path)
        root[name] = relaid(_ref(tensor, source, files, path), op, name=tensor.name,
                            path=str(path))
        if name != tensor.name:
            renamed[name] = tensor.name
        if tensor.name in tables and len(tensor.dims) == 2:
            kinds[name] = "embedding"
    root["__metadata__"] = {"framework": "onnx", "renamed_from_graph": renamed,
                            "constants_left_out": constants, "kinds": kinds}
    return Contents("onnx", path, root, [source.close, files.close])


def _named(tensors: list[_Tensor], uses: dict[str, tuple[_Node, int]],
           ) -> dict[str, tuple[str, str | None]]:
    """Each initializer's PyTorch name and layout op, for those that have one.

    An initializer named as a state-dict key keeps its name; else the node using it names it
    (:func:`_recovered`). A name only a dynamo export's scopes give (a folded copy of a
    weight) is taken only where no other initializer has it or is given it so: else those
    copies are constants.
    """
    named: dict[str, tuple[str, str | None]] = {}
    kept = {t.name for t in tensors if _TORCH_NAME.fullmatch(t.name)}
    by_scope: dict[str, list[str]] = {}
    for tensor in tensors:
        use = uses.get(tensor.name)
        recovered = _recovered(tensor, use)
        if tensor.name in kept:
            named[tensor.name] = (tensor.name, None)
        elif recovered is not None and use is not None and _roles(use[0])[1]:
            by_scope.setdefault(recovered[0], []).append(tensor.name)
            named[tensor.name] = recovered
        elif recovered is not None:
            named[tensor.name] = recovered
    for name, claims in by_scope.items():
        if name in kept or len(claims) > 1:
            for claim in claims:
                del named[claim]
    return named


def _magic(head: bytes) -> bool:
    """A ModelProto starts with ir_version (field 1, a small varint), then another field."""
    return (len(head) > 3 and head[0] == 0x08 and 3 <= head[1] <= 30
            and head[2] in (0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42))


FORMAT = Format(name="onnx", open=_open, suffixes=(".onnx",), magic=_magic)
