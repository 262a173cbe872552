"""MLX: mlx-lm model folders, whose group-wise quantized weights are dequantized on read.

mlx-lm saves safetensors (``format: mlx`` in their metadata) beside a ``config.json`` whose
``quantization`` gives ``group_size``, ``bits`` and ``mode`` (per module where they differ). A
quantized Linear or Embedding ``X`` is stored as ``X.weight`` (uint32 words of packed codes),
``X.scales`` (one per group of ``group_size`` inputs) and, in ``affine`` mode only,
``X.biases``; :mod:`.mlx_quant` has what each mode means. Read here, ``X.weight`` is the
float weight ``mx.dequantize`` gives and the scales and biases are gone, so the folder grafts
into the unquantized PyTorch model. What the config claims must fit what is stored (widths,
group counts, biases, the scales' dtype), else the folder is refused: a wrong claim never
gives wrong values. ``config.json`` is read with
:func:`~torchgraft.io.contain.read_contained`: inside the folder (a link out is refused unless
``follow_links``), a regular file, bounded in size and nesting. Names are transformers'
already; MLX's rotary layout is transformers' (``traditional=False``).

MLX's ``save_weights`` files are plain safetensors or npz with no marker; their convolutions
(``[out, kh, kw, in]``) are not re-laid here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeGuard

import torch

from ..bounds import parse_json
from ..errors import (
    CorruptCheckpointError,
    OutsideCheckpointError,
    TorchgraftError,
    UnsupportedCheckpointError,
)
from ..meta import TensorMeta, TensorRef
from .base import Contents, Format, ReadOptions
from .contain import contained, open_regular, read_contained
from .mlx_quant import AFFINE_BITS, MODES, dequantize
from .registry import checkpoint_in, open_contents
from .safetensors_format import FORMAT as SAFETENSORS

__all__ = ["FORMAT", "FOLDER_FORMAT"]

_CONFIG = "config.json"
_MAX_CONFIG = 16 << 20
_WORD_BITS = 32
#: The bytes of a safetensors file's start that hold mlx's ``"format":"mlx"`` marker.
_MAGIC_BYTES = 512


def _quantization(folder: Path, *, follow_links: bool) -> dict[str, Any] | None:
    """The ``quantization`` entry of an mlx-lm ``config.json``, or ``None``."""
    if not (folder / _CONFIG).exists():
        return None
    raw = read_contained(folder, _CONFIG, named_by=folder, what=_CONFIG, limit=_MAX_CONFIG,
                         follow_links=follow_links)
    value = parse_json(raw, what=_CONFIG, path=folder / _CONFIG)
    found = value.get("quantization") if isinstance(value, dict) else None
    if isinstance(found, dict) and _integer(found.get("bits")) and _integer(
            found.get("group_size")):
        return found
    return None


def _integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _parameters(quantization: dict[str, Any], module: str, path: Path) -> tuple[str, int, int]:
    """The (mode, bits, group_size) of one module: its own entry where mlx-lm wrote one."""
    own = quantization.get(module)
    chosen = own if isinstance(own, dict) else quantization
    mode, bits, group = chosen.get("mode", "affine"), chosen.get("bits"), chosen.get("group_size")
    if not isinstance(mode, str) or mode not in MODES or chosen.get("global_scale"):
        raise UnsupportedCheckpointError(
            f"'{module}' is quantized in MLX's {mode!r} mode"
            f"{' with a global scale' if chosen.get('global_scale') else ''}; torchgraft "
            f"dequantizes the modes {sorted(MODES)}", path=path)
    shapes = MODES[mode].shapes
    allowed = shapes if shapes is not None else [(b, group) for b in AFFINE_BITS]
    if not _integer(bits) or not _integer(group) or group <= 0 or (bits, group) not in allowed:
        raise CorruptCheckpointError(
            f"config.json's quantization for '{module}' says mode {mode!r}, bits {bits!r}, "
            f"group_size {group!r}; MLX's {mode} mode has (bits, group_size) in "
            f"{shapes or 'bits ' + str(AFFINE_BITS) + ' and groups of one input or more'}",
            path=path)
    return mode, bits, group


def _check(module: str, claim: tuple[str, int, int], parts: dict[str, TensorRef],
           path: Path) -> tuple[int, ...]:
    """The dequantized shape, once the stored tensors fit the config's claim."""
    mode, bits, group = claim
    packed, scales, biases = parts["weight"], parts["scales"], parts.get("biases")
    rows, words = packed.meta.shape[:-1], packed.meta.shape[-1]
    width = words * _WORD_BITS // bits
    floating = scales.meta.dtype.is_floating_point
    fits = (packed.meta.dtype == torch.uint32 and not words * _WORD_BITS % bits
            and not width % group
            and scales.meta.shape == (*rows, width // group)
            and (biases is not None) == MODES[mode].biases == floating
            and (biases is None or biases.meta.shape == scales.meta.shape)
            and (floating or scales.meta.dtype == torch.uint8))
    if not fits:
        found = ", ".join(f"{leaf} {ref.meta.shape} ({ref.meta.dtype})"
                          for leaf, ref in parts.items())
        raise CorruptCheckpointError(
            f"'{module}': {found} do not fit config.json's claim (mode {mode!r}, {bits}-bit "
            f"groups of {group}{', with biases' if MODES[mode].biases else ', no biases'})",
            path=path)
    return (*rows, width)


def _dequantized(module: str, claim: tuple[str, int, int], parts: dict[str, TensorRef],
                 path: Path) -> TensorRef:
    mode, bits, group = claim
    shape = _check(module, claim, parts, path)
    dtype = parts["scales"].meta.dtype if MODES[mode].biases else torch.bfloat16
    biases = parts.get("biases")

    def read() -> torch.Tensor:
        return dequantize(parts["weight"].read(), parts["scales"].read(),
                          biases.read() if biases is not None else None, bits=bits,
                          group_size=group, mode=mode)

    return TensorRef(TensorMeta.of(shape, dtype), read)


def _quantized_modules(root: dict[str, Any]) -> dict[str, dict[str, TensorRef]]:
    """Each module stored as ``weight`` + ``scales`` (+ ``biases``), with those tensors."""
    found = {}
    for name in root:
        module = name.removesuffix(".scales")
        if name.endswith(".scales") and isinstance(root.get(f"{module}.weight"), TensorRef):
            found[module] = {leaf: root[f"{module}.{leaf}"]
                             for leaf in ("weight", "scales", "biases", "global_scale")
                             if isinstance(root.get(f"{module}.{leaf}"), TensorRef)}
    return found


def _dequantize_root(root: dict[str, Any], quantization: dict[str, Any] | None,
                     path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Replace every quantized module's stored tensors by its float ``X.weight``.

    Returns:
        The new root, and how many weights each (mode, bits, group size) held.
    """
    modules = _quantized_modules(root)
    counts: dict[str, int] = {}
    if not modules:
        return root, counts
    if quantization is None:
        raise UnsupportedCheckpointError(
            f"'{next(iter(modules))}' is MLX-quantized (weight, scales) and the folder's "
            "config.json has no 'quantization' (mode, bits, group_size)", path=path)
    out = dict(root)
    for module, parts in modules.items():
        if "global_scale" in parts:
            raise UnsupportedCheckpointError(f"'{module}' has an nvfp4 global scale; "
                                             "torchgraft does not dequantize those", path=path)
        claim = _parameters(quantization, module, path)
        for leaf in parts:
            del out[f"{module}.{leaf}"]
        out[f"{module}.weight"] = _dequantized(module, claim, parts, path)
        kind = "{} {}-bit, groups of {}".format(*claim)
        counts[kind] = counts.get(kind, 0) + 1
    return out, counts


def _open_file(path: Path, options: ReadOptions) -> Contents:
    """One mlx-lm safetensors file, as stored (a shard: the folder dequantizes)."""
    contents = SAFETENSORS.open(path, options)
    if isinstance(contents.root, dict):
        metadata = contents.root.get("__metadata__")
        contents.root["__metadata__"] = {
            **(metadata if isinstance(metadata, dict) else {}), "framework": "mlx",
            "note": "quantized weights stay packed in one file: open the mlx-lm folder to "
                    "dequantize them"}
    return Contents("mlx", path, contents.root, contents.closers)


def _open_folder(path: Path, options: ReadOptions) -> Contents:
    quantization = _quantization(path, follow_links=options.follow_links)
    inner = open_contents(checkpoint_in(path, follow_links=options.follow_links),
                          options.part())
    root = inner.root
    if isinstance(root, dict):
        root, counts = _dequantize_root(root, quantization, path)
        root["__metadata__"] = {"framework": "mlx", "dequantized": counts,
                                "quantization": quantization or {}}
    return Contents("mlx", path, root, inner.closers)


def _claims(folder: Path) -> bool:
    """A folder of safetensors beside an mlx-lm ``config.json``.

    Nothing outside the folder is read here: a config linking out is claimed when the
    folder's safetensors say they are mlx's, and opening reads it (only with follow_links).
    """
    shards = sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())
    try:
        return _quantization(folder, follow_links=False) is not None and bool(shards)
    except OutsideCheckpointError:
        return bool(shards) and _marked(folder, shards[0])
    except TorchgraftError:
        return False


def _marked(folder: Path, name: str) -> bool:
    """Whether a safetensors file inside ``folder`` has mlx's ``format`` in its metadata."""
    try:
        path = contained(folder, name, named_by=folder, what="shard")
        with open(open_regular(path), "rb") as f:
            return _magic(f.read(_MAGIC_BYTES))
    except (OSError, TorchgraftError):
        return False


def _magic(head: bytes) -> bool:
    return SAFETENSORS.magic is not None and SAFETENSORS.magic(head) and (
        b'"format":"mlx"' in head)


FORMAT = Format(name="mlx", open=_open_file, magic=_magic)
FOLDER_FORMAT = Format(name="mlx", open=_open_folder, claims_directory=_claims)
