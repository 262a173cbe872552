"""Plain pickles of arrays: PaddlePaddle ``.pdparams``/``.pdopt``, and other pickled state dicts.

``paddle.save`` writes a pickle (any protocol) of a dict of numpy arrays. Paddle is not needed:
the safe unpickler rebuilds the arrays from their bytes. Parameters that Paddle split into
slices (``UnpackBigParamInfor@@``) are joined again; ``StructuredToParameterName@@`` is kept in
the extras.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..meta import TensorMeta, TensorRef
from ..renames import rename
from ..safe_pickle import safe_load
from . import paddle_layout
from .base import Contents, Format, ReadOptions, WriteJob
from .source import FileSource

__all__ = ["FORMAT", "write_paddle"]

_PADDLE_SUFFIXES = (".pdparams", ".pdopt", ".pdema")
_PADDLE_NAME_TABLE = "StructuredToParameterName@@"
_PADDLE_BIG_PARAMS = "UnpackBigParamInfor@@"


def _magic(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _joined(name: str, shape: tuple[int, ...], parts: list[TensorRef]) -> TensorRef:
    dtype = parts[0].meta.dtype
    if any(p.meta.dtype != dtype for p in parts):
        raise CorruptCheckpointError(f"the slices of '{name}' differ in dtype")
    meta = TensorMeta.of(shape, dtype)
    if sum(p.meta.numel for p in parts) != meta.numel:
        raise CorruptCheckpointError(f"the slices of '{name}' do not add up to shape {shape}")

    def read() -> torch.Tensor:
        return torch.cat([p.read().reshape(-1) for p in parts]).reshape(shape)

    return TensorRef(meta, read)


def _join_big_params(root: dict[str, Any]) -> None:
    info = root.pop(_PADDLE_BIG_PARAMS, None)
    if not isinstance(info, dict):
        return
    for name, entry in info.items():
        try:
            shape = tuple(int(d) for d in entry["OriginShape"])
            parts = [root.pop(s) for s in entry["slices"]]
        except (KeyError, TypeError, ValueError):
            raise CorruptCheckpointError(f"the slice table for '{name}' is malformed") from None
        if not parts or not all(isinstance(p, TensorRef) for p in parts):
            raise CorruptCheckpointError(f"the slices of '{name}' are not arrays")
        root[name] = _joined(name, shape, parts)


def write_paddle(job: WriteJob, path: Path) -> None:
    """Write a ``.pdparams`` that ``paddle.load`` reads into the matching Paddle model.

    PyTorch's layout is reversed: BatchNorm statistics are renamed (``running_mean`` to
    ``_mean``), ``num_batches_tracked`` (which Paddle lacks) is left out, and Linear weights
    are transposed to Paddle's ``[in, out]``: which weights belong to Linear layers comes from
    the module (``job.kinds``).

    Args:
        job: What to write.
        path: Where.

    Raises:
        UnsupportedCheckpointError: For bfloat16/float8 tensors, or without module kinds.
    """
    if not job.kinds:
        raise UnsupportedCheckpointError(
            "writing Paddle needs the model, to know which weights are Linear layers (Paddle "
            "stores them transposed): use tg.save(model, path, format='paddle')", path=path)
    arrays: dict[str, Any] = {}
    for count, name in enumerate(job.tensors, start=1):
        new, _rule = rename(name, paddle_layout.EXPORTS)
        if new is not None:
            array = job.read_numpy(name, "a Paddle file", path)
            transposed = paddle_layout.stored_transposed(job.kinds.get(name), name, array.ndim)
            arrays[new] = np.ascontiguousarray(array.T) if transposed else array
        job.done(count)
    with path.open("wb") as f:
        pickle.dump(arrays, f, protocol=4)


def _open(path: Path, options: ReadOptions) -> Contents:
    with FileSource(path) as source, source.stream() as f:
        root = safe_load(f, path=str(path), unsafe=options.unsafe)
    paddle = path.name.lower().endswith(_PADDLE_SUFFIXES)
    if isinstance(root, dict):
        paddle = paddle or _PADDLE_NAME_TABLE in root or _PADDLE_BIG_PARAMS in root
        _join_big_params(root)
    return Contents("paddle" if paddle else "pickle", path, root)


FORMAT = Format(name="paddle", open=_open,
                suffixes=(*_PADDLE_SUFFIXES, ".pkl", ".pickle"), magic=_magic,
                writes="paddle", write=write_paddle)
