"""Layouts of other frameworks that only the target can reveal.

Most frameworks' files say what they are, and their readers (``torchgraft.io``) re-lay them as
PyTorch's. MLX's ``save_weights`` writes plain safetensors or npz with no marker, and stores
a convolution's weight channels last: ``[out, kh, kw, in]`` (``[out, k, in]`` in 1-D), a
transposed convolution's too, where PyTorch has ``[in, out, kh, kw]``. The rule is keyed by
shapes, never by names: a stored weight whose permutation is the only reading that fits a
target convolution's weight (of either kind) shows the file channels last, one that fits only
as stored shows it PyTorch's. A file that shows channels last, and nothing against it, has
every convolution weight permuted, those that fit either way too (one file, one layout).

A file whose convolution weights all fit either way (``in == kh == kw``: an RGB stem's
``[out, 3, 3, 3]`` alone) cannot say which it is by shapes. The safetensors library (PyTorch's
writer, and every binding of it) stores its data sorted by dtype and name: a file stored so is
read as PyTorch's. One stored in another order is another writer's, MLX's hash order most
likely: its weights are read channels last, each a guess with the stored reading as the
alternative (:data:`MLX_CONV_UNKNOWN`); an npz, which any code writes in any order, is read as
stored, each a guess too (:data:`NPZ_CONV_UNKNOWN`). Never ok until outputs settle it. An MLX
file whose hash order happens to be sorted (a few tensors) is read as PyTorch's.
"""

from __future__ import annotations

from ..tensors import Side, TensorInfo, looks_sorted
from .layout import Layout

__all__ = ["FRAMEWORK_LAYOUTS", "MLX_CONV", "MLX_CONV_UNKNOWN", "NPZ_CONV_UNKNOWN"]

#: PyTorch's convolution weight from MLX's, by module kind and number of dimensions: a
#: convolution's ``[out, *k, in]`` to ``[out, in, *k]``, a transposed one's to ``[in, out, *k]``.
_MLX_TO_TORCH = {
    "conv": {3: (0, 2, 1), 4: (0, 3, 1, 2), 5: (0, 4, 1, 2, 3)},
    "conv_transpose": {3: (2, 0, 1), 4: (3, 0, 1, 2), 5: (4, 0, 1, 2, 3)},
}


def _permuted_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...] | None:
    dims = _MLX_TO_TORCH[kind].get(len(shape))
    return tuple(shape[d] for d in dims) if dims else None


def _readings(src: Side, dst: Side) -> tuple[int, int, int]:
    """How many stored weights fit a target convolution only permuted, only as stored, both.

    Both readings are counted only where they differ (a permutation that moves no size
    larger than 1 changes nothing).
    """
    if src.format not in ("safetensors", "numpy"):
        return 0, 0, 0
    convs = {kind: {info.shape for info in dst.tensors.values()
                    if info.kind == kind and info.name.endswith("weight")}
             for kind in _MLX_TO_TORCH}
    if not any(convs.values()):
        return 0, 0, 0
    stored_shapes = convs["conv"] | convs["conv_transpose"]
    counts = [0, 0, 0]
    for name, info in src.tensors.items():
        if not name.endswith("weight") or not 3 <= len(info.shape) <= 5:
            continue
        permuted = any(_permuted_shape(info.shape, kind) in shapes
                       for kind, shapes in convs.items())
        stored = info.shape in stored_shapes
        if permuted and stored:
            counts[2] += _moves(info.shape)
        elif permuted or stored:
            counts[0 if permuted else 1] += 1
    return counts[0], counts[1], counts[2]


def _moves(shape: tuple[int, ...]) -> bool:
    """Whether a weight that fits both ways moves when read channels last.

    Fitting both ways, its sizes past the first are equal (``[out, 3, 3, 3]``): it moves
    unless they are all 1.
    """
    return max(shape[1:], default=1) > 1


def _mlx_convs(src: Side, dst: Side) -> bool:
    """Some source weight fits a target convolution only in MLX's layout, none only as stored."""
    only_permuted, only_stored, _ = _readings(src, dst)
    return bool(only_permuted) and not only_stored


def _either_way_only(src: Side, dst: Side) -> bool:
    """Every source weight that fits a target convolution fits it either way."""
    only_permuted, only_stored, both = _readings(src, dst)
    return bool(both) and not only_permuted and not only_stored


def _unsorted_safetensors(src: Side, dst: Side) -> bool:
    """Weights that read both ways in a safetensors file its library did not write."""
    return src.format == "safetensors" and _either_way_only(src, dst) and \
        not looks_sorted(list(src.tensors), src.tensors)


def _npz(src: Side, dst: Side) -> bool:
    """Weights that read both ways in an npz, which any code writes in any order."""
    return src.format == "numpy" and _either_way_only(src, dst)


def _mlx_dims(src: TensorInfo, dst: TensorInfo) -> tuple[int, ...] | None:
    if dst.kind not in _MLX_TO_TORCH or len(src.shape) != len(dst.shape):
        return None
    dims = _MLX_TO_TORCH[dst.kind].get(len(src.shape))
    if dims is None or tuple(src.shape[d] for d in dims) != dst.shape:
        return None
    return dims


def _either_way(src: TensorInfo, dst: TensorInfo) -> tuple[tuple[str, ...], str] | None:
    """Both readings of a convolution weight that fits either way, and why neither is known."""
    dims = _mlx_dims(src, dst)
    if dims is None or src.shape != dst.shape or not _moves(src.shape):
        return None
    return (("as stored", f"axes permuted to {dims}"),
            "a convolution weight that reads the same size as stored and channels last "
            "(MLX's [out, kh, kw, in]), in a file with no other convolution to tell")


MLX_CONV = Layout(
    name="mlx-conv",
    applies=_mlx_convs,
    permuted=_mlx_dims,
    why="MLX stores convolution weights channels last, [out, kh, kw, in] (transposed ones too)",
)

MLX_CONV_UNKNOWN = Layout(
    name="mlx-conv?",
    applies=_unsorted_safetensors,
    permuted=_mlx_dims,
    doubt=_either_way,
    why="read as MLX's channels last, [out, kh, kw, in]: the file's data is in no order the "
        "safetensors library writes, MLX's writer stores it in a hash order",
)

NPZ_CONV_UNKNOWN = Layout(
    name="npz-conv?",
    applies=_npz,
    doubt=_either_way,
)

FRAMEWORK_LAYOUTS = (MLX_CONV, MLX_CONV_UNKNOWN, NPZ_CONV_UNKNOWN)
