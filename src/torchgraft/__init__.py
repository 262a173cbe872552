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

import importlib
import logging
import sys
import types
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    DeviceError,
    MissingDependencyError,
    OutsideCheckpointError,
    TensorNotFoundError,
    TorchgraftError,
    TorchgraftWarning,
    UnknownFormatError,
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
    UnsupportedModelError,
)

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, open
    from .convert import ConvertReport, convert
    from .diff import DiffReport, diff
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
    "OutsideCheckpointError",
    "TensorMeta",
    "TensorNotFoundError",
    "TorchgraftError",
    "TorchgraftWarning",
    "UnknownFormatError",
    "UnsafeCheckpointError",
    "UnsupportedCheckpointError",
    "UnsupportedModelError",
    "__version__",
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

# Where each public name lives: torch is imported on first use, not by ``import torchgraft``
# (so ``torchgraft --help`` starts at once).
_LAZY = {
    "Checkpoint": "checkpoint", "open": "checkpoint", "ConvertReport": "convert",
    "convert": "convert", "DiffReport": "diff", "diff": "diff", "GraftError": "graft",
    "GraftReport": "graft", "graft": "graft", "unwrap": "graft", "CheckpointInfo": "inspect",
    "inspect": "inspect", "load": "load", "TensorMeta": "meta", "ExportReport": "onnx_export",
    "export_onnx": "onnx_export", "save": "save", "seed_everything": "seed",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchgraft' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names only: not the modules and helpers this file imports for itself."""
    return sorted(__all__)


class _Package(types.ModuleType):
    """This package's module, keeping public functions visible over their modules.

    Importing the subpackage ``torchgraft.graft`` must not hide the function ``tg.graft``, as
    Python's import system would by setting the attribute.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _LAZY and name in __all__:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


logging.getLogger("torchgraft").addHandler(logging.NullHandler())
