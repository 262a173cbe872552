"""Library messages in the command line's words: flags for Python arguments, formats by name.

The library's errors and advice name Python arguments (``pass overwrite=True``,
``label_map=...``), sometimes with the flag beside them (``format= (CLI: --format)``). On the
command line they name the flag alone (``pass --overwrite``, ``--label-map ...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["FLAGS", "READ_FORMATS", "cli_words", "format_names"]

#: Python argument to the flag that sets it.
FLAGS = {
    "overwrite": "--overwrite", "format": "--format", "unsafe": "--unsafe",
    "follow_links": "--follow-links", "weights_key": "--weights-key",
    "component": "--component", "label_map": "--label-map",
    "allow_incomplete": "--allow-incomplete", "verify": "--verify",
    "example_inputs": "--inputs", "source_model": "--source-model", "init": "--init",
    "match": "--match", "strict": "--strict", "rules": "--rules", "dtype": "--dtype",
    "legacy": "--legacy", "max_shard_size": "--max-shard-size", "ranks": "--ranks",
    "experts": "--experts", "keep_wrappers": "--keep-wrappers",
    "drop_extras": "--drop-extras", "layout_of": "--layout-of", "new": "--new",
}

#: ``name=value``, the name after a space or a parenthesis: never inside a path or a quoted key.
_ARGUMENT = (rf"(?:(?<=[\s(])|^)({'|'.join(sorted(FLAGS, key=len, reverse=True))})="
             r"(True\b|'[^']*'|\"[^\"]*\"|\.\.\.|[\w.-]*)")
#: An argument, then the flag text the library gives: ``(CLI: text)`` or ``, CLI text,``.
_WITH_FLAG = re.compile(_ARGUMENT + r" ?(?:\(CLI: ([^)]*)\)|, CLI (--[\w-]+),)")
#: An argument alone: ``True`` is the flag alone, a value follows it, ``...`` stays.
_ALONE = re.compile(_ARGUMENT)


def _flag(match: re.Match[str]) -> str:
    flag, value = FLAGS[match[1]], match[2]
    if value in ("True", ""):
        return flag
    return f"{flag} {value.strip(chr(39) + chr(34))}"


def _given(match: re.Match[str]) -> str:
    """The library's own flag text, unless it is the argument's flag (then with its value)."""
    text = match[3] or match[4]
    return _flag(match) if text == FLAGS[match[1]] else text


def cli_words(text: str) -> str:
    """A library message with Python arguments written as the flags that set them.

    Args:
        text: An error message or a line of advice.

    Returns:
        The text, ``pass overwrite=True (CLI: --overwrite)`` read as ``pass --overwrite``,
        ``label_map=...`` as ``--label-map ...``.
    """
    text = _WITH_FLAG.sub(_given, text)
    return _ALONE.sub(_flag, text)


#: Reader names (``Format.name``) to the names users know the formats by.
READ_FORMATS = {
    "torch-zip": "torch.save", "torch-legacy": "torch.save", "torch-export": "torch.export",
    "safetensors": "safetensors", "sharded": "sharded (*.index.json)", "dcp": "DCP",
    "deepspeed": "DeepSpeed", "components": "diffusers and sentence-transformers folders",
    "paddle": "PaddlePaddle", "numpy": "NumPy (.npy, .npz)", "gguf": "GGUF", "onnx": "ONNX",
    "keras": "Keras (.keras, .h5)", "flax": "Flax (.msgpack)", "orbax": "Orbax",
    "mlx": "MLX",
}


def format_names(readers: Iterable[str]) -> str:
    """The formats the readers read, by their users' names, each once, in reading order."""
    return ", ".join(dict.fromkeys(READ_FORMATS.get(name, name) for name in readers))
