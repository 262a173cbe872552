"""Checkpoint formats: one module per format, registered here in sniffing order."""

from __future__ import annotations

from . import dcp, numpy_format, pickle_format, safetensors_format, sharded, torch_legacy, torch_zip
from .base import Contents, Format, ReadOptions, WriteJob
from .registry import detect, formats, open_contents, register

__all__ = ["Contents", "Format", "ReadOptions", "WriteJob", "detect", "formats", "open_contents",
           "register"]

# Legacy torch files are pickles too: their magic must be tried before the plain pickle's.
for _fmt in (
    torch_legacy.FORMAT,
    torch_zip.FORMAT,
    numpy_format.NPZ_FORMAT,
    numpy_format.NPY_FORMAT,
    safetensors_format.FORMAT,
    pickle_format.FORMAT,
    sharded.FORMAT,
    dcp.FORMAT,
):
    register(_fmt)
