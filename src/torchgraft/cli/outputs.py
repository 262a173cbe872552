"""Which format an output path is written in, decided before torch is imported.

The table mirrors the writers that :mod:`torchgraft.io` registers (a test keeps them equal),
so that a destination no format writes is refused at once, with exit 2, before any work.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["WRITERS", "output_format"]

#: Format name (as ``--format`` takes it) to the suffixes that pick it.
WRITERS: dict[str, tuple[str, ...]] = {
    "safetensors": (".safetensors",),
    "torch": (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pth.tar"),
    "numpy": (".npz",),
    "paddle": (".pdparams", ".pdopt", ".pdema", ".pkl", ".pickle"),
    "dcp": (),
}


def _suffixes(names: list[str]) -> str:
    return ", ".join(s for name in names for s in WRITERS[name][:3])


def output_format(path: Path, fmt: str | None, *, option: str, choices: list[str]) -> str:
    """The format ``path`` is written in: ``fmt`` if given, else the one its suffix names.

    A path without a suffix is not taken for a DCP folder unless ``--format dcp`` says so: a
    forgotten suffix would otherwise write a folder of ``.distcp`` files without a word.

    Args:
        path: The destination.
        fmt: The ``--format`` given, if any.
        option: How the destination is named on the command line (``DST``, ``--out``).
        choices: The formats this command writes.

    Returns:
        The format's name.

    Raises:
        click.BadParameter: If no format this command writes fits (exit 2).
    """
    if fmt is not None:
        return fmt
    name = path.name.lower()
    matches = [(len(s), writer) for writer, suffixes in WRITERS.items() for s in suffixes
               if name.endswith(s)]
    if matches:
        found = max(matches)[1]
        if found in choices:
            return found
        raise click.BadParameter(
            f"'{path.name}' names a {found} file, which this command cannot write "
            "(Paddle stores Linear weights transposed, so writing it needs the model: "
            "torchgraft graft SRC --model MODULE:FACTORY --out NAME.pdparams)",
            param_hint=option)
    writable = [c for c in choices if WRITERS[c]]
    if not path.suffix:
        raise click.BadParameter(
            f"'{path.name}' has no suffix, so it names no format: end it with "
            f"{_suffixes(writable)}..., or pass --format ({'|'.join(choices)}); a DCP folder "
            "is written with --format dcp", param_hint=option)
    raise click.BadParameter(
        f"no format is written as '{path.suffix}': end it with {_suffixes(writable)}..., "
        f"or pass --format ({'|'.join(choices)})", param_hint=option)
