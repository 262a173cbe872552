"""``tg.convert``: any checkpoint to any format, streaming, with rules, casts and extras."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .bounds import MAX_RANKS
from .checkpoint import OpenOptions, open_with
from .containers import all_tensors
from .errors import TorchgraftError, shown
from .graft.layouts.experts import per_expert
from .graft.layouts.rules import RulesSpec, parse_rules
from .io import WriteJob
from .meta import TensorRef, dtype_name, parse_dtype
from .renames import rename
from .save import resolve_format, write_job
from .units import human_bytes, plural
from .wrappers import strip_wrappers

__all__ = ["ConvertReport", "convert"]


@dataclass
class ConvertReport:
    """What a conversion wrote.

    Attributes:
        source: The checkpoint read.
        source_format: Its format.
        format: The format written.
        written: The files (or directory) written.
        tensors: Number of tensors written.
        bytes: Their size as written.
        renamed: Old name to new name, for keys a rule renamed.
        wrappers_removed: The wrapper prefix removed from every key (``"module."``), if any.
        dropped: Keys a rule dropped.
        cast: Keys whose dtype changed, with ``"float32->float16"``.
        extras_kept: Extras written beside the weights.
        extras_dropped: Extras not written, with the reason.
    """

    source: str
    source_format: str
    format: str
    written: list[str] = field(default_factory=list)
    tensors: int = 0
    bytes: int = 0
    renamed: dict[str, str] = field(default_factory=dict)
    wrappers_removed: str = ""
    dropped: list[str] = field(default_factory=list)
    cast: dict[str, str] = field(default_factory=dict)
    extras_kept: list[str] = field(default_factory=list)
    extras_dropped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data."""
        return dict(vars(self))

    def to_json(self, **kwargs: Any) -> str:
        """Return the report as JSON text."""
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        lines = [f"converted {self.source} ({self.source_format}) -> {self.format}: "
                 f"{plural(self.tensors, 'tensor')}, {human_bytes(self.bytes)}"]
        lines += [f"  wrote     {w}" for w in self.written]
        if self.wrappers_removed:
            lines.append(f"  wrappers  '{self.wrappers_removed}' removed from every key "
                         "(keep_wrappers=True, CLI --keep-wrappers, keeps it)")
        lines += [f"  renamed   {a} -> {b}" for a, b in self.renamed.items()]
        lines += [f"  dropped   {k}" for k in self.dropped]
        if self.cast:
            lines.append(f"  cast      {plural(len(self.cast), 'tensor')} "
                         f"({', '.join(sorted(set(self.cast.values())))})")
        lines += [f"  extra     {k} kept" for k in self.extras_kept]
        lines += [f"  extra     {k} not kept: {why}" for k, why in self.extras_dropped.items()]
        return "\n".join(lines)


def _plain(value: Any) -> bool:
    """Whether a saved value is plain JSON data, which every format can keep exactly."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _extras(root: Any, weights_key: str, weights: set[Hashable],
            report: ConvertReport) -> dict[str, Any]:
    """The top-level extras that can be written exactly (plain data), the rest reported.

    Entries made only of weights already written (a quantized module's packed tuple) and
    the quantized modules' dtype entries beside them are not extras.
    """
    if not isinstance(root, dict):
        return {}
    kept: dict[str, Any] = {}
    for key, value in root.items():
        if key == weights_key or key == "__metadata__" or isinstance(value, TensorRef):
            continue
        held = all_tensors(value)
        if (held and all(t.alias_key in weights for t in held)) or (
                isinstance(value, torch.dtype) and str(key).endswith("_packed_params.dtype")):
            continue
        if _plain(value):
            kept[str(key)] = value
        elif held:
            report.extras_dropped[str(key)] = "holds tensors (optimizer or EMA state); " \
                                              "convert writes the model weights only"
        else:
            report.extras_dropped[str(key)] = "not plain data (numbers, strings, lists, dicts)"
    report.extras_kept = list(kept)
    return kept


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
            format: str | None = None,
            rules: RulesSpec = None, dtype: torch.dtype | str | None = None, legacy: bool = False,
            overwrite: bool = False, drop_extras: bool = False,
            max_shard_size: int | str | None = None, unsafe: bool = False,
            weights_key: str | None = None, component: str | None = None,
            keep_wrappers: bool = False, experts: str | None = None, ranks: int | None = None,
            progress: Callable[[int, int], None] | None = None,
            follow_links: bool = False,
            progress_bytes: Callable[[int, int], None] | None = None) -> ConvertReport:
    """Convert a checkpoint to another format, one tensor in memory at a time.

    Reads anything :func:`torchgraft.open` reads (DCP directories written by many ranks
    included) and writes torch (zip or ``legacy`` pre-1.6), safetensors, numpy or DCP,
    atomically. Plain extras (epoch, step, config) are kept; extras that hold tensors, such
    as optimizer state, are reported and not written.

    Args:
        src: The checkpoint.
        dst: The destination; its suffix gives the format unless ``format`` is set (no suffix:
            a DCP directory).
        format: ``"torch"``, ``"safetensors"``, ``"numpy"`` or ``"dcp"``. (Paddle needs
            the model: use ``tg.save(model, path, format="paddle")``.)
        rules: ``(regex, replacement)`` renames applied to the keys; ``None`` drops a key.
        dtype: Cast floating-point tensors; integer buffers are left alone.
        legacy: For torch: the pre-1.6 (non-zip) layout.
        overwrite: Replace an existing destination.
        drop_extras: Write the weights only.
        max_shard_size: Shard safetensors or torch output (``"2GB"``).
        unsafe: See :class:`~torchgraft.checkpoint.OpenOptions` (runs code from the file).
        weights_key: See :class:`~torchgraft.checkpoint.OpenOptions`.
        component: See :class:`~torchgraft.checkpoint.OpenOptions`.
        follow_links: See :class:`~torchgraft.checkpoint.OpenOptions`.
        keep_wrappers: Keep the prefixes that DataParallel, DDP or torch.compile added to every
            key (``module.``, ``_orig_mod.``; Lightning's ``model.`` inside a Lightning
            checkpoint); by default they are removed, before ``rules``, so the file loads into
            the bare model. A ``model.`` elsewhere is a real module and is kept.
        experts: Write stacked mixture-of-experts parameters per expert, as the Hub stores
            them: ``"per-expert"`` or ``"mixtral"`` (see :func:`torchgraft.save`).
        ranks: For DCP: write the directory as this many ranks of an FSDP2 model save it
            (each tensor's rows split as ``torch.chunk`` splits them, one file per rank), so
            each rank of a model sharded that way reads one file; 1 to
            :data:`~torchgraft.bounds.MAX_RANKS`.
        progress: Called with (tensors done, total).
        progress_bytes: Called with (bytes written, total) a few times a second while the
            files are written (the command line's progress bar).

    Returns:
        The report.

    Raises:
        TorchgraftError: If the source cannot be read or the destination not written.
    """
    destination = Path(dst)
    fmt = resolve_format(destination, format, legacy=legacy)
    parsed = parse_rules(rules)
    cast_to = parse_dtype(dtype) if dtype else None
    if ranks is not None and (fmt.writes != "dcp" or isinstance(ranks, bool)
                              or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS):
        raise TorchgraftError(f"ranks={shown(ranks, 40)} (CLI: --ranks): a DCP directory is "
                              f"written for 1 to {MAX_RANKS} ranks; {fmt.writes} files are not "
                              "split by rank", path=destination)
    with open_with(src, OpenOptions(unsafe, weights_key, component, follow_links)) as ckpt:
        report = ConvertReport(str(ckpt.path), ckpt.format, str(fmt.writes))
        tensors: dict[str, TensorRef] = {}
        refs = ckpt.tensor_refs()
        prefix, bare = (strip_wrappers(refs, saved=ckpt.saved_keys) if not keep_wrappers
                        else ("", {n: n for n in refs}))
        report.wrappers_removed = prefix
        for name, ref in refs.items():
            new, _rule = rename(bare[name], parsed)
            if new is None:
                report.dropped.append(name)
                continue
            if new != bare[name]:
                report.renamed[name] = new
            tensors[new] = ref
        if experts is not None:
            tensors = per_expert(tensors, experts)
        extras = {} if drop_extras else _extras(ckpt.raw_root, ckpt.weights_key,
                                                 {r.alias_key for r in refs.values()}, report)
        metadata = {}
        if ckpt.format == "safetensors" and isinstance(ckpt.raw_root, dict):
            metadata = dict(ckpt.raw_root.get("__metadata__") or {})
        job = WriteJob(tensors, cast_to, metadata=metadata if fmt.writes == "safetensors"
                       else {}, extras=extras, weights_key=ckpt.weights_key.split(".")[0],
                       legacy=legacy, ranks=ranks or 1, progress=progress)
        written = write_job(job, destination, format=fmt.writes, overwrite=overwrite,
                            max_shard_size=max_shard_size, progress_bytes=progress_bytes)
    report.written = [str(p) for p in written]
    report.tensors = len(tensors)
    for name, ref in tensors.items():
        out = job.out_dtype(ref)
        report.bytes += ref.meta.numel * out.itemsize
        if out != ref.meta.dtype:
            report.cast[name] = f"{dtype_name(ref.meta.dtype)}->{dtype_name(out)}"
    return report
