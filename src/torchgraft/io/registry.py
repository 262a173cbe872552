"""The format registry: sniff magic bytes first, then suffixes; resolve directories."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..bounds import MAX_INDEX_BYTES
from ..errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TorchgraftError,
    UnknownFormatError,
    UnsupportedCheckpointError,
    brief,
    reading,
)
from ..text import few
from .base import Contents, Format, ReadOptions
from .contain import contained, read_json
from .hub import resolve as resolve_repo_id
from .nature import nature_of
from .source import released_on_failure

__all__ = ["checkpoint_in", "detect", "formats", "open_contents", "register"]

_FORMATS: list[Format] = []
_HEAD_BYTES = 512
#: A folder without a checkpoint names this many of its files.
_LISTED = 8

# A directory holding several checkpoint files opens the first of these that it has
# (the names transformers and timm write).
_PREFERRED_NAMES = (
    "model.safetensors.index.json", "model.safetensors",
    "pytorch_model.bin.index.json", "pytorch_model.bin",
    "open_clip_model.safetensors", "open_clip_pytorch_model.bin",
    "diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.bin.index.json", "diffusion_pytorch_model.bin",
)


def register(fmt: Format) -> None:
    """Add a format; formats registered earlier are sniffed first.

    Args:
        fmt: The format.
    """
    _FORMATS.append(fmt)


def formats() -> tuple[Format, ...]:
    """Return the registered formats, in sniffing order."""
    return tuple(_FORMATS)


def _by_suffix(path: Path) -> Format | None:
    name = path.name.lower()
    matches = [(len(s), f) for f in _FORMATS for s in f.suffixes if name.endswith(s)]
    return max(matches, key=lambda m: m[0])[1] if matches else None


def checkpoint_in(directory: Path, *, follow_links: bool = False) -> Path:
    """The checkpoint file a folder holds: a preferred name, else its only checkpoint file.

    Args:
        directory: The folder.
        follow_links: Accept a file that links out of the folder (see
            :func:`~torchgraft.io.contain.contained`).

    Returns:
        The file.

    Raises:
        CheckpointNotFoundError: If it holds none, or several and none is preferred.
        OutsideCheckpointError: If the file links out of the folder.
    """
    found = _checkpoint_file(directory, follow_links=follow_links)
    return contained(directory, found.name, named_by=directory, what="checkpoint file",
                     follow_links=follow_links)


def _checkpoint_file(directory: Path, *, follow_links: bool) -> Path:
    files = sorted(p for p in directory.iterdir() if p.is_file())
    candidates = [p for p in files if _by_suffix(p) is not None]
    indexes = [p for p in candidates if p.name.endswith(".index.json")]
    if indexes:
        covered = {directory / n for n in _shard_names(indexes, follow_links=follow_links)}
        candidates = [p for p in candidates if p not in covered]
    for name in _PREFERRED_NAMES:
        if directory / name in candidates:
            return directory / name
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        known = sorted({s for f in _FORMATS for s in f.suffixes})
        held = few(files, _LISTED, show=lambda path: path.name)
        raise CheckpointNotFoundError(
            f"the directory holds no checkpoint: {f'its files ({held})' if files else 'no file'}"
            f" are not checkpoints (none ends with {', '.join(known)}), and it is not a "
            "torch.distributed.checkpoint folder (no .metadata). Pass the checkpoint file, or "
            "the folder that holds it", path=directory)
    names = ", ".join(p.name for p in candidates)
    raise CheckpointNotFoundError(
        f"the directory holds several checkpoints ({names}); pass the one to open",
        path=directory)


def _shard_names(indexes: list[Path], *, follow_links: bool) -> set[str]:
    names: set[str] = set()
    for index in indexes:
        try:  # a plain, plausible index only: never a link to /dev/zero, a FIFO...
            weight_map = read_json(index, limit=MAX_INDEX_BYTES, what="the index",
                                   follow_links=follow_links)
            names.update(str(v) for v in weight_map.get("weight_map", {}).values())
        except (TorchgraftError, AttributeError):
            continue
    return names


def detect(path: Path, *, follow_links: bool = False) -> tuple[Format, Path]:
    """Find the format of ``path``, resolving a directory to the checkpoint inside it.

    Args:
        path: A checkpoint file or directory, or a Hugging Face Hub repository id
            (``org/name[@revision]``) already in the local cache.
        follow_links: Accept a directory's checkpoint file that links out of it.

    Returns:
        The format, and the path to open with it.

    Raises:
        CheckpointNotFoundError: If nothing is there (no file, no cached Hub repository), or a
            directory holds no checkpoint.
        CorruptCheckpointError: If the file is empty.
        UnknownFormatError: If no registered format recognises the file, or it is plainly
            something else (a Git LFS pointer, an HTML page, text), which the message says.
    """
    if not path.exists():
        # org/name[@revision] in the Hub cache, or raises
        path = resolve_repo_id(str(path), follow_links=follow_links)
    if path.is_dir():
        for fmt in _FORMATS:
            if fmt.claims_directory is not None and fmt.claims_directory(path):
                return fmt, path
        path = checkpoint_in(path, follow_links=follow_links)
    if not path.is_file():
        raise UnsupportedCheckpointError(
            "not a regular file or a folder (a FIFO, device or socket could block or never "
            "end): copy the checkpoint to a file", path=path)
    with reading(path), path.open("rb") as f:
        head = f.read(_HEAD_BYTES)
    if not head:
        raise CorruptCheckpointError(
            "the file is empty (0 bytes), not a checkpoint: a download, copy or save that was "
            "interrupted or never wrote; fetch or save it again", path=path)
    for fmt in _FORMATS:
        if fmt.magic is not None and fmt.magic(head):
            return fmt, path
    fmt_by_suffix = _by_suffix(path)
    # JSON indexes are text, and pickles of protocol 0 or 1 may be (they have no magic).
    textual = path.name.lower().endswith(".json") or (
        fmt_by_suffix is not None and fmt_by_suffix.name == "paddle")
    nature = None if textual else nature_of(head)
    if nature is not None:
        raise UnknownFormatError(nature, path=path)
    if fmt_by_suffix is not None:
        unrecognised = fmt_by_suffix.magic is not None and not textual
        return (_by_suffix_alone(fmt_by_suffix) if unrecognised else fmt_by_suffix), path
    known = ", ".join(f.name for f in _FORMATS)
    raise UnknownFormatError(
        f"not a checkpoint format torchgraft reads (neither its first bytes nor its suffix "
        f"match one); it reads {known}",
        path=path)


def _by_suffix_alone(fmt: Format) -> Format:
    """A format picked by a file's suffix alone, its first bytes being none it recognises.

    Such a file is not the format (random bytes, another kind of file), or one damaged at its
    very start: where it does not parse, the error says so, not "truncated or malformed"
    (which would send its user looking for the rest of a file that never was one).
    """
    def open_unrecognised(path: Path, options: ReadOptions) -> Contents:
        try:
            with reading(path):
                return fmt.open(path, options)
        except CorruptCheckpointError as exc:
            why = brief(exc.__cause__) if exc.__cause__ is not None else exc.message
            raise UnknownFormatError(
                f"not a checkpoint format torchgraft knows: its first bytes match none of the "
                f"formats it reads, and read as its suffix says ({fmt.name}) it does not parse "
                f"({why}). It is another kind of file, or a checkpoint damaged from its first "
                "byte: fetch or save it again", path=path) from exc

    return replace(fmt, open=open_unrecognised)


def open_contents(path: Path, options: ReadOptions) -> Contents:
    """Detect the format of ``path`` and open it.

    Args:
        path: A checkpoint file or directory.
        options: Options for the format.

    Returns:
        The opened contents.

    Raises:
        TorchgraftError: If the path cannot be opened; the message names it.
    """
    fmt, target = detect(path, follow_links=options.follow_links)
    if options.component is not None and fmt.name != "components":
        raise TorchgraftError(
            f"component='{options.component}' picks a part of a folder of several models (a "
            f"diffusers pipeline, a sentence-transformers model); this is a {fmt.name} "
            "checkpoint: leave component out", path=path)
    with reading(target), released_on_failure():
        return fmt.open(target, options)
