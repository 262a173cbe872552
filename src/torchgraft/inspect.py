"""``tg.inspect``: what a checkpoint holds, from its metadata alone."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .wrappers import Wrapper

if TYPE_CHECKING:  # importing this module imports no torch (quick_inspect uses its classes)
    from .meta import TensorMeta

__all__ = ["BUFFER_NAMES", "CheckpointInfo", "DtypeTotals", "inspect"]

#: Names of tensors that are buffers, not parameters, in the modules that have them (a file
#: does not say which is which): BatchNorm statistics in PyTorch's and Paddle's names,
#: transformers' position ids and attention masks.
BUFFER_NAMES = re.compile(r"(^|\.)(running_mean|running_var|num_batches_tracked|_mean|_variance"
                          r"|position_ids|token_type_ids|masked_bias|attn\.bias)$")


@dataclass
class DtypeTotals:
    """Totals for the tensors of one dtype (or of all dtypes).

    Attributes:
        tensors: Number of tensors.
        parameters: Number of elements.
        bytes: Size of their data.
    """

    tensors: int = 0
    parameters: int = 0
    bytes: int = 0

    def add(self, meta: TensorMeta) -> None:
        """Count one more tensor."""
        self.tensors += 1
        self.parameters += meta.numel
        self.bytes += meta.nbytes


@dataclass
class CheckpointInfo:
    """A summary of a checkpoint's weights, read from metadata only.

    Attributes:
        path: The file or directory.
        format: The format's name.
        tensors: Each weight's name and metadata, in stored order.
        saved_devices: Where the tensors lived when saved.
        wrappers: Training wrappers seen in the weight names, outermost first.
        weights_key: Where the weights were found (``""`` for the top level).
        model_class: The class of a pickled whole model, if the weights came from one.
        weight_sets: Every place in the file holding weights, with its tensor count.
        extras: Everything saved besides the weights, as plain data.
        skipped_calls: Globals the pickle called that were recorded, not run.
        totals: Totals over all weights.
        by_dtype: Totals per dtype name.
        buffers: Totals over the tensors that are buffers by name (:data:`BUFFER_NAMES`);
            the rest are parameters.
    """

    path: str
    format: str
    tensors: list[tuple[str, TensorMeta]]
    saved_devices: list[str]
    wrappers: list[Wrapper]
    weights_key: str
    model_class: str | None
    weight_sets: dict[str, int]
    extras: dict[str, Any]
    skipped_calls: list[str] = field(default_factory=list)
    totals: DtypeTotals = field(default_factory=DtypeTotals)
    by_dtype: dict[str, DtypeTotals] = field(default_factory=dict)
    buffers: DtypeTotals = field(default_factory=DtypeTotals)

    def to_dict(self) -> dict[str, Any]:
        """Return the summary as JSON-ready data."""
        return {
            "path": self.path,
            "format": self.format,
            "saved_devices": self.saved_devices,
            "wrappers": [{"prefix": w.prefix, "source": w.source} for w in self.wrappers],
            "weights_key": self.weights_key,
            "model_class": self.model_class,
            "weight_sets": self.weight_sets,
            "totals": vars(self.totals),
            "by_dtype": {k: vars(v) for k, v in self.by_dtype.items()},
            "buffers": vars(self.buffers),
            "extras": self.extras,
            "skipped_calls": self.skipped_calls,
            "tensors": [{"name": name, **meta.to_dict()} for name, meta in self.tensors],
        }


def inspect(path: str | os.PathLike[str], *, unsafe: bool = False,
            weights_key: str | None = None, component: str | None = None,
            follow_links: bool = False) -> CheckpointInfo:
    """Summarise a checkpoint without reading its tensor data.

    Args:
        path: A checkpoint file or directory.
        unsafe: See :class:`~torchgraft.checkpoint.OpenOptions` (runs code from the file).
        weights_key: See :class:`~torchgraft.checkpoint.OpenOptions`.
        component: See :class:`~torchgraft.checkpoint.OpenOptions`.
        follow_links: See :class:`~torchgraft.checkpoint.OpenOptions`.

    Returns:
        The summary: format, saved devices, wrappers, totals by dtype, extras, tensor table.

    Raises:
        TorchgraftError: Any failure, naming the file.
    """
    from .checkpoint import OpenOptions, open_with
    from .meta import dtype_name

    with open_with(path, OpenOptions(unsafe, weights_key, component, follow_links)) as ckpt:
        info = CheckpointInfo(
            path=str(ckpt.path), format=ckpt.format, tensors=ckpt.items_meta(),
            saved_devices=sorted(ckpt.saved_devices), wrappers=ckpt.wrappers,
            weights_key=ckpt.weights_key, model_class=ckpt.model_class,
            weight_sets=ckpt.weight_sets, extras=ckpt.extras, skipped_calls=ckpt.skipped_calls,
        )
    for name, meta in info.tensors:
        info.totals.add(meta)
        if BUFFER_NAMES.search(name):
            info.buffers.add(meta)
        info.by_dtype.setdefault(dtype_name(meta.dtype), DtypeTotals()).add(meta)
    return info
