"""Plain pickles of arrays: PaddlePaddle ``.pdparams``/``.pdopt``, and other pickled state dicts.

``paddle.save`` writes a pickle (any protocol) of a dict of numpy arrays. Paddle is not needed:
the safe unpickler rebuilds the arrays from their bytes. Parameters that Paddle split into
slices (``UnpackBigParamInfor@@``) are joined again; ``StructuredToParameterName@@`` is kept in
the extras.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptCheckpointError
from ..meta import TensorMeta, TensorRef
from ..safe_pickle import safe_load
from .base import Contents, Format, ReadOptions

__all__ = ["FORMAT"]

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


def _open(path: Path, options: ReadOptions) -> Contents:
    with path.open("rb") as f:
        root = safe_load(f, path=str(path), unsafe=options.unsafe)
    paddle = path.name.lower().endswith(_PADDLE_SUFFIXES)
    if isinstance(root, dict):
        paddle = paddle or _PADDLE_NAME_TABLE in root or _PADDLE_BIG_PARAMS in root
        _join_big_params(root)
    return Contents("paddle" if paddle else "pickle", path, root)


FORMAT = Format(name="paddle", open=_open,
                suffixes=(*_PADDLE_SUFFIXES, ".pkl", ".pickle"), magic=_magic)
