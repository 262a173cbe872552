"""Keras and TensorFlow weights in HDF5, read with h5py, never TensorFlow.

Keras 3 ``.keras`` / ``.weights.h5``, and the legacy tf.keras ``.h5`` that transformers writes
as ``tf_model.h5``.

Keras 3 stores each layer's variables by position (``layers/dense_1/vars/0``); the group's
key is the layer class in snake case, which says what each position holds
(:data:`KERAS3_VARIABLES`). The legacy format names them (``dense/kernel:0``) and lists layers
in order in ``layer_names``. Either way the names are then translated by one table
(:data:`LEAVES`): a Dense ``kernel [in, out]`` becomes a transposed ``weight``, a convolution's
``HWIO`` kernel an ``OIHW`` one, BatchNormalization's ``gamma/beta/moving_mean/
moving_variance`` become ``weight/bias/running_mean/running_var``, attention projections
``[hidden, heads, dim]`` become Linear weights.

Contiguous uncompressed datasets (what Keras writes) are memory-mapped at the offset HDF5
reports; others are read through h5py. Data is read only from the file's own storage
(contiguous, chunked or compact): a dataset with *external storage* (its bytes in another
file it names), a virtual dataset (mapped from other files) and an external link (a group
member in another file) are refused before h5py is asked for their data. The group walk is
size-limited and nests at most :data:`~torchgraft.bounds.MAX_NESTING` deep.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..bounds import check_nesting, parse_json
from ..errors import CorruptCheckpointError, UnsupportedCheckpointError, brief, shown
from ..meta import TensorMeta, TensorRef, torch_dtype_of_numpy
from .base import Contents, Format, ReadOptions, closed_on_error
from .framework import (
    ATTENTION_PROJECTIONS,
    Leaf,
    import_optional,
    record_head_dim,
    relaid,
    torch_layout,
)
from .source import FileSource, FileTensor
from .torch_zip import first_zip_entry, read_member, zip_data_offset
from .window import Window, WindowStream

__all__ = ["FORMAT", "KERAS3_KINDS", "KERAS3_VARIABLES", "KERAS_ARCHIVE_FORMAT", "LEAVES"]

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_KERAS_MEMBERS = ("metadata.json", "config.json", "model.weights.h5")
_MAX_GROUPS = 100_000
_MAX_CONFIG = 64 << 20
#: A compressed dataset may not claim more than this many times the file's size.
_MAX_RATIO = 1100

_CONV = ("transpose", "channels_last_kernel")
#: Keras leaf names to PyTorch's, with layout operations by number of dimensions.
LEAVES = (
    Leaf("kernel", "weight", ((3, "heads_in"),), parent=ATTENTION_PROJECTIONS),
    Leaf("kernel", "weight", ((3, "heads_out"),), parent=r"attention_output"),
    Leaf("bias", "bias", ((2, "flatten"),), parent=ATTENTION_PROJECTIONS),
    Leaf("kernel", "weight", ((2, "transpose"), (3, _CONV[1]), (4, _CONV[1]), (5, _CONV[1]))),
    Leaf("depthwise_kernel", "weight", ((3, "depthwise_kernel"), (4, "depthwise_kernel"))),
    Leaf("bias", "bias"),
    Leaf("gamma", "weight"), Leaf("beta", "bias"),
    Leaf("moving_mean", "running_mean"), Leaf("moving_variance", "running_var"),
    Leaf("embeddings", "weight"),
)

#: Keras 3 layer classes (their group key, snake case, without a ``_N`` suffix) to the names
#: of their variables by position.
KERAS3_VARIABLES: dict[str, tuple[str, ...]] = {
    "dense": ("kernel", "bias"), "einsum_dense": ("kernel", "bias"),
    "query_dense": ("kernel", "bias"), "key_dense": ("kernel", "bias"),
    "value_dense": ("kernel", "bias"), "output_dense": ("kernel", "bias"),
    "conv1d": ("kernel", "bias"), "conv2d": ("kernel", "bias"), "conv3d": ("kernel", "bias"),
    "conv1d_transpose": ("kernel", "bias"), "conv2d_transpose": ("kernel", "bias"),
    "conv3d_transpose": ("kernel", "bias"),
    "depthwise_conv1d": ("depthwise_kernel", "bias"),
    "depthwise_conv2d": ("depthwise_kernel", "bias"),
    "batch_normalization": ("gamma", "beta", "moving_mean", "moving_variance"),
    "layer_normalization": ("gamma", "beta"),
    "group_normalization": ("gamma", "beta"),
    "rms_normalization": ("scale",),
    "embedding": ("embeddings",),
}
#: Sub-layers whose order of use differs from their keys' order.
_CHILD_ORDER = {"multi_head_attention": ("query_dense", "key_dense", "value_dense",
                                         "output_dense")}
_SUFFIX = re.compile(r"_\d+$")


def _h5py() -> Any:
    return import_optional("h5py", extra="keras", feature="Reading Keras/TensorFlow .h5 files")


def _own_storage(dataset: Any, name: str, path: str) -> None:
    """Refuse a dataset whose bytes are not in this file: external storage, virtual."""
    h5d = _h5py().h5d
    plist = dataset.id.get_create_plist()
    if plist.get_layout() not in (h5d.CONTIGUOUS, h5d.CHUNKED, h5d.COMPACT):
        raise UnsupportedCheckpointError(
            f"'{name}' is a virtual dataset, mapped from other files: torchgraft reads data "
            "only from the file's own storage; save the weights into one file", path=path)
    if plist.get_external_count():
        target = plist.get_external(0)[0]
        raise UnsupportedCheckpointError(
            f"'{name}' keeps its bytes in another file ({shown(target, 120)}, HDF5 external "
            "storage): torchgraft reads data only from the file's own storage, never from "
            "where a file points; save the weights into one file", path=path)


def _member(group: Any, key: str, path: str) -> Any:
    """``group[key]``, refusing an external link (a member in another file) on its way."""
    h5py = _h5py()
    node = group
    for part in (p for p in key.split("/") if p):
        link = node.get(part, getlink=True)
        if link is None:
            raise CorruptCheckpointError(f"'{node.name}' has no member '{part}'", path=path)
        if not isinstance(link, (h5py.HardLink, h5py.SoftLink)):
            raise UnsupportedCheckpointError(
                f"'{node.name}/{part}' is a link into another file "
                f"({shown(getattr(link, 'filename', '?'), 120)}): torchgraft reads only the file "
                "it is given", path=path)
        node = node[part]
    return node


def _linked(group: Any, key: str) -> bool:
    """Whether ``group`` has a member ``key``, its link not followed (``in`` follows it)."""
    return group.get(key, getlink=True) is not None


def _weights_group(file: Any, path: str) -> Any:
    """tf.keras full-model files keep the weights in ``model_weights``; others at the top."""
    return _member(file, "model_weights", path) if _linked(file, "model_weights") else file


def _dataset_ref(dataset: Any, source: FileSource | None, base: int, name: str,
                 path: str) -> TensorRef:
    """A lazy tensor over an HDF5 dataset: mapped in place when contiguous, else via h5py."""
    if not isinstance(dataset, _h5py().Dataset):
        raise CorruptCheckpointError(f"'{name}' is a group, not a dataset of weights", path=path)
    _own_storage(dataset, name, path)
    dtype = dataset.dtype
    torch_dtype = torch_dtype_of_numpy(dtype)
    if torch_dtype is None:
        raise UnsupportedCheckpointError(f"'{name}' has dtype {dtype}, which torch lacks",
                                         path=path)
    shape = tuple(int(d) for d in dataset.shape)
    meta = TensorMeta.of(shape, torch_dtype)
    offset = dataset.id.get_offset()
    plain = (offset is not None and dataset.compression is None and not dataset.chunks
             and dtype.isnative)
    if plain and source is not None:
        start = base + int(offset)
        source.check_range(start, meta.nbytes, what=f"'{name}'")
        return FileTensor(source, start, meta, what=f"'{name}'")
    limit = _MAX_RATIO * max(source.size if source is not None else 0, 1 << 20)
    if meta.nbytes > limit:
        raise CorruptCheckpointError(f"'{name}' claims {shape} ({meta.nbytes} bytes), more than "
                                     "the file can hold even compressed", path=path)

    def read_h5() -> torch.Tensor:
        with hdf5_faults(path):
            value = np.asarray(dataset[()])
        return torch.from_numpy(value.astype(dtype.newbyteorder("="), copy=True))

    return TensorRef(meta, read_h5)


def _children(group: Any, counter: list[int], path: str) -> list[tuple[str, Any]]:
    counter[0] += len(group)
    if counter[0] > _MAX_GROUPS:
        raise CorruptCheckpointError(f"more than {_MAX_GROUPS} HDF5 groups", path=path)
    keys = list(group.keys())
    order = _CHILD_ORDER.get(_SUFFIX.sub("", group.name.rsplit("/", 1)[-1]))
    if order:
        keys.sort(key=lambda k: order.index(k) if k in order else len(order))
    return [(key, _member(group, key, path)) for key in keys]


@dataclass
class _Layer:
    """One Keras 3 layer with variables, as its weights file keeps it.

    Attributes:
        module: Its module path, by the layers' own names.
        key: Its group's key: in a list (``layers``), its class in snake case numbered in the
            list's order (``dense_1``); else the attribute that holds it (``query_dense``).
        variables: Its ``vars`` group.
        listed: The list (an HDF5 path) it is a member of, or ``None`` for an attribute.
        holder: The key of the layer holding it as an attribute (``""`` for a listed one).
        anchor: Its nearest listed ancestor or itself, as (list, key): where in the model's
            order of layers it sits.
    """

    module: tuple[str, ...]
    key: str
    variables: Any
    listed: str | None
    holder: str
    anchor: tuple[str, str]


def _keras3_layers(group: Any, prefix: tuple[str, ...], depth: int, counter: list[int],
                   path: str, *, listing: bool = False, holder: str = "",
                   anchor: tuple[str, str] = ("", "")) -> Iterator[_Layer]:
    """Every layer with variables, in the walk's order (each group's keys in HDF5's order).

    A group without ``vars`` is a list attribute (``layers``): Keras keys its members by
    class, numbered in the list's order. Any other group is a layer; its groups are its
    attributes, walked by Keras in the order of their names.
    """
    check_nesting(depth, what="HDF5 groups", path=path)
    h5py = _h5py()
    for key, child in _children(group, counter, path):
        if not isinstance(child, h5py.Group) or key == "vars":
            continue
        variables = _member(child, "vars", path) if _linked(child, "vars") else None
        if key == "layers" or variables is None:
            inner = prefix if key == "layers" else (*prefix, key)
            yield from _keras3_layers(child, inner, depth + 1, counter, path, listing=True,
                                      holder=holder, anchor=anchor)
            continue
        attrs_name = variables.attrs.get("name")
        own = attrs_name if isinstance(attrs_name, str) and attrs_name else key
        here = (*prefix, own)
        listed = group.name if listing else None
        mine = (group.name, key) if listing else anchor
        if isinstance(variables, h5py.Group) and len(variables):
            yield _Layer(here, key, variables, listed, "" if listing else holder, mine)
        yield from _keras3_layers(child, here, depth + 1, counter, path, holder=key,
                                  anchor=mine)


def _torch_entry(module: tuple[str, ...], leaf: str, stored: TensorRef, name: str,
                 path: str, head_dims: dict[str, int]) -> tuple[str, TensorRef]:
    record_head_dim(head_dims, module, leaf, stored.meta.shape)
    parent = module[-1] if module else ""
    found = torch_layout(LEAVES, parent, leaf, len(stored.meta.shape))
    torch_leaf, op = found if found is not None else (leaf, None)
    return ".".join((*module, torch_leaf)), relaid(stored, op, name=name, path=path)


def _indices(variables: Any) -> list[str]:
    return sorted(variables.keys(), key=lambda k: int(k) if k.isdigit() else -1)


def _read_keras3(file: Any, source: FileSource | None, base: int, path: str,
                 config: list[tuple[str, str]], found: dict[str, Any]) -> dict[str, TensorRef]:
    """The weights, in the order the file states where its records agree (:func:`_stated`).

    Else each class's layers come in their numbers' order (:func:`_by_numbers`).

    ``found`` gets what the file says of its modules: ``head_dims``, and ``order``
    (``stated`` or ``unknown``), ``kinds`` and ``numbers`` (see :class:`~torchgraft.graft.
    tensors.Side`).
    """
    root: dict[str, TensorRef] = {}
    layers = list(_keras3_layers(file, (), 0, [0], path))
    stated = _stated(layers, config)
    layers = stated if stated is not None else _by_numbers(layers)
    kinds: dict[str, str] = {}
    numbers: dict[str, tuple[str, int]] = {}
    for layer in layers:
        names = KERAS3_VARIABLES.get(_SUFFIX.sub("", layer.key), ())
        kind = _kind_of(layer)
        number = _number_of(layer)
        for index in _indices(layer.variables):
            position = int(index) if index.isdigit() else -1
            leaf = names[position] if 0 <= position < len(names) else f"var{index}"
            where = f"{layer.variables.name}/{index}"
            stored = _dataset_ref(_member(layer.variables, index, path), source, base, where,
                                  path)
            name, ref = _torch_entry(layer.module, leaf, stored, where, path,
                                     found["head_dims"])
            if name in root:
                raise CorruptCheckpointError(f"two variables are named '{name}'", path=path)
            root[name] = ref
            if kind is not None:
                kinds[name] = kind
            if number is not None:
                numbers[name] = number
    found.update(order="stated" if stated is not None else "unknown", kinds=kinds,
                 numbers=numbers)
    return root


#: Keras layer classes (snake case, as a list keys its members) to PyTorch's module kinds.
KERAS3_KINDS: dict[str, str] = {
    "dense": "linear", "einsum_dense": "linear",
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv",
    "depthwise_conv1d": "conv", "depthwise_conv2d": "conv",
    "conv1d_transpose": "conv_transpose", "conv2d_transpose": "conv_transpose",
    "conv3d_transpose": "conv_transpose",
    "batch_normalization": "norm", "layer_normalization": "norm",
    "group_normalization": "norm", "rms_normalization": "norm",
    "embedding": "embedding",
}


def _kind_of(layer: _Layer) -> str | None:
    """A layer's module kind: its class, where a list keys it by class.

    A MultiHeadAttention's projections (its own attributes, :data:`_CHILD_ORDER`) are Linear.
    """
    if layer.listed is not None:
        return KERAS3_KINDS.get(_SUFFIX.sub("", layer.key))
    holder = _CHILD_ORDER.get(_SUFFIX.sub("", layer.holder), ())
    return "linear" if layer.key in holder else None


def _number_of(layer: _Layer) -> tuple[str, int] | None:
    """How Keras numbers a layer: (its list member's class and the path below, its number).

    ``dense_1`` is the 2nd Dense of its list; a MultiHeadAttention's ``query_dense`` has its
    holder's number.
    """
    listed, key = layer.anchor
    if not listed:
        return None
    stem, number = _stem_and_number(key)
    below = "" if layer.listed is not None else f"/{layer.key}"
    return f"{listed}/{stem}{below}", number


def _stem_and_number(key: str) -> tuple[str, int]:
    """A list member's class and number from its key: ``dense_1`` is ``("dense", 1)``."""
    match = _SUFFIX.search(key)
    return (key[: match.start()], int(match.group()[1:])) if match else (key, 0)


def _stated(layers: list[_Layer], config: list[tuple[str, str]]) -> list[_Layer] | None:
    """The layers in the model's order, where the file's two records of that order agree.

    A ``.keras`` file's ``config.json`` lists the model's layers in its order, with their
    classes; its weights file keys each member of that list by class, numbered in the list's
    order (``dense``, ``dense_1``). Both must say the same: each layer the class the config
    gives it, each class's numbers rising in the config's order. A layer's own attributes are
    walked by Keras in the order of their names, which is no order of definition: a layer that
    holds layers of its own (other than a MultiHeadAttention, whose projections
    :data:`_CHILD_ORDER` orders) leaves the order unstated, as does a weights file alone.

    Returns:
        The layers in that order, or ``None`` where the records disagree or cannot tell.
    """
    rank = {name: k for k, (name, _) in enumerate(config)}
    for layer in layers:
        listed, key = layer.anchor
        attribute = layer.listed is None and layer.key not in _CHILD_ORDER.get(
            _SUFFIX.sub("", layer.holder), ())
        name = layer.module[0]
        if attribute or listed != "/layers" or name not in rank or \
                _snake(config[rank[name]][1]) != _stem_and_number(key)[0]:
            return None
    walked = {id(layer): k for k, layer in enumerate(layers)}
    ordered = sorted(layers, key=lambda layer: (rank[layer.module[0]], walked[id(layer)]))
    highest: dict[str, int] = {}
    for _, key in dict.fromkeys(layer.anchor for layer in ordered):
        stem, number = _stem_and_number(key)
        if number <= highest.get(stem, -1):
            return None  # the config's order is not the one the weights were numbered in
        highest[stem] = number
    return ordered


def _by_numbers(layers: list[_Layer]) -> list[_Layer]:
    """The layers in their lists' numbers (``dense_2`` before ``dense_10``).

    Where no order is stated, each class's order is known, not the order between classes.
    """
    walked = {id(layer): k for k, layer in enumerate(layers)}
    return sorted(layers, key=lambda layer: (
        layer.anchor[0], *_stem_and_number(layer.anchor[1]), walked[id(layer)]))


def _snake(name: str) -> str:
    """Keras' ``to_snake_case``: how it keys a list member of class ``name``."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _strings(value: Any) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.asarray(value)]


#: tf.keras variable names only one of Keras' own layer classes makes, and that class's kind.
_LEGACY_KINDS = {"embeddings": "embedding", "moving_mean": "norm", "moving_variance": "norm",
                 "depthwise_kernel": "conv"}


def _read_legacy(file: Any, source: FileSource | None, base: int, path: str,
                 found: dict[str, Any]) -> dict[str, TensorRef]:
    """tf.keras ``save_weights(.h5)``: ``layer_names`` in order, each with ``weight_names``.

    The weights are in the order the model made them (tf.keras lists a layer's weights
    trainable first, then the rest, each in the order its code made them): an order of
    definition the file states. Kinds where a variable's name is one only a Keras class makes
    (a BatchNormalization's ``moving_mean``: every tensor of that module is a norm's).
    """
    root: dict[str, TensorRef] = {}
    kinds: dict[str, str] = {}
    module_kinds: dict[tuple[str, ...], str] = {}
    group = _weights_group(file, path)
    for layer in _strings(group.attrs["layer_names"]):
        weights = _member(group, layer, path)
        for weight in _strings(weights.attrs.get("weight_names", [])):
            parts = re.sub(r":\d+$", "", weight).split("/")
            parts = parts[parts.index(layer):] if layer in parts else [layer, *parts]
            module = tuple(p for part in parts[:-1] for p in part.split("_._") if p)
            stored = _dataset_ref(_member(weights, weight, path), source, base, weight, path)
            name, ref = _torch_entry(module, parts[-1], stored, weight, path,
                                     found["head_dims"])
            if name in root:
                raise CorruptCheckpointError(f"two weights are named '{name}'", path=path)
            root[name] = ref
            kind = _LEGACY_KINDS.get(parts[-1])
            if kind == "norm":
                module_kinds[module] = kind
            elif kind is not None:
                kinds[name] = kind
    kinds.update({name: module_kinds[tuple(name.split(".")[:-1])] for name in root
                  if tuple(name.split(".")[:-1]) in module_kinds})
    found.update(order="stated", kinds=kinds)
    return root


def _read_hdf5(file: Any, source: FileSource | None, base: int, path: str,
               config: list[tuple[str, str]]) -> dict[str, Any]:
    """The weights in PyTorch's names and layouts, and what the file says about them."""
    found: dict[str, Any] = {"head_dims": {}}
    group = _weights_group(file, path)
    if "layer_names" in group.attrs:
        root: dict[str, Any] = _read_legacy(file, source, base, path, found)
        flavour = "tf.keras (legacy HDF5)"
    else:
        root = _read_keras3(file, source, base, path, config, found)
        flavour = "keras 3"
    root["__metadata__"] = {"framework": flavour, **found,
                            "layout": "Keras names and layouts re-laid as PyTorch's (kernels "
                                      "transposed, HWIO to OIHW)"}
    return root


@contextmanager
def hdf5_faults(path: str | Path) -> Iterator[None]:
    """Turn what h5py raises on a damaged file into a :class:`CorruptCheckpointError`.

    h5py reports a damaged structure as ``RuntimeError``, ``KeyError`` or ``OSError`` with
    HDF5's own message: the file's fault, not a bug.
    """
    try:
        yield
    except (RuntimeError, KeyError, OSError) as exc:
        raise CorruptCheckpointError(f"the HDF5 structure is damaged ({brief(exc)})",
                                     path=path) from exc


def _open_h5(path: Path, options: ReadOptions) -> Contents:
    h5py = _h5py()
    source = FileSource(path)
    with hdf5_faults(path):  # read through the descriptor held, never the path again
        file = h5py.File(WindowStream(Window(source, 0, source.size)), "r")
        with closed_on_error(file.close):
            root = _read_hdf5(file, source, 0, str(path), [])
    return Contents("keras", path, root, [file.close, source.close])


def _config_layers(archive: zipfile.ZipFile, path: Path) -> list[tuple[str, str]]:
    """The top-level layers' names and classes in the model's order, from ``config.json``.

    Read as JSON only, its size checked before it is read: nothing in it is run or imported.
    A Functional model names each layer beside its config, a Sequential one inside it.
    """
    if "config.json" not in archive.namelist():
        return []
    info = archive.getinfo("config.json")
    if info.file_size > _MAX_CONFIG:
        raise CorruptCheckpointError("config.json is implausibly large", path=path)
    config = parse_json(read_member(archive, info, _MAX_CONFIG, what="config.json",
                                    path=str(path)), what="config.json", path=path)
    model = config.get("config") if isinstance(config, dict) else None
    layers = model.get("layers") if isinstance(model, dict) else None
    found = []
    for layer in layers[:_MAX_GROUPS] if isinstance(layers, list) else []:
        own = layer.get("config") if isinstance(layer, dict) else None
        name = layer.get("name") if isinstance(layer, dict) else None
        name = name if isinstance(name, str) else own.get("name") if isinstance(own, dict) \
            else None
        kind = layer.get("class_name") if isinstance(layer, dict) else None
        if isinstance(name, str) and isinstance(kind, str):
            found.append((name, kind))
    return found


def _open_keras(path: Path, options: ReadOptions) -> Contents:
    h5py = _h5py()
    source = FileSource(path)
    with zipfile.ZipFile(path) as archive:
        if "model.weights.h5" not in archive.namelist():
            raise CorruptCheckpointError("the .keras archive has no model.weights.h5", path=path)
        info = archive.getinfo("model.weights.h5")
        config = _config_layers(archive, path)
        if info.compress_type != zipfile.ZIP_STORED:
            raise UnsupportedCheckpointError(
                "model.weights.h5 is compressed inside the .keras archive; extract it and "
                "open the .weights.h5 file", path=path)
        base = zip_data_offset(source, info)
    source.check_range(base, info.file_size, what="model.weights.h5")
    with hdf5_faults(path):
        file = h5py.File(WindowStream(Window(source, base, info.file_size)), "r")
        with closed_on_error(file.close):
            root = _read_hdf5(file, source, base, str(path), config)
    return Contents("keras", path, root, [file.close, source.close])


def _keras_magic(head: bytes) -> bool:
    return first_zip_entry(head) in _KERAS_MEMBERS


FORMAT = Format(name="keras", open=_open_h5, suffixes=(".h5", ".hdf5"),
                magic=lambda head: head.startswith(_HDF5_MAGIC))
KERAS_ARCHIVE_FORMAT = Format(name="keras", open=_open_keras, suffixes=(".keras",),
                              magic=_keras_magic)
