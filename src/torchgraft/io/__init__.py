"""Checkpoint formats: one module per format, registered here in sniffing order."""

from __future__ import annotations

from . import (
    components,
    dcp,
    deepspeed,
    flax_format,
    gguf_format,
    keras_format,
    mlx_format,
    numpy_format,
    onnx_format,
    orbax_format,
    pickle_format,
    pt2,
    safetensors_format,
    sharded,
    torch_legacy,
    torch_zip,
)
from .base import Contents, Format, ReadOptions, WriteJob
from .registry import detect, formats, open_contents, register

__all__ = ["Contents", "Format", "ReadOptions", "WriteJob", "detect", "formats", "open_contents",
           "register"]

# Legacy torch files are pickles too: their magic must be tried before the plain pickle's.
# torch.export archives and .keras files are zips too: their first entry is tried before
# torch.save's zip.
for _fmt in (
    torch_legacy.FORMAT,
    pt2.FORMAT,
    keras_format.KERAS_ARCHIVE_FORMAT,
    torch_zip.FORMAT,
    numpy_format.NPZ_FORMAT,
    numpy_format.NPY_FORMAT,
    mlx_format.FORMAT,
    safetensors_format.FORMAT,
    pickle_format.FORMAT,
    sharded.FORMAT,
    dcp.FORMAT,
    deepspeed.FORMAT,
    components.FORMAT,
    gguf_format.FORMAT,
    onnx_format.FORMAT,
    keras_format.FORMAT,
    flax_format.FORMAT,
    mlx_format.FOLDER_FORMAT,
    orbax_format.FORMAT,
):
    register(_fmt)
