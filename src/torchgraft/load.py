"""``tg.load``: every weight of a checkpoint as a state dict, on the device asked for."""

from __future__ import annotations

import os

import torch

from .checkpoint import OpenOptions, open_with
from .devices import DeviceMap, DeviceSpec
from .io.reads import plan_read, read_all
from .meta import parse_dtype

__all__ = ["load"]


def load(path: str | os.PathLike[str], *, device: DeviceSpec = "cpu",
         dtype: torch.dtype | str | None = None, unsafe: bool = False,
         weights_key: str | None = None, component: str | None = None,
         follow_links: bool = False) -> dict[str, torch.Tensor]:
    """Load the model weights of any checkpoint as a state dict.

    A file saved on ``cuda:1`` loads on a CPU-only machine with the default ``device``.

    Args:
        path: A checkpoint file or directory, in any format :func:`torchgraft.open` reads.
        device: ``"cpu"``, ``"cuda:0"``, a :class:`torch.device`, or a mapping from saved
            devices such as ``{"cuda:1": "cuda:0"}``.
        dtype: Cast floating-point weights to this dtype; integer buffers are left alone.
        unsafe: See :class:`~torchgraft.checkpoint.OpenOptions` (runs code from the file).
        weights_key: See :class:`~torchgraft.checkpoint.OpenOptions`.
        component: See :class:`~torchgraft.checkpoint.OpenOptions`.
        follow_links: See :class:`~torchgraft.checkpoint.OpenOptions`.

    Returns:
        Weight name to tensor, in stored order. CPU tensors may be memory-mapped
        (copy-on-write) from the file; tensors for an accelerator are read onto it by a pool
        of readers through pinned staging buffers (:func:`~torchgraft.io.reads.read_all`),
        host memory bounded by those buffers.

    Raises:
        TorchgraftError: Any failure, naming the file.
    """
    devices = DeviceMap(device)
    cast = parse_dtype(dtype) if dtype else None
    with open_with(path, OpenOptions(unsafe, weights_key, component, follow_links)) as ckpt:
        loaded: dict[str, torch.Tensor] = {}
        reads = []
        for name, ref in ckpt.tensor_refs().items():
            where = devices.target(ref.meta.device, name=name, path=ckpt.path)
            if where.type in ("cpu", "meta"):
                loaded[name] = ckpt.get(name, devices, dtype=cast)
                continue
            meta = ref.meta
            loaded[name] = torch.empty(meta.shape, device=where, dtype=cast if cast and
                                       meta.dtype.is_floating_point else meta.dtype)
            reads.append(plan_read(name, ref, loaded[name]))
        read_all(reads)
        return loaded
