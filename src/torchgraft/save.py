"""``tg.save``: write weights in any format, atomically, sharded if asked."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from .atomic import HOST, atomic_dir, atomic_path, clean_stale, under_way, writer_gone
from .bounds import MAX_INDEX_BYTES
from .errors import CheckpointWriteError, TorchgraftError
from .graft.layout_of import LayoutOf, in_layout_of
from .graft.layouts.experts import per_expert
from .graft.layouts.rules import RulesSpec
from .graft.sides.source import open_source
from .io import Format, WriteJob, formats
from .io.contain import read_json
from .meta import parse_dtype
from .units import parse_size
from .written import ByteMeter

__all__ = ["clean_folder", "parse_size", "resolve_format", "save", "write_job"]

logger = logging.getLogger("torchgraft")

def _writers() -> dict[str, Format]:
    return {f.writes: f for f in formats() if f.writes is not None and f.write is not None}


def resolve_format(path: Path, format: str | None, *, legacy: bool = False) -> Format:
    """The format to write ``path`` in: named, or from the suffix (no suffix: a DCP directory).

    Args:
        path: The destination.
        format: ``"torch"``, ``"safetensors"``, ``"paddle"``, ``"numpy"``, ``"dcp"`` or ``None``.
        legacy: The pre-1.6 torch layout (torch format only).

    Returns:
        The format.

    Raises:
        TorchgraftError: If the format is unknown or cannot be guessed.
    """
    writers = _writers()
    if format is None:
        name = path.name.lower()
        matches = [(len(s), f) for f in writers.values() for s in f.suffixes if name.endswith(s)]
        if matches:
            fmt = max(matches, key=lambda m: m[0])[1]
        elif not path.suffix:
            fmt = writers["dcp"]
        else:
            raise TorchgraftError(f"cannot tell the format from '{path.suffix}'; pass format= "
                                  f"(CLI: --format) one of {', '.join(writers)}", path=path)
    elif format in writers:
        fmt = writers[format]
    else:
        raise TorchgraftError(f"format={format!r} (CLI: --format): use one of "
                              f"{', '.join(writers)}")
    if legacy and fmt.writes != "torch":
        raise TorchgraftError(f"legacy=True is for torch files, not {fmt.writes}", path=path)
    return fmt


def _shards(job: WriteJob, limit: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for name, ref in job.tensors.items():
        nbytes = ref.meta.numel * job.out_dtype(ref).itemsize
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _write_sharded(job: WriteJob, path: Path, fmt: Format, groups: list[list[str]], *,
                   overwrite: bool, meter: ByteMeter | None) -> list[Path]:
    """Write shards named as transformers names them, then the index, as one commit.

    The index is the commit point: it is replaced in one step, and only after every shard it
    names is whole on disk. Shards of an overwrite never replace the old ones in place (that
    would mix old and new tensors if the write were killed half-way): when the usual names
    are taken, the new shards get a unique tag in their names (loaders read names from the
    index). The old shards are removed once the new index is in place, and shards that a
    killed write left behind, named by no index, by the next write.

    Only files this write created are removed on failure, and only shards of this name
    (``<stem>-...-of-....<suffix>``) that the old index named once the new one is in place:
    an old index naming another file (``config.json``) never loses it. With
    ``overwrite=False`` the index commit is exclusive: of two writers, one wins and the other
    removes its shards and raises.
    """
    assert fmt.write is not None
    index = path.with_name(f"{path.name}.index.json")
    if index.exists() and not overwrite:
        raise TorchgraftError("already exists; pass overwrite=True (CLI: --overwrite) to "
                              "replace it", path=index)
    stem, suffix = path.name.split(".", 1)
    shard_name = _shard_pattern(stem, suffix)
    with _writers_of(path.parent) as alone:
        old = {name for name in _indexed_shards(index) if shard_name.fullmatch(name)}
        _remove_orphans(path.parent, stem, suffix, keep=old, alone=alone)
        return _write_shards(job, path, fmt, groups, index=index, old=old, overwrite=overwrite,
                             meter=meter)


@contextlib.contextmanager
def _writers_of(folder: Path) -> Iterator[bool]:
    """Count this process among the sharded writers of ``folder``; yield whether it is alone.

    Each writer holds a shared ``flock`` on the folder while it writes (the kernel drops it
    when a writer is killed); one that can take it exclusively first knows that no other
    writer is under way, so any shard no index names is a killed write's leftover.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise CheckpointWriteError(f"cannot write it: {exc.strerror or exc}",
                                   path=folder) from exc
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except OSError:
            alone = False
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield alone
    finally:
        os.close(handle)


def _write_shards(job: WriteJob, path: Path, fmt: Format, groups: list[list[str]], *,
                  index: Path, old: set[str], overwrite: bool,
                  meter: ByteMeter | None) -> list[Path]:
    assert fmt.write is not None
    stem, suffix = path.name.split(".", 1)
    total = len(groups)
    names = [f"{stem}-{n:05d}-of-{total:05d}.{suffix}" for n in range(1, total + 1)]
    if any((path.parent / name).exists() for name in names):
        tag = f"{HOST}{os.getpid():08x}{secrets.token_hex(2)}"  # host, process: _writer
        names = [f"{stem}-{tag}-{n:05d}-of-{total:05d}.{suffix}" for n in range(1, total + 1)]
    weight_map: dict[str, str] = {}
    written: list[Path] = []
    try:
        with under_way(lambda: _remove_unindexed(written, index)):
            _write_parts(job, path, fmt, zip(names, groups, strict=True), written, weight_map,
                         meter)
            total_size = sum(job.tensors[n].meta.numel * job.out_dtype(job.tensors[n]).itemsize
                             for n in weight_map)
            with atomic_path(index, overwrite=overwrite, unnamed=True, clean=False) as temporary:
                temporary.write_text(json.dumps({"metadata": {"total_size": total_size,
                                                              **job.metadata},
                                                 "weight_map": weight_map}, indent=2))
    except BaseException:
        for shard in written:
            shard.unlink(missing_ok=True)
        raise
    for stale in old - set(names):
        (path.parent / stale).unlink(missing_ok=True)
    return [*written, index]


def _write_parts(job: WriteJob, path: Path, fmt: Format, parts: Iterable[tuple[str, list[str]]],
                 written: list[Path], weight_map: dict[str, str],
                 meter: ByteMeter | None) -> None:
    """Write each shard (file name, tensor names) whole, in order, recording where each is."""
    assert fmt.write is not None
    for name, keys in parts:
        shard = path.with_name(name)
        part = WriteJob({n: job.tensors[n] for n in keys}, job.dtype,
                        legacy=job.legacy, progress=job.progress)
        with atomic_path(shard, unnamed=True, clean=False) as temporary, \
                _watched(meter, temporary):
            fmt.write(part, temporary)
        weight_map.update(dict.fromkeys(keys, shard.name))
        written.append(shard)


def _remove_unindexed(shards: list[Path], index: Path) -> None:
    """Remove the shards a sharded write has finished that its index does not name yet."""
    named = _indexed_shards(index)
    for shard in list(shards):
        if shard.name not in named:
            shard.unlink(missing_ok=True)


def _watched(meter: ByteMeter | None, path: Path) -> contextlib.AbstractContextManager[None]:
    return meter.watching(path) if meter is not None else contextlib.nullcontext()


#: A tagged shard's tag: its writer's host (8 hex digits), process (8) and 4 random; before
#: hosts were named, the process and 4 random; before that, 8 random.
_TAG = r"[0-9a-f]{20}|[0-9a-f]{12}|[0-9a-f]{8}"
#: Any tagged shard: ``<stem>-<tag>-00001-of-00002.<suffix>``.
_TAGGED = re.compile(rf"(?P<stem>.+?)-(?P<tag>{_TAG})-\d{{5}}-of-\d{{5}}\.(?P<suffix>.+)")


def _shard_pattern(stem: str, suffix: str) -> re.Pattern[str]:
    """Shard names of ``<stem>.<suffix>``; group ``tag``: a tagged write's tag."""
    return re.compile(rf"{re.escape(stem)}-(?:(?P<tag>{_TAG})-)?"
                      rf"\d{{5}}-of-\d{{5}}\.{re.escape(suffix)}")


def _writer(tag: str | None) -> tuple[str | None, int] | None:
    """The host and process a shard's tag names; ``None`` for a tag that names none."""
    if tag is not None and len(tag) == 20:
        return tag[:8], int(tag[8:16], 16)
    if tag is not None and len(tag) == 12:
        return None, int(tag[:8], 16)
    return None


def _indexed_shards(index: Path) -> set[str]:
    """The shard files an existing index names that lie in its folder (none if unreadable)."""
    if not index.is_file():
        return set()
    try:
        weight_map = read_json(index, limit=MAX_INDEX_BYTES, what="the index").get(
            "weight_map", {})
    except (TorchgraftError, AttributeError):
        return set()
    return {name for name in map(str, weight_map.values()) if Path(name).name == name}


def _remove_orphans(folder: Path, stem: str, suffix: str, *, keep: set[str],
                    alone: bool) -> None:
    """Remove what killed sharded writes left: shards no index names, and temporaries.

    When no other writer is under way (``alone``), every shard of this name that the index
    does not name is a leftover. Otherwise only tagged ones
    (``<stem>-<pid><rand>-00001-of-00002``) whose writer's process is gone. Files of other
    users are left alone.
    """
    pattern = _shard_pattern(stem, suffix)
    for file in folder.glob(f"{glob.escape(stem)}-*-of-*.{glob.escape(suffix)}"):
        match = pattern.fullmatch(file.name)
        if match is None or file.name in keep:
            continue
        try:
            status = file.lstat()
        except OSError:
            continue
        writer = _writer(match["tag"])
        if status.st_uid != os.getuid():
            continue
        if alone or (writer is not None and writer_gone(*writer)):
            file.unlink(missing_ok=True)
            logger.debug("removed %s, a shard no index names, left by a write that no longer "
                         "runs", file)


def clean_folder(folder: Path) -> list[Path]:
    """Remove what killed writes left in ``folder`` before a write into it.

    Temporaries (:func:`~torchgraft.atomic.clean_stale`), and tagged shards of any name whose
    writer ran on this host in a process that no longer runs, if their index
    (``<stem>.<suffix>.index.json``) does not name them: an overwrite of a sharded checkpoint
    killed after some of its shards. Files of other users, other hosts and writes still
    running are left alone; each removal is logged (debug).

    Args:
        folder: The folder a write is about to write into.

    Returns:
        What was removed.
    """
    removed = clean_stale(folder)
    named: dict[Path, set[str]] = {}
    try:
        shards = sorted(folder.glob("*-*-of-*.*"))
    except OSError:
        return removed
    for file in shards:
        match = _TAGGED.fullmatch(file.name)
        writer = _writer(match["tag"]) if match is not None else None
        if match is None or writer is None or not writer_gone(*writer):
            continue
        index = folder / f"{match['stem']}.{match['suffix']}.index.json"
        if index not in named:
            named[index] = _indexed_shards(index)
        try:
            mine = file.lstat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and file.name not in named[index]:
            file.unlink(missing_ok=True)
            logger.debug("removed %s, a shard no index names, left by a write that no longer "
                         "runs (process %d)", file, writer[1])
            removed.append(file)
    return removed


def write_job(job: WriteJob, path: str | os.PathLike[str], *, format: str | None,
              overwrite: bool, max_shard_size: int | str | None,
              progress_bytes: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write a job atomically: one file, a DCP directory, or shards plus an index.

    Args:
        job: What to write.
        path: The destination.
        format: The format's name, or ``None`` to use the suffix.
        overwrite: Replace existing files.
        max_shard_size: Split into shards of at most this size (safetensors and torch).
        progress_bytes: Called with (bytes written, total) a few times a second while the
            files are written.

    Returns:
        The files (or directory) written.

    Raises:
        TorchgraftError: If the destination exists, or the options do not fit the format.
    """
    destination = Path(path)
    fmt = resolve_format(destination, format, legacy=job.legacy)
    assert fmt.write is not None
    if job.metadata and fmt.writes not in ("safetensors",) and max_shard_size is None:
        raise TorchgraftError(f"metadata is stored by safetensors files and shard indexes, not "
                              f"{fmt.writes}", path=destination)
    meter = None if progress_bytes is None else ByteMeter(_job_bytes(job), progress_bytes)
    clean_folder(destination.parent)  # once, before the first file of this write
    if max_shard_size is not None:
        if fmt.writes not in ("safetensors", "torch"):
            raise TorchgraftError(f"max_shard_size= (CLI: --max-shard-size) is for safetensors "
                                  f"and torch, not {fmt.writes}", path=destination)
        groups = _shards(job, parse_size(max_shard_size))
        if len(groups) > 1:
            written = _write_sharded(job, destination, fmt, groups, overwrite=overwrite,
                                     meter=meter)
            if meter is not None:
                meter.finish()
            return written
    if fmt.writes == "dcp":
        with atomic_dir(destination, overwrite=overwrite, clean=False) as temporary, \
                _watched(meter, temporary):
            fmt.write(job, temporary)
    else:
        with atomic_path(destination, overwrite=overwrite, unnamed=True, clean=False) \
                as temporary, _watched(meter, temporary):
            fmt.write(job, temporary)
    if meter is not None:
        meter.finish()
    return [destination]


def _job_bytes(job: WriteJob) -> int:
    """The tensor bytes a job writes, each stored tensor once."""
    sizes = {ref.alias_key: ref.meta.numel * job.out_dtype(ref).itemsize
             for ref in job.tensors.values()}
    return sum(sizes.values())


def save(obj: nn.Module | Mapping[str, torch.Tensor], path: str | os.PathLike[str], *,
         format: str | None = None, legacy: bool = False,
         dtype: torch.dtype | str | None = None, overwrite: bool = False,
         metadata: Mapping[str, str] | None = None,
         max_shard_size: int | str | None = None, experts: str | None = None,
         progress: Callable[[int, int], None] | None = None,
         layout_of: LayoutOf | None = None, rules: RulesSpec = None,
         allow_incomplete: bool = False,
         progress_bytes: Callable[[int, int], None] | None = None) -> list[Path]:
    """Save a model's or a state dict's weights so that they load anywhere.

    Every write is atomic (a temporary file beside the destination, fsynced, renamed), so a
    failed or killed save never leaves a partial file, and an existing file is kept unless
    ``overwrite=True``.

    Args:
        obj: An ``nn.Module`` (DataParallel/DDP/compile wrappers are stripped, so names have no
            ``module.`` prefix) or a state dict. Tensors are written from the CPU.
        path: The destination; with ``max_shard_size``, shards go beside it with an
            ``<name>.index.json`` that transformers and torchgraft load.
        format: ``"torch"``, ``"safetensors"``, ``"paddle"``, ``"numpy"`` or ``"dcp"``;
            ``None`` takes it from the suffix (no suffix: a DCP directory).
        legacy: For torch: the pre-1.6 (non-zip) layout that PyTorch 1.0-1.5 can read.
        dtype: Cast floating-point tensors (``"fp16"``, ``torch.bfloat16``...); integer
            buffers are left alone.
        overwrite: Replace an existing destination.
        metadata: String metadata for safetensors (and shard indexes).
        max_shard_size: Shard the weights (``"2GB"``, ``"500MiB"`` or bytes).
        experts: Write stacked mixture-of-experts parameters (transformers 5's
            ``experts.gate_up_proj``) per expert, as the Hub stores them: ``"per-expert"``
            (``experts.3.gate_proj.weight``...) or ``"mixtral"`` (``block_sparse_moe.experts.3.
            w1.weight``...); by default they are written as the model holds them.
        progress: Called with (tensors written, total).
        layout_of: Write a model's weights in this checkpoint's names, layouts and dtypes
            (a path, a state dict, a module, or the report or plan of a graft from it): the
            graft from it into the model, run backwards (transposes, rotary rows, fused and
            split projections, rules' operations undone). Nothing of it is read but its
            metadata.
        rules: With ``layout_of``: the rules a graft from that checkpoint into the model
            needs.
        allow_incomplete: With ``layout_of``: write what fits when the model does not fit
            the layout (keys of the layout the model cannot produce, or the other way round)
            or a pairing is a guess, logging what is left out, instead of raising.
        progress_bytes: Called with (bytes written, total) a few times a second while the
            files are written (the command line's progress bar).

    Returns:
        The paths written.

    Raises:
        TorchgraftError: If the destination exists, or an option does not fit the format;
            with ``layout_of``, if the model does not fit the layout (another configuration),
            naming the keys.
    """
    if not isinstance(obj, (nn.Module, Mapping)):
        raise TorchgraftError(f"cannot save a {type(obj).__name__}: pass an nn.Module or a "
                              "state dict")
    if layout_of is not None:
        if not isinstance(obj, nn.Module) or experts is not None:
            raise TorchgraftError("layout_of= writes a model (an nn.Module) in a checkpoint's "
                                  "layout, experts as that checkpoint stores them: pass the "
                                  "model, without experts=")
        obj = in_layout_of(obj, layout_of, rules=rules, allow_incomplete=allow_incomplete)
    source = open_source(obj)
    kinds = {name: info.kind for name, info in source.side.tensors.items()} \
        if source.module is not None else {}
    refs = per_expert(source.refs, experts) if experts is not None else source.refs
    job = WriteJob(refs, parse_dtype(dtype) if dtype else None,
                   metadata={str(k): str(v) for k, v in (metadata or {}).items()},
                   kinds=kinds, legacy=legacy, progress=progress)
    return write_job(job, path, format=format, overwrite=overwrite,
                     max_shard_size=max_shard_size, progress_bytes=progress_bytes)
