"""What a graft reads from: a checkpoint path, an opened checkpoint, a state dict or a module."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...checkpoint import Checkpoint, OpenOptions, open_with
from ...errors import TorchgraftError
from ...meta import TensorMeta, TensorRef
from ..layouts.catalogue import mark_file_kinds
from ..tensors import Side, TensorInfo
from .adapters import Adapter, find_adapter
from .model import MODULE_KINDS, module_side, state_tensors, unwrap

__all__ = ["GraftSource", "SourceLike", "open_source"]

SourceLike = str | os.PathLike[str] | Mapping[str, torch.Tensor] | nn.Module | Checkpoint


@dataclass
class GraftSource:
    """A source's metadata and lazy tensors.

    Attributes:
        side: Metadata for planning.
        refs: Key to lazy tensor.
        module: The unwrapped source module, when the source is one.
        closers: Called by :meth:`close`.
        saved_keys: The top-level keys of a checkpoint's saved object (evidence of wrappers).
        adapter: The PEFT adapter a checkpoint file belongs to, if it is one.
        private: Whether its tensors' memory is nobody else's: a file opened here (its
            mapping is private to it and closed after), not the caller's tensors, module or
            opened checkpoint. Only then may a model hold its tensors as they are.
    """

    side: Side
    refs: dict[str, TensorRef]
    module: nn.Module | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    saved_keys: list[str] = field(default_factory=list)
    adapter: Adapter | None = None
    private: bool = False

    def close(self) -> None:
        """Release files opened for the graft."""
        for close in self.closers:
            close()

    def __enter__(self) -> GraftSource:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _in_memory(tensors: Mapping[str, torch.Tensor]) -> dict[str, TensorRef]:
    refs = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TorchgraftError(f"state dict entry '{name}' is a {type(tensor).__name__}, "
                                  "not a tensor")
        value = tensor.detach()
        meta = TensorMeta.of(tuple(value.shape), value.dtype, str(value.device))
        alias = (value.untyped_storage().data_ptr(), value.storage_offset(),
                 tuple(value.shape), value.stride(), value.dtype, value.device)
        refs[name] = TensorRef(meta, functools.partial(_same, value), alias_key=alias)
    return refs


def open_source(source: SourceLike, opening: OpenOptions | None = None, *,
                example_inputs: Any = None) -> GraftSource:
    """Describe a graft source.

    Args:
        source: A checkpoint path, an opened :class:`~torchgraft.Checkpoint`, a state dict,
            or an ``nn.Module`` (wrappers are stripped).
        opening: For paths: how to open the checkpoint.
        example_inputs: Inputs to order a source module's tensors by use.

    Returns:
        The source; close it, or use it in a ``with`` block.

    Raises:
        TorchgraftError: If the source cannot be read.
    """
    if isinstance(source, (str, os.PathLike)):
        ckpt = open_with(source, opening or OpenOptions())
        opened = _from_checkpoint(ckpt)
        opened.closers.append(ckpt.close)
        opened.private = True
        return opened
    if isinstance(source, Checkpoint):
        return _from_checkpoint(source)
    if isinstance(source, nn.Module):
        module = unwrap(source)
        return GraftSource(module_side(module, example_inputs),
                           _in_memory(state_tensors(module)), module)
    if isinstance(source, Mapping):
        refs = _in_memory(source)
        return GraftSource(_refs_side(refs), refs)
    raise TorchgraftError(f"cannot graft from a {type(source).__name__}: pass a checkpoint "
                          "path, a state dict, an nn.Module or a tg.open() result")


def _refs_side(refs: dict[str, TensorRef], fmt: str | None = None,
               kinds: dict[str, str] | None = None) -> Side:
    """Describe lazy tensors as a side: kinds stated or revealed by names, ties by aliases."""
    kinds = kinds or {}
    infos = {n: TensorInfo(n, r.meta.shape, r.meta.dtype, kinds.get(n)) for n, r in refs.items()}
    first: dict[Any, str] = {}
    ties = {}
    for name, ref in refs.items():
        owner = first.setdefault(ref.alias_key, name)
        if owner != name:
            ties[name] = owner
    return mark_file_kinds(Side(infos, format=fmt, ties=ties))


def _from_checkpoint(ckpt: Checkpoint) -> GraftSource:
    refs = ckpt.tensor_refs()
    side = _refs_side(refs, ckpt.format, _stated_kinds(ckpt))
    side.head_dims.update(_stated_head_dims(ckpt.extras))
    _state_order(side, ckpt)
    return GraftSource(side, refs, saved_keys=ckpt.saved_keys,
                       adapter=find_adapter(ckpt.path))


#: Formats whose readers state what a file's own structure says of its modules (a Keras layer
#: config, an ONNX graph): their order, kinds and numbers (``__metadata__``'s ``order``,
#: ``kinds`` and ``numbers``). Other formats' metadata is the writer's free text: never read so.
_STRUCTURED = frozenset({"keras", "onnx"})
_KINDS = frozenset(MODULE_KINDS.values())


def _file_statement(ckpt: Checkpoint, key: str) -> Any:
    metadata = ckpt.extras.get("__metadata__")
    if ckpt.format not in _STRUCTURED or not isinstance(metadata, dict):
        return None
    return metadata.get(key)


def _stated_kinds(ckpt: Checkpoint) -> dict[str, str]:
    """Key to module kind, where the file's structure says it (Keras' classes, ONNX's ops)."""
    stated = _file_statement(ckpt, "kinds")
    if not isinstance(stated, dict):
        return {}
    return {k: v for k, v in stated.items() if isinstance(k, str) and v in _KINDS}


def _state_order(side: Side, ckpt: Checkpoint) -> None:
    """The order a file's structure states, its modules' numbers, or its lack of an order.

    ``stated``: the stored order is the model's own, whatever the names look like (a sorted
    look is no sign against it). ``unknown``: the file's records of it disagree or it has none
    (a Keras weights file without its config): the reader's order is kept, not as a real one.
    Numbers (:attr:`~torchgraft.graft.tensors.Side.numbers`) either way.
    """
    order = _file_statement(ckpt, "order")
    if order not in ("stated", "unknown"):
        return
    side.given_order, side.given_ordered = list(side.tensors), order == "stated"
    numbers = _file_statement(ckpt, "numbers")
    if isinstance(numbers, dict):
        side.numbers.update({k: (v[0], v[1]) for k, v in numbers.items()
                             if k in side.tensors and _number(v)})


def _number(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and not isinstance(value[1], bool) and value[1] >= 0)


def _stated_head_dims(extras: dict[str, Any]) -> dict[str, int]:
    """The head sizes a file states: module path to ``head_dim``.

    Args:
        extras: A checkpoint's extras (plain data beside the weights).

    Returns:
        Module path to head size; empty when the file states none.
    """
    metadata = extras.get("__metadata__")
    stated = metadata.get("head_dims") if isinstance(metadata, dict) else None
    if not isinstance(stated, dict):
        return {}
    return {str(k): v for k, v in stated.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 0}
