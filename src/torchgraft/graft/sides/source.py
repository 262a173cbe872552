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
from .model import module_side, state_tensors, unwrap

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


def _refs_side(refs: dict[str, TensorRef], fmt: str | None = None) -> Side:
    """Describe lazy tensors as a side: kinds its names reveal, ties its aliases reveal."""
    infos = {n: TensorInfo(n, r.meta.shape, r.meta.dtype) for n, r in refs.items()}
    first: dict[Any, str] = {}
    ties = {}
    for name, ref in refs.items():
        owner = first.setdefault(ref.alias_key, name)
        if owner != name:
            ties[name] = owner
    return mark_file_kinds(Side(infos, format=fmt, ties=ties))


def _from_checkpoint(ckpt: Checkpoint) -> GraftSource:
    refs = ckpt.tensor_refs()
    side = _refs_side(refs, ckpt.format)
    side.head_dims.update(_stated_head_dims(ckpt.extras))
    return GraftSource(side, refs, saved_keys=ckpt.saved_keys,
                       adapter=find_adapter(ckpt.path))


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
