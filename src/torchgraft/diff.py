"""``tg.diff``: which names, shapes, dtypes and values differ between two sets of weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .checkpoint import OpenOptions
from .graft.sides.source import SourceLike, open_source
from .meta import dtype_name
from .wrappers import strip_wrappers

__all__ = ["DiffReport", "diff"]


@dataclass
class DiffReport:
    """Differences between two sets of weights, by name.

    Attributes:
        only_in_a: Names only the first has.
        only_in_b: Names only the second has.
        shapes: Name to (shape in a, shape in b), where they differ.
        dtypes: Name to (dtype in a, dtype in b), where they differ.
        values: Name to the largest absolute difference, for same-shape tensors that differ.
        equal: Names whose tensors are equal (same shape and values; NaNs equal NaNs).
        wrappers: The wrapper prefix removed from every name of A and of B before comparing
            (``{"a": "module.", "b": ""}``), when one was.
    """

    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    dtypes: dict[str, tuple[str, str]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    equal: list[str] = field(default_factory=list)
    wrappers: dict[str, str] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """True when both hold the same names with equal tensors of the same dtypes."""
        return not (self.only_in_a or self.only_in_b or self.shapes or self.dtypes
                    or self.values)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data."""
        return {"identical": self.identical, "only_in_a": self.only_in_a,
                "only_in_b": self.only_in_b,
                "shapes": {k: [list(a), list(b)] for k, (a, b) in self.shapes.items()},
                "dtypes": {k: list(v) for k, v in self.dtypes.items()},
                "values": self.values, "equal": len(self.equal), "wrappers": self.wrappers}

    def to_json(self, **kwargs: Any) -> str:
        """Return the report as JSON text."""
        return json.dumps(self.to_dict(), **kwargs)

    def headline(self) -> str:
        """The one-line verdict: ``identical: 12 tensors`` or ``differ: ...``."""
        removed = "; ".join(f"'{p}' removed from {side.upper()}'s names"
                            for side, p in self.wrappers.items() if p)
        note = f" ({removed})" if removed else ""
        if self.identical:
            return f"identical: {len(self.equal)} tensor{'' if len(self.equal) == 1 else 's'}" \
                   f"{note}"
        parts = [(len(self.values), "with other values"), (len(self.shapes), "with other shapes"),
                 (len(self.dtypes), "with other dtypes"), (len(self.only_in_a), "only in A"),
                 (len(self.only_in_b), "only in B")]
        counts = ", ".join(f"{n} {what}" for n, what in parts if n)
        return f"differ: {len(self.equal)} equal, {counts}{note}"

    def lines(self) -> list[tuple[str, str, str]]:
        """(status, key, detail) for every key that differs."""
        return [*(("only in A", k, "") for k in self.only_in_a),
                *(("only in B", k, "") for k in self.only_in_b),
                *(("shape", k, f"{a} vs {b}") for k, (a, b) in self.shapes.items()),
                *(("dtype", k, f"{a} vs {b}") for k, (a, b) in self.dtypes.items()),
                *(("values", k, f"max |a - b| = {d:.3g}") for k, d in self.values.items())]

    def __str__(self) -> str:
        return "\n".join([self.headline(), *(f"  {s:<9}  {k}  {d}".rstrip()
                                              for s, k, d in self.lines())])


def _comparable(tensor: torch.Tensor) -> torch.Tensor:
    """On the CPU; a quantized tensor as its integers and scale (equal when all are)."""
    tensor = tensor.cpu()
    return tensor.dequantize() if tensor.is_quantized else tensor


def diff(a: SourceLike, b: SourceLike, *, unsafe: bool = False,
         keep_wrappers: bool = False,
         progress: Callable[[int, int], None] | None = None) -> DiffReport:
    """Compare two sets of weights by name, reading one pair of tensors at a time.

    Args:
        a: A checkpoint path, state dict, ``nn.Module`` or :func:`torchgraft.open` result.
        b: The same kinds.
        unsafe: For checkpoint paths: let pickles call code outside the allow-list.
        keep_wrappers: Compare names as stored; by default the wrapper prefix every name of a
            side shares (``module.``, ``_orig_mod.``) is removed first, and the report says so.
        progress: Called with (tensors compared, total).

    Returns:
        The differences.

    Raises:
        TorchgraftError: If either side cannot be read.
    """
    left = open_source(a, OpenOptions(unsafe=unsafe))
    try:
        right = open_source(b, OpenOptions(unsafe=unsafe))
    except BaseException:
        left.close()
        raise
    report = DiffReport()
    try:
        refs_a, refs_b = left.refs, right.refs
        if not keep_wrappers:
            prefix_a, bare_a = strip_wrappers(refs_a, saved=left.saved_keys)
            prefix_b, bare_b = strip_wrappers(refs_b, saved=right.saved_keys)
            if prefix_a or prefix_b:
                report.wrappers = {"a": prefix_a, "b": prefix_b}
                refs_a = {bare_a[k]: v for k, v in refs_a.items()}
                refs_b = {bare_b[k]: v for k, v in refs_b.items()}
        report.only_in_a = [k for k in refs_a if k not in refs_b]
        report.only_in_b = [k for k in refs_b if k not in refs_a]
        for done, (name, ref_a) in enumerate(refs_a.items(), start=1):
            if progress is not None:
                progress(done, len(refs_a))
            ref_b = refs_b.get(name)
            if ref_b is None:
                continue
            if ref_a.meta.shape != ref_b.meta.shape:
                report.shapes[name] = (ref_a.meta.shape, ref_b.meta.shape)
                continue
            if ref_a.meta.dtype != ref_b.meta.dtype:
                report.dtypes[name] = (dtype_name(ref_a.meta.dtype), dtype_name(ref_b.meta.dtype))
            x, y = (_comparable(ref_a.read()), _comparable(ref_b.read()))
            if x.dtype == y.dtype and torch.equal(x, y):
                report.equal.append(name)
                continue
            x, y = x.to(torch.float64), y.to(torch.float64)
            nan = x.isnan()
            if torch.equal(nan, y.isnan()) and torch.equal(x[~nan], y[~nan]):
                report.equal.append(name)
            else:
                report.values[name] = float((x - y).abs().nan_to_num(float("inf")).max())
    finally:
        left.close()
        right.close()
    return report
