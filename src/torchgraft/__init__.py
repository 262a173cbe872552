"""torchgraft: get any PyTorch checkpoint into any model.

Reading never runs code from the file, and reads tensor bytes only when they are asked for::

    import torchgraft as tg

    with tg.open("model.pth") as ckpt:      # any format, any device it was saved on
        print(ckpt.format, ckpt.saved_devices, ckpt.keys()[:3])
        weight = ckpt.get("conv1.weight")
    state_dict = tg.load("model.pth")        # a file saved on cuda:1 loads on a CPU machine
    print(tg.inspect("model.pth").to_dict())
"""

from __future__ import annotations

import logging

from .checkpoint import Checkpoint, open
from .convert import ConvertReport, convert
from .diff import DiffReport, diff
from .errors import (
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    DeviceError,
    MissingDependencyError,
    TensorNotFoundError,
    TorchgraftError,
    UnknownFormatError,
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
)
from .graft import GraftError, GraftReport, graft, unwrap
from .inspect import CheckpointInfo, inspect
from .load import load
from .meta import TensorMeta
from .onnx_export import ExportReport, export_onnx
from .save import save
from .seed import seed_everything

__all__ = [
    "Checkpoint",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "ConvertReport",
    "CorruptCheckpointError",
    "DeviceError",
    "DiffReport",
    "ExportReport",
    "GraftError",
    "GraftReport",
    "MissingDependencyError",
    "TensorMeta",
    "TensorNotFoundError",
    "TorchgraftError",
    "UnknownFormatError",
    "UnsafeCheckpointError",
    "UnsupportedCheckpointError",
    "convert",
    "diff",
    "export_onnx",
    "graft",
    "inspect",
    "load",
    "open",
    "save",
    "seed_everything",
    "unwrap",
]

__version__ = "0.1.0"

logging.getLogger("torchgraft").addHandler(logging.NullHandler())
